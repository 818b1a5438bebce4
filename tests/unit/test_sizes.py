"""The house rule that keeps each room small enough to change: no module of the package, the
workers, the benchmarks or the examples over 400 lines, no function over 60 (ARCHITECTURE.md).
Migrations are history, not rooms, and are left out."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULE_MAX, FUNCTION_MAX = 400, 60


def _sources() -> list[Path]:
    return sorted(
        p
        for d in ("orchestrator", "workers", "bench", "examples")
        for p in (ROOT / d).rglob("*.py")
        if "migrations" not in p.parts
    )


def test_no_module_is_over_400_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in _sources() if (n := len(p.read_text().splitlines())) > MODULE_MAX}
    assert long == {}, f"split these modules by concern (at most {MODULE_MAX} lines): {long}"


def test_no_function_is_over_60_lines() -> None:
    long: dict[str, int] = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if (n := (node.end_lineno or node.lineno) - node.lineno + 1) > FUNCTION_MAX:
                    long[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = n
    assert long == {}, f"split these functions (at most {FUNCTION_MAX} lines): {long}"
