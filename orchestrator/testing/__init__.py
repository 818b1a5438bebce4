"""Test doubles for your own agents' tests, never loaded by `import orchestrator`.

- `inmemory`: `in_memory()` and `InMemoryDispatcher`, which run a run's steps inline in the
  calling process on a real store: unit tests of agents with no broker and no worker;
- `script`: the pure logic of a scripted model (what to answer, which faults to raise), reading
  requests as a `conversation`;
- `model`: `ScriptedModel`, that script in-process, with no HTTP;
- `server`: `ScriptedServer`, that script as an OpenAI-compatible HTTP server, whose bodies
  `replies` builds from the openai package's own types;
- `holding`: the server's calls held in flight until a test releases them (`server.holding`);
- `waiting`: `wait_until`, a deadline instead of a sleep.

    from orchestrator.testing import in_memory

The dispatcher is imported on first use, so the scripted server's process does not load the
step engine.
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
