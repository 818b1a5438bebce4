"""The store owns every transaction and every statement (ARCHITECTURE.md, `store/`): outside
`orchestrator/store/`, no module of the package or of the workers holds a connection or builds
SQL. It calls the store's named operations instead (`Store.teams.start_members`, `record_fenced`,
`database.probe`...).

Read from the source with `ast`, every import counted (a function's, a TYPE_CHECKING block's):
no use of a store's engines (`.engine`, `.quick_engine`, `.lazy_engine`), no `.begin()` or
`.connect()` on a store or an engine, no connection passed (`conn=`) or taken (a `conn`
parameter), no SQLAlchemy outside its exceptions (`sqlalchemy.exc`: a caller may catch what the
store raised), and no table of `orchestrator.store.tables`."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENGINES = {"engine", "quick_engine", "lazy_engine"}
#: Sites that may break the rule, each as (path, line): none.
EXEMPT: set[tuple[str, int]] = set()


def modules() -> list[Path]:
    """Every module of the package outside the store, and of the workers."""
    store = ROOT / "orchestrator" / "store"
    found = [p for d in ("orchestrator", "workers") for p in (ROOT / d).rglob("*.py")]
    return sorted(p for p in found if store not in p.parents)


def _receiver(node: ast.expr) -> str | None:
    """The last name of what a method is called on: `self.store.engine` -> "engine"."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def _imports(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
        return [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    return []


def breaches(tree: ast.AST) -> list[tuple[int, str]]:
    """Where a module's source reaches past the store's operations, and how."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ENGINES:
            found.append((node.lineno, f"uses .{node.attr}"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            on = _receiver(node.func.value)
            if node.func.attr in ("begin", "connect") and (on == "store" or on in ENGINES):
                found.append((node.lineno, f"calls {on}.{node.func.attr}()"))
        if isinstance(node, ast.Call):
            found += [(k.value.lineno, "passes conn=") for k in node.keywords if k.arg == "conn"]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            found += [(a.lineno, f"{node.name} takes a connection") for a in arguments if a.arg == "conn"]
        for name in _imports(node):
            sql = name == "sqlalchemy" or name.startswith("sqlalchemy.")
            if (sql and not name.startswith("sqlalchemy.exc")) or name.startswith("orchestrator.store.tables"):
                found.append((node.lineno, f"imports {name}"))
    return found


def test_no_module_outside_the_store_holds_a_connection_or_builds_sql() -> None:
    found = {}
    for path in modules():
        where = str(path.relative_to(ROOT))
        for line, what in breaches(ast.parse(path.read_text(), filename=where)):
            if (where, line) not in EXEMPT:
                found[f"{where}:{line}"] = what
    assert found == {}, f"call a named operation of the store instead: {found}"


def test_the_check_sees_each_way_past_the_store() -> None:
    source = """
import sqlalchemy
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from orchestrator.store.tables import runs

def f(store, conn):
    with store.engine.begin() as c:
        store.commit_step(claim, [], conn=c)
    store.quick_engine
    store.begin()
    live.begin()
    def g():
        from orchestrator.store import tables
"""
    found = sorted(breaches(ast.parse(source)))
    assert found == [
        (2, "imports sqlalchemy"),
        (3, "imports sqlalchemy"),
        (3, "imports sqlalchemy.select"),
        (5, "imports orchestrator.store.tables"),
        (5, "imports orchestrator.store.tables.runs"),
        (7, "f takes a connection"),
        (8, "calls engine.begin()"),
        (8, "uses .engine"),
        (9, "passes conn="),
        (10, "uses .quick_engine"),
        (11, "calls store.begin()"),
        (14, "imports orchestrator.store.tables"),
    ]
