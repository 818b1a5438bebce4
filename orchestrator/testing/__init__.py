"""Test doubles for users' own tests: a scripted, OpenAI-compatible model (pure logic in
`script`, HTTP in `server`) and an in-memory dispatcher that runs steps inline (`inmemory`).

    from orchestrator.testing import in_memory

The dispatcher is imported on first use: `orchestrator.models` imports `script` from here, and
the dispatcher imports the engine, which imports the models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.testing.inmemory import InMemoryDispatcher, in_memory

__all__ = ["InMemoryDispatcher", "in_memory"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from orchestrator.testing import inmemory

        return getattr(inmemory, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
