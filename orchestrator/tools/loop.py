"""The event loop async tools run on: one per worker process, kept for the process's life.

A tool may hold what belongs to a loop (an `httpx.AsyncClient`, a database pool) across calls,
which a new loop per call would break: the second call would find its connections bound to a
closed loop. So async tools run on one long-lived loop in a helper thread, reached through anyio's
blocking portal. It is one per process, not one per worker thread: an agent's tools (a toolkit and
the client it holds) are shared by every worker thread of a threads pool, and a client bound to one
thread's loop fails on another's ("bound to a different event loop"). A prefork pool process has
one worker thread, so there the two are the same. The calls of a step's batch, each waiting in its
own pool thread, run concurrently on the loop; an async tool that blocks (`time.sleep`) stalls the
others. Each call runs in a copy of its caller's context variables (its trace span's parent).

The caller waits for the call. When the wait is interrupted (the step's soft time limit, raised in
the waiting thread), the call is cancelled, so it does not finish, as a synchronous tool
interrupted by the limit does not; a call the loop had not started yet (it was busy) never starts.
SystemExit, KeyboardInterrupt and any other BaseException a tool raises are carried back to the
caller instead of stopping the loop, so the step treats them as it treats a synchronous tool's.

The portal is served by a daemon thread of our own (`anyio.run` around a `BlockingPortal`), not by
`anyio.from_thread.start_blocking_portal`: that is a context manager whose exit stops the loop and
joins its thread. A loop kept for the process's life has no such exit to run, and one left to
interpreter teardown would wait for a thread that can no longer run, and the process would not end.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
from collections.abc import Awaitable
from concurrent.futures import Future
from typing import Any

import anyio
from anyio.from_thread import BlockingPortal


class ToolLoop:
    """An event loop in a daemon thread; `run()` runs an awaitable on it and waits."""

    def __init__(self) -> None:
        ready: Future[BlockingPortal] = Future()
        self._thread = threading.Thread(target=_serve, args=(ready,), name="ratchet-tool-loop", daemon=True)
        self._thread.start()
        #: anyio's portal into the loop (`portal.call(f)` runs `f` on it).
        self.portal = ready.result()

    def run(self, awaitable: Awaitable[Any]) -> Any:
        """Run the awaitable on this loop and return its result (or raise its exception)."""
        call = _Call(awaitable)
        future: Future[Any] | None = None
        try:
            future = self.portal.start_task_soon(call.run)  # waits for the loop to take it
            outcome = future.result()
        except BaseException as exc:
            # Raised in the caller's thread as it waited (its soft time limit, SoftTimeLimitExceeded,
            # an Exception), not by the tool: the caller is giving up, and the call must not finish.
            if future is None or not (future.done() and not future.cancelled() and future.exception() is exc):
                call.abandon()
            raise
        if isinstance(outcome, _Escaped):
            raise outcome.exc
        return outcome


def _serve(ready: Future[BlockingPortal]) -> None:
    """The loop's thread: a blocking portal served until the process ends."""

    async def serve() -> None:
        async with BlockingPortal() as portal:
            ready.set_result(portal)
            await portal.sleep_until_stopped()

    try:
        anyio.run(serve)
    except BaseException as exc:  # the loop could not start: the caller waiting on `ready` says so
        if not ready.done():
            ready.set_exception(exc)
        raise


class _Call:
    """One awaitable run on the loop, which its caller may abandon before it starts or while it runs."""

    def __init__(self, awaitable: Awaitable[Any]) -> None:
        self._awaitable = awaitable
        self._lock = threading.Lock()
        self._abandoned = False
        self._scope: anyio.CancelScope | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def run(self) -> Any:
        with anyio.CancelScope() as scope:
            with self._lock:
                if self._abandoned:  # its caller gave up while the loop was busy: never start it
                    if inspect.iscoroutine(self._awaitable):
                        self._awaitable.close()
                    return None
                self._scope, self._loop = scope, asyncio.get_running_loop()
            try:
                return await self._awaitable
            except BaseException as exc:
                if isinstance(exc, (Exception, anyio.get_cancelled_exc_class())):
                    raise
                return _Escaped(exc)  # SystemExit and the like would stop the loop, not end the call
        return None  # cancelled by `abandon`: no one is waiting for it

    def abandon(self) -> None:
        """Cancel the call (from the caller's thread): if it has not started, it never will."""
        with self._lock:
            self._abandoned = True
            scope, loop = self._scope, self._loop
        if scope is not None and loop is not None:
            loop.call_soon_threadsafe(scope.cancel)  # a cancel scope is cancelled in its loop's thread


class _Escaped:
    """A BaseException a tool raised, carried past the loop as a value."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_lock = threading.Lock()
_process_loop: ToolLoop | None = None


def process_loop() -> ToolLoop:
    """This process's tool loop, started on the first async tool call."""
    global _process_loop
    with _lock:
        if _process_loop is None:
            _process_loop = ToolLoop()
        return _process_loop


def _forget_after_fork() -> None:
    # The parent's loop thread did not survive the fork: the child starts its own on its first
    # call. The parent's portal is dropped, never used (it would wait for a thread that is gone).
    global _process_loop, _lock
    _process_loop, _lock = None, threading.Lock()  # the lock may have been held at the fork


os.register_at_fork(after_in_child=_forget_after_fork)
