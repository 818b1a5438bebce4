"""Waiting on a condition with a deadline: what a test (or a benchmark) does instead of sleeping.

run = wait_until(lambda: client.get_run(run_id).status.is_final, timeout=30, what="the run to stop")
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    check: Callable[[], T | None],
    timeout: float = 20.0,
    *,
    what: str = "condition",
    interval: float = 0.02,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call `check` until it returns something truthy and return that; raise TimeoutError after
    `timeout` seconds. Exceptions of the `ignore` types count as "not yet" (a server starting)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except ignore:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
