"""Every Ratchet error lives in `orchestrator/errors.py`, drawn in its docstring's tree as it is
defined, with a docstring of its own; the ones a user can meet are exported by the package."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import orchestrator
from orchestrator import errors
from orchestrator.errors import RatchetError

ROOT = Path(__file__).resolve().parents[2]
#: A line of the drawn tree: its rails, then a class name, then (optionally) what it means.
TREE_LINE = re.compile(r"^(?P<rails>    (?:[│ ]   )*(?:[├└]── )?)(?P<name>[A-Z]\w*)(?:\s{2,}\S.*)?$")


def _import_every_module() -> None:
    """Import the whole of `orchestrator` and `workers`, so that every subclass is defined."""
    for package in ("orchestrator", "workers"):
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"))


def _defined() -> dict[str, type[RatchetError]]:
    """RatchetError and every subclass of it that Ratchet's own code defines, by name."""
    _import_every_module()
    found: dict[str, type[RatchetError]] = {}
    todo: list[type[RatchetError]] = [RatchetError]
    while todo:
        cls = todo.pop()
        if cls.__module__.split(".")[0] in {"orchestrator", "workers"}:
            found[f"{cls.__module__}.{cls.__qualname__}"] = cls
        todo.extend(cls.__subclasses__())
    return found


def _drawn() -> dict[str, str | None]:
    """The tree in the docstring of `orchestrator.errors`: each class's name and its parent's."""
    parents: dict[str, str | None] = {}
    path: list[str] = []
    for line in (errors.__doc__ or "").splitlines():
        match = TREE_LINE.match(line)
        if match is None:
            continue
        depth = (len(match["rails"]) - 4) // 4
        del path[depth:]
        parents[match["name"]] = path[-1] if path else None
        path.append(match["name"])
    return parents


def test_every_ratchet_error_is_defined_in_the_errors_module() -> None:
    outside = sorted(name for name, cls in _defined().items() if cls.__module__ != "orchestrator.errors")
    assert outside == [], "define these in orchestrator/errors.py and draw them in its tree"


def test_the_docstring_tree_draws_every_error_under_its_own_base_and_nothing_else() -> None:
    defined = {cls.__name__: cls for cls in _defined().values()}
    drawn = _drawn()
    assert sorted(drawn) == sorted(defined), "the tree in orchestrator/errors.py is not the hierarchy"
    for name, parent in drawn.items():
        base = defined[name].__bases__[0].__name__ if name != "RatchetError" else None
        assert parent == base, f"{name} is drawn under {parent} but derives from {base}"


def test_the_tree_lists_the_errors_in_the_order_the_module_defines_them() -> None:
    in_module = [name for name, value in vars(errors).items() if isinstance(value, type)]
    assert list(_drawn()) == in_module


def test_every_error_has_a_docstring_of_its_own() -> None:
    assert [c.__name__ for c in _defined().values() if not (c.__dict__.get("__doc__") or "").strip()] == []


def test_the_package_exports_every_error_but_the_one_that_never_leaves_a_worker() -> None:
    # FencedError ends a step whose lease was taken over; the step tasks catch it.
    public = set(_drawn()) - {"FencedError"}
    assert public <= set(orchestrator.__all__)
    assert all(getattr(orchestrator, name) is getattr(errors, name) for name in public)
