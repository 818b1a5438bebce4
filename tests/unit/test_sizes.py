"""The house rule that keeps each room small enough to change, as a budget: a module of the
package, the workers, the benchmarks or the examples past 400 lines is listed at the end of every
test run (it asks whether it holds two concepts), one past 600 fails; no function over 60 lines
(ARCHITECTURE.md). Migrations are history, not rooms, and are left out."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Past MODULE_REPORT a module is listed (`pytest_terminal_summary` in tests/conftest.py); past
#: MODULE_MAX it fails.
MODULE_REPORT, MODULE_MAX, FUNCTION_MAX = 400, 600, 60


def sources() -> list[Path]:
    """The modules the budget covers."""
    return sorted(
        p
        for d in ("orchestrator", "workers", "bench", "examples")
        for p in (ROOT / d).rglob("*.py")
        if "migrations" not in p.parts
    )


def over(limit: int) -> dict[str, int]:
    """The modules longer than `limit` lines, with their lengths."""
    return {str(p.relative_to(ROOT)): n for p in sources() if (n := len(p.read_text().splitlines())) > limit}


def test_no_module_is_over_600_lines() -> None:
    long = over(MODULE_MAX)
    assert long == {}, f"split these modules by concept (at most {MODULE_MAX} lines): {long}"


def test_no_function_is_over_60_lines() -> None:
    long: dict[str, int] = {}
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if (n := (node.end_lineno or node.lineno) - node.lineno + 1) > FUNCTION_MAX:
                    long[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = n
    assert long == {}, f"split these functions (at most {FUNCTION_MAX} lines): {long}"
