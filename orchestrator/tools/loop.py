"""The event loop async tools run on: one per worker thread, kept for the thread's life.

A tool may hold what belongs to a loop (an `httpx.AsyncClient`, a database pool) across calls,
which a new loop per call would break: the second call would find its connections bound to a
closed loop. So each worker thread owns one loop, running in a helper thread of its own; the
calls of a step's batch, which run in the step's pool threads, use the loop of the worker thread
that runs the step (`ToolStep` passes it), and so run concurrently on it.

The caller waits on the call's future. When the wait is interrupted (the step's soft time limit,
raised in the waiting thread), the call is cancelled, so it does not finish, as a synchronous
tool interrupted by the limit does not. SystemExit and KeyboardInterrupt raised by a tool are
carried back to the caller instead of stopping the loop, so the step treats them as it treats a
synchronous tool's.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Awaitable
from typing import Any

_local = threading.local()
#: Loops a forked child inherited from its parent: their threads did not survive the fork, so they
#: are kept here, never used and never closed (closing would see them as running).
_inherited: list[threading.local] = []


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

    def close(self) -> None:
        """Stop the loop and close it (its thread ends)."""
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __del__(self) -> None:
        # The worker thread that owned this loop has ended: its thread-local holder is released.
        # At interpreter exit the loop's daemon thread may already be frozen: nothing to join.
        if not sys.is_finalizing():
            self.close()


class _Escaped:
    """A SystemExit or KeyboardInterrupt a tool raised, carried past the loop as a value."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


async def _carried(awaitable: Awaitable[Any]) -> Any:
    try:
        return await awaitable
    except (SystemExit, KeyboardInterrupt) as exc:  # would stop the loop's thread, not end the call
        return _Escaped(exc)


def thread_loop() -> ToolLoop:
    """The calling thread's tool loop, started on its first async tool call."""
    loop: ToolLoop | None = getattr(_local, "loop", None)
    if loop is None:
        loop = _local.loop = ToolLoop()
    return loop


def _forget_after_fork() -> None:
    global _local
    _inherited.append(_local)
    _local = threading.local()


os.register_at_fork(after_in_child=_forget_after_fork)
