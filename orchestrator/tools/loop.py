"""The event loop async tools run on: one per worker process, kept for the process's life.

A tool may hold what belongs to a loop (an `httpx.AsyncClient`, a database pool) across calls,
which a new loop per call would break: the second call would find its connections bound to a
closed loop. So async tools run on one long-lived loop in a helper thread. It is one per process,
not one per worker thread: an agent's tools (a toolkit and the client it holds) are shared by
every worker thread of a threads pool, and a client bound to one thread's loop fails on another's
("bound to a different event loop"). A prefork pool process has one worker thread, so there the
two are the same. The calls of a step's batch, each waiting in its own pool thread, run
concurrently on the loop; an async tool that blocks (`time.sleep`) stalls the others.

The caller waits on the call's future. When the wait is interrupted (the step's soft time limit,
raised in the waiting thread), the call is cancelled, so it does not finish, as a synchronous
tool interrupted by the limit does not. SystemExit and KeyboardInterrupt raised by a tool are
carried back to the caller instead of stopping the loop, so the step treats them as it treats a
synchronous tool's.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable
from typing import Any


class ToolLoop:
    """An event loop running in a daemon thread; `run()` runs a coroutine on it and waits."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="ratchet-tool-loop", daemon=True)
        self._thread.start()

    def run(self, awaitable: Awaitable[Any]) -> Any:
        """Run the awaitable on this loop and return its result (or raise its exception)."""
        future = asyncio.run_coroutine_threadsafe(_carried(awaitable), self._loop)
        try:
            outcome = future.result()
        except BaseException:
            future.cancel()  # the caller is giving up (its time limit): the call must not finish
            raise
        if isinstance(outcome, _Escaped):
            raise outcome.exc
        return outcome


class _Escaped:
    """A SystemExit or KeyboardInterrupt a tool raised, carried past the loop as a value."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


async def _carried(awaitable: Awaitable[Any]) -> Any:
    try:
        return await awaitable
    except (SystemExit, KeyboardInterrupt) as exc:  # would stop the loop's thread, not end the call
        return _Escaped(exc)


_lock = threading.Lock()
_process_loop: ToolLoop | None = None
#: A loop a forked child inherited from its parent: its thread did not survive the fork, so it
#: is kept here, never used and never closed (closing would see it as running).
_inherited: list[ToolLoop] = []


def process_loop() -> ToolLoop:
    """This process's tool loop, started on the first async tool call."""
    global _process_loop
    with _lock:
        if _process_loop is None:
            _process_loop = ToolLoop()
        return _process_loop


def _forget_after_fork() -> None:
    global _process_loop, _lock
    if _process_loop is not None:
        _inherited.append(_process_loop)
    _process_loop, _lock = None, threading.Lock()  # the lock may have been held at the fork


os.register_at_fork(after_in_child=_forget_after_fork)
