"""The house drawn from its imports: the rules of ARCHITECTURE.md ("Which way imports point"), one
test each, checked on what runs.

Every import counts wherever it is written: at the top of a module, inside a function (it runs when
the function does), under `if TYPE_CHECKING:` (the annotation names a room all the same), and as a
string that names a module (`importlib.import_module("x")`, a `"module:attr"` setting). A rule that
looked only at top-level statements would let a function-level import tie the rooms into one cycle
at run time and still pass.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("orchestrator", "workers")
#: A string that names a module of ours or of Celery: `a.b`, `a.b:attr`, `a:attr`. A bare word
#: ("celery", "workers") is a logger or a key more often than a module, and is not counted.
MODULE_STRING = re.compile(r"^(orchestrator|workers|celery|kombu|billiard)((\.\w+)+(:[\w.]+)?|:[\w.]+)$")


@dataclass(frozen=True)
class Module:
    """One module of ours: its file, its dotted name and everything it imports or names."""

    path: Path
    name: str
    tree: ast.Module

    @property
    def file(self) -> str:
        return self.path.relative_to(ROOT).as_posix()

    @property
    def room(self) -> str:
        """`orchestrator.store.reads` -> `store`, `orchestrator.client` -> `client`,
        `workers.api.routes` -> `api`, `workers.health` -> `health`."""
        parts = self.name.split(".")
        return parts[1] if len(parts) > 1 else parts[0]


def _dotted(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


@cache
def modules() -> tuple[Module, ...]:
    """Every module of `orchestrator/` and `workers/` but the migrations (history, not rooms)."""
    paths = sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if "migrations" not in p.parts)
    return tuple(Module(p, _dotted(p), ast.parse(p.read_text(), filename=str(p))) for p in paths)


@cache
def known_modules() -> frozenset[str]:
    return frozenset(m.name for m in modules())


def _resolve(module: Module, node: ast.ImportFrom) -> str:
    """The absolute module an `ImportFrom` reads from (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    package = module.name.split(".")
    base = package[: len(package) - node.level + (1 if module.path.name == "__init__.py" else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(module: Module) -> Iterator[tuple[str, ast.AST]]:
    """The modules `module` imports or names, each with the node that does: every `import`, every
    `from x import y` (as `x.y` when `y` is a module, else `x`), and every string naming a module."""
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node)
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                yield (sub if sub in known_modules() else source), node
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_STRING.match(node.value):
            yield node.value.split(":")[0], node


def _room_of(name: str) -> str | None:
    """The room of a module of `orchestrator/` (None for anything else)."""
    parts = name.split(".")
    return parts[1] if parts[0] == "orchestrator" and len(parts) > 1 else None


def offenders(
    allowed: dict[str, set[str]] | None = None, *, forbidden: dict[str, set[str]] | None = None
) -> set[tuple[str, str]]:
    """(file, imported module) for each import of an orchestrator room that a rule does not allow:
    `allowed[room]` lists every room a room may import (its own always), `forbidden[room]` the
    rooms it may not."""
    found: set[tuple[str, str]] = set()
    for module in modules():
        if not module.name.startswith("orchestrator."):
            continue
        for name, _ in imports(module):
            target = _room_of(name)
            if target is None or target == module.room:
                continue
            if allowed is not None and module.room in allowed and target not in allowed[module.room]:
                found.add((module.file, name))
            if forbidden is not None and target in forbidden.get(module.room, set()):
                found.add((module.file, name))
    return found


def assert_none(found: set[tuple[str, str]], rule: str) -> None:
    """No violation of `rule`, each as (module, what it imports or asks)."""
    assert sorted(found) == [], f"{rule}: {sorted(found)}"


# The rooms, as ARCHITECTURE.md draws them.
VALUES = {
    "budgets",
    "errors",
    "status",
    "messages",
    "run",
    "usage",
    "state",
    "settings",
    "untrusted",
    "validation",
    "requirements",
}
DEFINITIONS = {"agent", "team", "tools", "models", "retry", "structured"}
VIEWS = {"events", "timeline"}
#: Above the client: the producer methods of agents and teams (`Agent.run`, `Team.start`, ...).
PRODUCER = {"producer"}
#: What each room may import; a room not listed is checked by `FORBIDDEN` only.
ALLOWED: dict[str, set[str]] = {
    **{room: VALUES for room in VALUES},
    "models": VALUES,
    "tools": VALUES | {"models"},
    **{room: VALUES | DEFINITIONS for room in DEFINITIONS - {"models", "tools"}},
    "store": VALUES,
    **{room: VALUES | VIEWS | {"store"} for room in VIEWS},
    "ports": VALUES | {"events", "models"},
}
#: What each of the other domain rooms may not import: nothing below the producer facade calls it
#: back, and nothing calls up into the step engine, the sweeper or the run control.
TOP = {"client", "runtime", "testing"} | PRODUCER
FORBIDDEN: dict[str, set[str]] = {
    "routing": {"steps", "delegation", "control", "sweeper", "heartbeat", "catalog"} | TOP,
    **{room: {"store", "steps", "delegation", "control", "sweeper", "routing"} | TOP for room in ("limits",)},
    "delegation": {"steps", "control", "sweeper"} | TOP,
    # The steps run on the runtime they are given (`StepRunner(runtime)`); the runtime imports no step.
    "steps": {"control", "sweeper", "client", "testing"} | PRODUCER,
    "heartbeat": {"steps", "control", "sweeper", "delegation"} | TOP,
    "sweeper": {"control"} | TOP,
    # A pause's deadline policy, below the sweeper that runs it: it writes through the store only.
    "deadlines": {"steps", "control", "sweeper", "heartbeat"} | TOP,
    "control": {"steps", "sweeper"} | TOP,
    # A start's write, shared by run control and the schedules below the sweeper.
    "starting": {"steps", "control", "sweeper", "heartbeat", "schedules"} | TOP,
    # Schedules' ticks, fired by the sweeper: they write through the store and `starting` only.
    "schedules": {"steps", "control", "sweeper", "heartbeat"} | TOP,
    "cron": {"store", "steps", "control", "sweeper", "routing", "schedules"} | TOP,
    "idempotency": {"steps", "sweeper", "control"} | TOP,
    "catalog": {"steps", "sweeper", "control"} | TOP,
    # A deploy's rules, on definitions and records: the steps and run control apply them.
    "deploys": {"store", "steps", "control", "sweeper", "routing"} | TOP,
    "reader": {"steps", "sweeper", "control"} | TOP,
    "tracing": {"store", "steps", "delegation", "control", "sweeper", "agent", "team", "tools"} | TOP,
    "client": PRODUCER | {"testing"},
    "runtime": {"client", "testing", "steps", "control", "sweeper", "delegation"} | PRODUCER,
}


def test_values_import_only_values() -> None:
    assert_none(offenders({room: ALLOWED[room] for room in VALUES}), "a value imports a room above it")


def test_definitions_import_no_producer_no_store_no_step() -> None:
    rules = {room: ALLOWED[room] for room in DEFINITIONS}
    assert_none(offenders(rules), "a definition imports a room above the definitions")


def test_the_store_imports_only_values() -> None:
    assert_none(offenders({"store": ALLOWED["store"]}), "the store imports a room that is not a value")


def test_event_and_timeline_views_import_only_values_and_the_store() -> None:
    assert_none(offenders({room: ALLOWED[room] for room in VIEWS}), "a view imports a room above the store")


def test_ports_hold_protocols_and_values_only() -> None:
    assert_none(offenders({"ports": ALLOWED["ports"]}), "ports.py imports an implementation")


def test_no_domain_room_calls_up_into_a_room_above_it() -> None:
    assert_none(offenders(forbidden=FORBIDDEN), "a domain room imports one above it")


def test_nothing_in_orchestrator_names_celery_kombu_or_workers_not_even_as_a_string() -> None:
    found = {
        (m.file, name)
        for m in modules()
        if m.name.startswith("orchestrator")
        for name, _ in imports(m)
        if name.split(".")[0] in {"celery", "kombu", "billiard", "workers"}
    }
    assert_none(found, "orchestrator/ names Celery or workers/")


def test_the_test_doubles_are_imported_only_by_the_command_lines_demo() -> None:
    # `ratchet demo` and `ratchet scripted-model` run the scripted model server: they are the
    # only production code that uses a test double, and only when they are run.
    allowed = {"workers/cli/demo.py", "workers/cli/commands.py"}
    found = {
        (m.file, name)
        for m in modules()
        if not m.name.startswith("orchestrator.testing") and m.file not in allowed
        for name, _ in imports(m)
        if name.startswith("orchestrator.testing")
    }
    assert_none(found, "a module outside orchestrator/testing imports a test double")


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _bound_modules(module: Module) -> dict[str, str]:
    """The local names `module` binds to modules of ours: `import a.b` binds `a` (to `a`),
    `import a.b as c` binds `c`, `from a import b` binds `b` when `a.b` is a module."""
    bound: dict[str, str] = {}
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    bound[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node)
            for alias in node.names:
                if f"{source}.{alias.name}" in known_modules():
                    bound[alias.asname or alias.name] = f"{source}.{alias.name}"
    return bound


def _chain(node: ast.expr) -> list[str] | None:
    """`a.b.c` as `["a", "b", "c"]`; None for anything but names and attributes."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute) and (head := _chain(node.value)) is not None:
        return [*head, node.attr]
    return None


def private_uses(module: Module) -> Iterator[str]:
    """The `_private` names `module` takes from another module of ours: `from x import _y`,
    `x._y` on an imported module, and a `_private` module imported from outside its package."""
    ours, bound = known_modules(), _bound_modules(module)
    for node in ast.walk(module.tree):
        if isinstance(node, ast.ImportFrom):
            source = _resolve(module, node)
            if source.split(".")[0] not in PACKAGES or source == "__future__":
                continue
            yield from (
                f"{source}.{a.name}" for a in node.names if _is_private(a.name) and f"{source}.{a.name}" not in ours
            )
        elif isinstance(node, ast.Attribute) and _is_private(node.attr):
            chain = _chain(node.value)
            if chain is None or (target := bound.get(chain[0])) is None:
                continue
            named = ".".join([target, *chain[1:]])
            if named in ours and named != module.name:
                yield f"{named}.{node.attr}"
    for name, _ in imports(module):
        parts = name.split(".")
        if parts[0] not in PACKAGES:
            continue
        for i, part in enumerate(parts):
            package = ".".join(parts[:i])
            if _is_private(part) and not (module.name + ".").startswith(package + "."):
                yield name


def test_no_module_takes_a_private_name_from_another_module() -> None:
    # The sign of a file split along a line count. The rule is for orchestrator/ and workers/;
    # tests may look inside a module to check it (a test of `_parse` reads `_parse`).
    found = {(m.file, name) for m in modules() for name in private_uses(m)}
    assert_none(
        found, "a module imports a _private name from another module (fold them back into one, or make the name public)"
    )


def test_the_private_name_check_sees_from_imports_attributes_and_private_modules() -> None:
    code = (
        "import orchestrator.store.writes as w\n"
        "from orchestrator.store import reads\n"
        "from orchestrator.client import _hidden, visible\n"
        "from orchestrator.models._keys import redact\n"
        "w._move(); reads._row(); reads.__name__\n"
    )
    module = Module(ROOT / "workers" / "probe.py", "workers.probe", ast.parse(code))
    assert sorted(private_uses(module)) == [
        "orchestrator.client._hidden",
        "orchestrator.models._keys",
        "orchestrator.store.reads._row",
        "orchestrator.store.writes._move",
    ]


def test_every_kind_of_import_is_counted() -> None:
    code = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from orchestrator.client import Client\n"
        "def f():\n    from orchestrator import control\n"
        "    importlib.import_module('workers.celery.tasks')\n"
        "ADAPTER = 'workers.redis.limiter:RedisLimiter'\n"
        "LOGGER = 'celery'\n"
    )
    module = Module(ROOT / "orchestrator" / "probe.py", "orchestrator.probe", ast.parse(code))
    assert sorted(n for n, _ in imports(module) if n != "typing") == [
        "orchestrator.client",
        "orchestrator.control",
        "workers.celery.tasks",
        "workers.redis.limiter",
    ]


def test_no_two_modules_share_a_file_name() -> None:
    # `events.py` twice is two things a reader must tell apart by their folder.
    seen: dict[str, list[str]] = {}
    for module in modules():
        if module.path.name not in {"__init__.py", "__main__.py"}:
            seen.setdefault(module.path.name, []).append(module.file)
    assert {name: files for name, files in seen.items() if len(files) > 1} == {}


ROOM_FILE = re.compile(r"`([\w/]+(?:\.py|/))`")


def rooms_named() -> set[str]:
    """The files and folders the rooms table of ARCHITECTURE.md names, as paths from the root: a
    row's own, and in a row that is one folder (`store/`, `workers/api/`) the files it owns there."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    table = text.split("## The rooms", 1)[1].split("\n## ", 1)[0]
    named: set[str] = set()
    for line in table.splitlines():
        if not line.startswith("| `"):
            continue
        room, owns = line.split("|")[1:3]
        rooms = [n if n.startswith("workers/") else f"orchestrator/{n}" for n in ROOM_FILE.findall(room)]
        named.update(rooms)
        if len(rooms) == 1 and rooms[0].endswith("/"):
            named.update(n if n.startswith(PACKAGES) else rooms[0] + n for n in ROOM_FILE.findall(owns))
    return {n.rstrip("/") for n in named}


def test_the_rooms_table_names_only_files_that_exist() -> None:
    missing = {("ARCHITECTURE.md", name) for name in rooms_named() if not (ROOT / name).exists()}
    assert_none(missing, "ARCHITECTURE.md names a file that does not exist")


#: A module file named in backticks, alone or with the folders above it (`tables.py`, `store/leases.py`).
NAMED_FILE = re.compile(r"`([\w/]+\.py)`")


def files_the_table_names() -> set[str]:
    """The module files the rooms table of ARCHITECTURE.md names, as it writes them."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    return set(NAMED_FILE.findall(text.split("## The rooms", 1)[1].split("\n## ", 1)[0]))


def unnamed(files: list[str], named: set[str]) -> list[str]:
    """The files (paths from the root) that no name of `named` is: neither its path nor a tail
    of it (`leases.py`, `store/leases.py`)."""
    return [f for f in files if not any(f == n or f.endswith("/" + n) for n in named)]


def test_the_rooms_table_names_every_module() -> None:
    # A new module gets its line in the table, so the table stays the whole house. Package
    # markers and the migrations' versions (history, not rooms) are left out.
    files = sorted(
        p.relative_to(ROOT).as_posix()
        for pkg in PACKAGES
        for p in (ROOT / pkg).rglob("*.py")
        if p.name not in {"__init__.py", "__main__.py"} and "versions" not in p.parts
    )
    missing = unnamed(files, files_the_table_names())
    assert missing == [], f"name these modules in ARCHITECTURE.md's rooms table: {missing}"


def test_a_module_is_named_by_its_file_name_or_its_path() -> None:
    named = {"leases.py", "store/reads.py", "workers/api/agents.py"}
    files = [
        "orchestrator/store/leases.py",
        "orchestrator/store/reads.py",
        "workers/api/agents.py",
        "workers/x/reads.py",
    ]
    assert unnamed(files, named) == ["workers/x/reads.py"]


#: Where asking which database this is belongs: the backends, `database.py` (it opens an engine
#: for a URL before any backend exists) and `Store`, which picks its backend.
BACKENDS = {f"orchestrator/store/{name}.py" for name in ("backend", "sqlite", "postgres", "database", "store")}
DIALECTS = {"sqlite", "postgresql", "postgres"}


def _asks_the_dialect(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in DIALECTS
    if isinstance(node, ast.Attribute):  # `conn.dialect.name`
        return node.attr == "name" and isinstance(node.value, ast.Attribute) and node.value.attr == "dialect"
    # `url.get_backend_name()`
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get_backend_name"


def dialect_questions(module: Module) -> Iterator[str]:
    """Each comparison in `module` that asks which database it is on, as written."""
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Compare) and any(_asks_the_dialect(n) for n in [node.left, *node.comparators]):
            yield ast.unparse(node)


def test_no_dialect_if_outside_the_backends() -> None:
    found = {(m.file, q) for m in modules() if m.file not in BACKENDS for q in dialect_questions(m)}
    assert_none(found, "a module asks which database it is on: make it a method of store/backend.py")


def test_the_dialect_check_sees_each_way_of_asking() -> None:
    code = "a = conn.dialect.name == 'postgresql'\nb = url.get_backend_name() != x\nc = 'sqlite' in names\nd = 1 == 2\n"
    module = Module(ROOT / "orchestrator" / "probe.py", "orchestrator.probe", ast.parse(code))
    assert len(list(dialect_questions(module))) == 3


def test_importing_the_whole_domain_loads_no_celery() -> None:
    names = sorted(m.name for m in modules() if m.name.startswith("orchestrator"))
    code = (
        "import importlib, sys\n"
        f"for m in {names!r}: importlib.import_module(m)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('celery', 'kombu', 'workers'))\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_importing_the_package_loads_a_public_name_only_when_it_is_asked_for() -> None:
    # Every `ratchet` command and worker imports `orchestrator.errors` or `.settings` first: the
    # package's own __init__ must not import the client, the store and SQLAlchemy with them.
    code = (
        "import sys, orchestrator, orchestrator.errors\n"
        "early = sorted(m for m in sys.modules if m in ('sqlalchemy', 'orchestrator.client', 'orchestrator.store'))\n"
        "from orchestrator import *\n"
        "missing = [n for n in orchestrator.__all__ if n not in globals() or n not in dir(orchestrator)]\n"
        "print(early, missing); sys.exit(1 if early or missing else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_importing_ratchet_loads_no_test_double_and_no_optional_sdk() -> None:
    # The scripted model is a test double (orchestrator.testing): a producer or a worker that
    # imports Ratchet and its model adapters must neither load it nor find it among them. Nor
    # does naming Claude import the anthropic SDK (an extra): a call does.
    code = (
        "import sys, orchestrator, orchestrator.models, workers.celery.tasks, workers.cli.commands\n"
        "from orchestrator.models import Claude\n"
        "doubles = sorted(m for m in sys.modules if m.startswith('orchestrator.testing'))\n"
        "doubles += [n for n, m in list(sys.modules.items()) if hasattr(m, 'ScriptedModel')]\n"
        "doubles += [m for m in sys.modules if m.split('.')[0] == 'anthropic']\n"
        "print(doubles); sys.exit(1 if doubles else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_test_architecture_md_names_is_one_of_these() -> None:
    # ARCHITECTURE.md names the test that keeps each rule: a renamed or dropped test shows here.
    named = set(re.findall(r"`(test_\w+)`", (ROOT / "ARCHITECTURE.md").read_text()))
    assert named and sorted(name for name in named if not callable(globals().get(name))) == []
