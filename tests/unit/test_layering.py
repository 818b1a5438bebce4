"""The domain never imports Celery: `orchestrator/` talks to the broker through a port."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ORCHESTRATOR = Path(__file__).resolve().parents[2] / "orchestrator"


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_no_module_in_orchestrator_imports_celery_kombu_or_workers() -> None:
    offenders = {
        str(path.relative_to(ORCHESTRATOR.parent)): sorted(
            n for n in _imported_modules(path) if n.split(".")[0] in {"celery", "kombu", "billiard", "workers"}
        )
        for path in ORCHESTRATOR.rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_importing_the_whole_domain_loads_no_celery() -> None:
    modules = sorted(
        ".".join(p.relative_to(ORCHESTRATOR.parent).with_suffix("").parts).removesuffix(".__init__")
        for p in ORCHESTRATOR.rglob("*.py")
        if "migrations" not in p.parts
    )
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('celery', 'kombu', 'workers'))\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_importing_ratchet_loads_no_test_double() -> None:
    # The scripted model is a test double (orchestrator.testing): a producer or a worker that
    # imports Ratchet and its model adapters must neither load it nor find it among them.
    code = (
        "import sys, orchestrator, orchestrator.models, workers.celery.tasks\n"
        "doubles = sorted(m for m in sys.modules if m.startswith('orchestrator.testing'))\n"
        "doubles += [n for n, m in list(sys.modules.items()) if hasattr(m, 'ScriptedModel')]\n"
        "print(doubles); sys.exit(1 if doubles else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


#: Which rooms each room may not import (ARCHITECTURE.md, "Which way imports point"). Imports
#: under `if TYPE_CHECKING:` and inside functions are not counted: `Agent.run`, Agno's
#: convenience, builds a `Client` when called, and only then.
FORBIDDEN = {
    "store": {"agent", "team", "tools", "models", "steps", "delegation", "control", "client", "sweeper"}
    | {"heartbeat", "routing"},
    "models": {"store", "steps", "delegation", "control", "client", "sweeper", "agent", "team"},
    "delegation": {"steps", "control", "client", "sweeper"},
    "steps": {"control", "client", "sweeper"},
    "sweeper": {"control", "client"},
    "control": {"client", "steps", "sweeper"},
    "routing": {"steps", "delegation", "control", "client", "sweeper"},
    "limits": {"store", "steps", "delegation", "control", "client", "sweeper"},
    # Called by the store's callers, the steps and the run control: it imports none of them.
    "tracing": {"store", "models", "steps", "delegation", "control", "client", "sweeper", "agent", "team", "tools"},
}
PRODUCTION = {"testing"}  # nothing outside `orchestrator.testing` imports the test doubles


def _room(path: Path) -> str:
    parts = path.relative_to(ORCHESTRATOR).with_suffix("").parts
    return parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")


def _top_level_imports(path: Path) -> set[str]:
    """Modules imported when the module is imported: its top-level statements, not
    `if TYPE_CHECKING:` blocks or function bodies."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            if node.module == "orchestrator":  # `from orchestrator import delegation`
                names.update(f"orchestrator.{alias.name}" for alias in node.names)
    return names


def test_imports_point_the_way_the_architecture_says() -> None:
    wrong: dict[str, list[str]] = {}
    for path in ORCHESTRATOR.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        room = _room(path)
        banned = FORBIDDEN.get(room, set()) | (PRODUCTION if room != "testing" else set())
        rooms = {m.split(".")[1] for m in _top_level_imports(path) if m.startswith("orchestrator.")}
        if hits := sorted(rooms & banned):
            wrong[str(path.relative_to(ORCHESTRATOR.parent))] = hits
    assert wrong == {}
