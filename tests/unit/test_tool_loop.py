"""Async tools run on one long-lived loop per process (`orchestrator.tools.loop`): shared by every
thread, in the caller's context, cancelled when the caller gives up (Celery's soft time limit
raised in the waiting thread), never stopped by what a tool raises, and started afresh in a
forked child."""

from __future__ import annotations

import asyncio
import contextvars
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import anyio
import pytest

from orchestrator.tools import Tool, ToolContext
from orchestrator.tools.loop import process_loop

CTX = ToolContext(run_id="r", tool_call_id="c")
REQUEST = contextvars.ContextVar[str]("REQUEST", default="none")


class TimeUp(Exception):
    """Stands for Celery's SoftTimeLimitExceeded, which a signal raises in the waiting thread."""


def time_up(signum: int, frame: FrameType | None) -> None:
    raise TimeUp


def interrupt(ident: int, when: threading.Event | None = None) -> threading.Thread:
    """SIGUSR1 to thread `ident` (as Celery's pool does at the soft limit) once `when` is set, or,
    without it, once the thread waits on a future (its call is waiting for the loop)."""

    def waiting() -> bool:
        frame = sys._current_frames().get(ident)
        while frame is not None:
            if frame.f_code.co_name == "result" and Path(frame.f_code.co_filename).parent.name == "futures":
                return True
            frame = frame.f_back
        return False

    def watch() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if when.wait(timeout=0.01) if when is not None else waiting():
                signal.pthread_kill(ident, signal.SIGUSR1)
                return
            time.sleep(0.001)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    return watcher


def test_async_calls_from_every_thread_share_one_loop_that_outlives_each_call() -> None:
    loops: list[asyncio.AbstractEventLoop] = []

    async def where() -> str:
        loops.append(asyncio.get_running_loop())
        return "here"

    t = Tool(where)
    assert t.call({}, CTX) == "here"
    assert t.call({}, CTX) == "here"
    # A worker thread of a threads pool shares the agent's tools, and so what they hold, with the others.
    thread = threading.Thread(target=t.call, args=({}, CTX))
    thread.start()
    thread.join()
    assert len(loops) == 3 and len(set(map(id, loops))) == 1 and not loops[0].is_closed()
    assert process_loop().portal.call(asyncio.get_running_loop) is loops[0]


def test_an_async_tool_sees_its_callers_context_variables_and_its_changes_stay_its_own() -> None:
    # Given two threads that each set a context variable (as a step's trace span is) and call
    async def read_then_set() -> str:
        seen = REQUEST.get()
        REQUEST.set("changed by the tool")
        return seen

    seen: dict[str, str] = {}

    def caller(name: str) -> None:
        REQUEST.set(name)
        seen[name] = Tool(read_then_set).call({}, CTX)
        seen[f"{name} after"] = REQUEST.get()

    threads = [threading.Thread(target=caller, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Then each call saw its own caller's value, and what the tool set did not leak back
    assert seen == {"a": "a", "a after": "a", "b": "b", "b after": "b"}


class Halt(BaseException):
    """A BaseException that is neither SystemExit nor KeyboardInterrupt."""


@pytest.mark.parametrize("raised", [SystemExit(2), KeyboardInterrupt(), Halt()], ids=lambda e: type(e).__name__)
def test_a_base_exception_inside_an_async_tool_reaches_the_caller_and_the_loop_keeps_running(
    raised: BaseException,
) -> None:
    async def raises() -> None:
        raise raised

    async def fine() -> str:
        return "still here"

    with pytest.raises(type(raised)):
        Tool(raises).call({}, CTX)
    assert Tool(fine).call({}, CTX) == "still here"


def test_an_async_tool_that_raises_is_not_cancelled_after_the_fact(monkeypatch: pytest.MonkeyPatch) -> None:
    async def fails() -> None:
        raise ValueError("bad input")

    # Given the callbacks handed to the tools' loop from other threads (each call's start among them)
    loop: asyncio.AbstractEventLoop = process_loop().portal.call(asyncio.get_running_loop)
    handed: list[object] = []
    original = loop.call_soon_threadsafe

    def recording(callback: Callable[..., object], *args: object, **kwargs: Any) -> asyncio.Handle:
        handed.append(callback)
        return original(callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_soon_threadsafe", recording)
    # When a tool raises an exception of its own
    with pytest.raises(ValueError, match="bad input"):
        Tool(fails).call({}, CTX)
    # Then its call ended with it: no cancellation was sent after it (only a caller giving up sends one)
    assert handed, "the call was not started through call_soon_threadsafe"
    assert not [cb for cb in handed if isinstance(getattr(cb, "__self__", None), anyio.CancelScope)]


def test_an_async_call_interrupted_in_its_waiting_thread_is_cancelled_and_does_not_finish() -> None:
    events: list[str] = []
    running, cancelled = threading.Event(), threading.Event()

    async def slow() -> str:
        running.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        events.append("finished")
        return "late"

    previous = signal.signal(signal.SIGUSR1, time_up)
    try:
        watcher = interrupt(threading.get_ident(), when=running)
        with pytest.raises(TimeUp):
            Tool(slow).call({}, CTX)
    finally:
        watcher.join(timeout=10)
        signal.signal(signal.SIGUSR1, previous)
    assert cancelled.wait(timeout=5), "the interrupted call was not cancelled"
    assert events == []


def test_an_async_call_given_up_while_the_loop_is_busy_never_starts() -> None:
    # Given the loop held by an async tool that blocks it (as a `time.sleep` in one does)
    holding, release = threading.Event(), threading.Event()
    started: list[str] = []

    async def hog() -> str:
        holding.set()
        release.wait(timeout=10)
        return "done"

    async def late() -> str:
        started.append("late")
        return "late"

    async def fine() -> str:
        return "fine"

    hogger = threading.Thread(target=Tool(hog).call, args=({}, CTX))
    hogger.start()
    assert holding.wait(timeout=5)
    # When the soft limit strikes a step whose call is still waiting for the loop
    previous = signal.signal(signal.SIGUSR1, time_up)
    try:
        watcher = interrupt(threading.get_ident())
        with pytest.raises(TimeUp):
            Tool(late).call({}, CTX)
    finally:
        watcher.join(timeout=10)
        signal.signal(signal.SIGUSR1, previous)
        release.set()
        hogger.join(timeout=10)
    # Then, the loop free again, the call given up never starts (a call queued after it has run)
    assert Tool(fine).call({}, CTX) == "fine"
    assert started == []


def test_a_forked_child_starts_its_own_loop_instead_of_the_parents() -> None:
    async def pid() -> int:
        return os.getpid()

    assert Tool(pid).call({}, CTX) == os.getpid()  # the parent's loop exists before the fork
    read, write = os.pipe()
    with warnings.catch_warnings():  # Python 3.12+ warns of forking a process with threads: that is the point
        warnings.simplefilter("ignore", DeprecationWarning)
        child = os.fork()
    if child == 0:  # the child answers through the pipe and exits without pytest's teardown
        try:
            os.write(write, str(Tool(pid).call({}, CTX)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        assert answer.read() == str(child)
    os.waitpid(child, 0)
