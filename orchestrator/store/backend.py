"""What the run store does its own way on each database: the interface of `SqliteBackend`
(`sqlite.py`) and `PostgresBackend` (`postgres.py`).

`Store` holds everything the two share and calls its backend for the rest: the pools reads and
lazy writes run on, how a new run, the claim and a step's commit reach the database (prebuilt
statements, one round trip each where the database allows), and how a producer waiting for a run
hears that it stopped.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine

from orchestrator.messages import Message
from orchestrator.run import RunOutput, RunRecord
from orchestrator.store import reads
from orchestrator.store.claims import Claim
from orchestrator.store.deciding import AtOnce
from orchestrator.store.notify import FinalWatcher
from orchestrator.store.transcripts import TranscriptCache

T = TypeVar("T")


class Backend(ABC):
    """The database-specific part of a `Store`. Thread-safe."""

    #: Whether a list binds as one array parameter (`= ANY(:ids)`): the run history is then
    #: chosen, fenced and read in single statements run on the driver (`store/history.py`).
    binds_arrays = False

    def __init__(self, engine: Engine, *, quick_engine: Engine, lazy_engine: Engine) -> None:
        #: Durable writes.
        self.engine = engine
        #: Reads (see `quick`).
        self.quick_engine = quick_engine
        #: Writes that need not survive an OS crash (see `lazy`).
        self.lazy_engine = lazy_engine
        #: Where a backend without notifications announces final moves (`notify.announce_after_commit`).
        self.announce: Callable[[list[str]], None] | None = None

    @abstractmethod
    def quick(self, work: Callable[[Connection], T]) -> T:
        """Run the read `work` on a connection of the quick pool."""

    def snapshot(self, work: Callable[[Connection], T]) -> T:
        """Run the reads `work` in one snapshot of the database (SQLite: one read transaction)."""
        return self.quick(work)

    @abstractmethod
    def lazy(self, work: Callable[[Connection], T]) -> T:
        """Run the write `work` committed without waiting for the disk: lost in an OS crash, it
        leaves the run as it was, and every write it fences (by epoch and owner) fails."""

    @abstractmethod
    def single_statement(self) -> AbstractContextManager[Connection]:
        """A connection in a transaction for a write the backend sends as one statement."""

    @abstractmethod
    def create(self, conn: Connection, values: dict[str, Any], input_messages: Sequence[Message]) -> RunRecord:
        """Insert the run row `values`, its session if new, and its input messages (stamped with
        the new run's seq and epoch); SessionOwnedError, and nothing written, if the session
        belongs to another user than the run's (`sessions.refused`)."""

    def create_alone(self, values: dict[str, Any], input_messages: Sequence[Message]) -> RunRecord:
        """`create` in a transaction of its own, committed durably."""
        with self.single_statement() as conn:
            return self.create(conn, values, input_messages)

    @abstractmethod
    def lock_names(self, conn: Connection, names: Sequence[str]) -> None:
        """Hold a lock on each of `names`, in the order given, until the caller's transaction
        ends: another transaction that locks one of them waits for it (`store/backlog.py`,
        `store/turns.py`)."""

    @abstractmethod
    def claim(self, conn: Connection, params: dict[str, Any], cache: TranscriptCache) -> Claim | None:
        """Run `statements.CLAIM` with `params`; the claim with the run's transcript (the part
        `cache` lacks read from the database), or None when the guard did not match."""

    @abstractmethod
    def commit(
        self, conn: Connection, params: dict[str, Any], new_messages: Sequence[Message], *, seq: int, final: bool
    ) -> RunRecord | None:
        """Run `statements.COMMIT` with `params` and append `new_messages` (stamped with step
        `seq` at the bound epoch, and the claim's time `b_started`); None, and nothing written,
        when the guard did not match.
        `final`: the move ends the run (see `on_final`)."""

    @abstractmethod
    def decide_at_once(self, bound: dict[str, Any]) -> AtOnce | None:
        """Store a decision in the common case (`store/deciding.py`), durably, with `bound` as
        `deciding.params` makes it; what it wrote, or None when the guards did not hold (nothing
        written)."""

    def output(self, conn: Connection, run_id: str) -> RunOutput:
        """The run with its transcript and its member runs."""
        return reads.get_output(conn, run_id)

    def event_rows(self, run_id: str, since: int) -> reads.EventRows:
        """The run's row and the rows of its durable events (its messages from `since` on), from
        one snapshot."""
        return self.snapshot(lambda c: reads.event_rows(c, run_id, since))

    @abstractmethod
    def on_final(self, conn: Connection, run_id: str) -> None:
        """The run reaches a final status when the caller's transaction commits."""

    @abstractmethod
    def final_watcher(self) -> FinalWatcher | None:
        """The process's listener for runs reaching a final status (None: waiters poll)."""

    @property
    def announces_finals(self) -> bool:
        """Whether final moves are announced through `announce` (no notifications of its own)."""
        return False

    @abstractmethod
    def dispose(self, *, close: bool) -> None:
        """Drop the pools and stop listening; `close=False` leaves pooled connections open (see
        `Store.dispose`)."""
