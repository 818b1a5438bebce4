"""Background work a process forks around: `unforked()` is held by a thread of the process while
it works on the database (a sweep pass, a catalog write), and taken by every fork of the process
first (`os.register_at_fork`). A prefork pool process forked in the middle of that work would
inherit, held, the locks it holds (SQLite's own, the connection pools', the import system's) and
hang at its first use of them; so a fork waits for the work in progress."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_working = threading.RLock()


def _new_lock_after_fork() -> None:
    global _working
    _working = threading.RLock()  # the child's copy is held by the fork; no background work runs there


os.register_at_fork(
    before=lambda: _working.acquire(), after_in_parent=lambda: _working.release(), after_in_child=_new_lock_after_fork
)


@contextmanager
def unforked() -> Iterator[None]:
    """Do the enclosed work with no fork of this process in the middle of it."""
    with _working:
        yield
