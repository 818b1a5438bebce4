"""A session's runs taken one at a time (`serialize_session_runs`): a first step parked behind
the runs of its session ahead of it, and the first run waiting given its turn when they stop.

Which runs are ahead. A run of an agent or team with `serialize_session_runs=True` takes its first
model step only when no other top-level run of its session is ahead of it: a run that has not
stopped (QUEUED, RUNNING, WAITING or PAUSED) and that was started before it (`created_at`, then
`run_id`) or has taken a step already (any status but QUEUED, or past its first step). So two are
never under way at once, even when a run's row is written after a later one took its first step
(its producer slow between its clock and its commit): that one goes first. A run that stopped
(COMPLETED, ERROR or CANCELLED) is not ahead; a PAUSED one is: it waits for a person, and its
answer belongs before the next run. Member runs are their team's: neither ahead nor waiting.

Parking (`Turns.park`, after the claim of the run's first model step, before its history is
chosen): in one transaction under the session's lock (`Backend.lock_names`, an advisory lock on PostgreSQL rather than
the session's row: the writes it orders lock the rows of the session's runs, and a step's commit
locks its run's row before the session's, so the session's row taken first could deadlock), the runs ahead are
marked (`wakes_session`) and the run goes back to QUEUED without an outbox marker (`outbox`:
"waiting"), its claim undone and not counted toward the poison limit, logged "session_wait" with
the runs it waits behind. With none ahead nothing is written and the step goes on.

Waking (`Turns.wake`). The move that stops a marked run returns its mark, so a run nobody waits
behind costs nothing more. Its stopper then, under the same lock, gives the session's first
waiting run its turn: its outbox marker set (its waker publishes its step; the sweeper, should
that publish be lost), logged "session_turn", the marks of the session's stopped runs cleared.
A first run that still has runs ahead (one continued, or written, since it parked) marks them
and waits on. A stopper that dies after its move leaves the stopped run marked: the sweeper's
pass wakes its session (`owed`). A park wakes too: the run it parked behind may itself be
waiting, ahead of it by its start, parked behind this one while this one was being claimed.

Why it cannot lose a wake: a stop and a park's mark of the same run meet on that run's row
lock. Either the mark commits first, and the stopping move returns it; or the stop commits
first, and the park, which marks only runs that have not stopped, does not count it ahead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, and_, or_, select, true, update

from orchestrator.errors import FencedError
from orchestrator.run import RunRecord
from orchestrator.status import RunStatus
from orchestrator.store import writes
from orchestrator.store.backend import Backend
from orchestrator.store.claims import Claim, held
from orchestrator.store.outbox import due_at
from orchestrator.store.tables import runs

if TYPE_CHECKING:
    from orchestrator.store.store import Store

S = RunStatus
#: A run in one of these is ahead of the runs of its session started after it.
UNFINISHED = (S.QUEUED, S.RUNNING, S.WAITING, S.PAUSED)
#: A run in one of these lets the next run of its session go.
STOPPED = (S.COMPLETED, S.ERROR, S.CANCELLED)
#: The runs a run parked behind are logged with its "session_wait", up to this many.
LOGGED_AHEAD = 10
#: Sessions the sweeper wakes in one pass, at most.
OWED_BATCH = 100

_MARKED = runs.c.wakes_session == true()
#: The runs marked, with their session and status (through the partial index `ix_ratchet_runs_wakes`).
_MARKED_RUNS = select(runs.c.session_id, runs.c.status).where(_MARKED)


@dataclass(frozen=True, kw_only=True)
class Parked:
    """A first step parked for its turn: the run as parked, the runs it waits behind, and the
    run the park gave its turn to (its step to publish), if any."""

    record: RunRecord
    ahead: list[str]
    woken: RunRecord | None


def _ahead_of(record: RunRecord) -> Any:
    """The runs of `record`'s session ahead of it (see above)."""
    earlier = or_(
        runs.c.created_at < record.created_at,
        and_(runs.c.created_at == record.created_at, runs.c.run_id < record.run_id),
    )
    started = or_(runs.c.status != S.QUEUED.value, runs.c.seq > 0)
    return and_(
        runs.c.session_id == record.session_id,
        runs.c.run_id != record.run_id,
        runs.c.parent_run_id.is_(None),
        runs.c.status.in_([s.value for s in UNFINISHED]),
        or_(earlier, started),
    )


def _waiting(session_id: str) -> Any:
    """The runs of the session parked for their turn: QUEUED without an outbox marker."""
    return and_(
        runs.c.session_id == session_id,
        runs.c.status == S.QUEUED.value,
        runs.c.publish_after.is_(None),
        runs.c.parent_run_id.is_(None),
    )


def _mark_ahead(conn: Connection, record: RunRecord) -> list[str]:
    """Mark the runs ahead of `record` (each waits on the row lock of a move in progress, then
    reads the row as that move left it); their ids, in start order (none: nothing ahead)."""
    marked = conn.execute(
        update(runs).where(_ahead_of(record)).values(wakes_session=True).returning(runs.c.run_id, runs.c.created_at)
    ).all()
    return [r.run_id for r in sorted(marked, key=lambda r: (r.created_at, r.run_id))]


class Turns:
    """Parks and wakes of serialized sessions' runs, on the store's transactions (`Store.turns`)."""

    def __init__(self, store: Store, backend: Backend) -> None:
        self._store = store
        self._backend = backend

    def park(self, claim: Claim, *, publish_grace: float) -> Parked | None:
        """Park the claimed first step if runs of its session are ahead of it (see above); None,
        and nothing written, when none is. FencedError if the claim was lost."""
        store, record = self._store, claim.record
        now = store.clock()
        with store.engine.begin() as conn:
            self._backend.lock_names(conn, [session_lock(record.session_id)])
            ahead = _mark_ahead(conn, record)
            if not ahead:
                return None
            parked = writes.move(
                conn,
                record.run_id,
                src=(S.RUNNING,),
                dst=S.QUEUED,
                now=now,
                epoch=claim.epoch,
                bump_epoch=False,
                extra_where=held(claim, now),
                publish_grace=None,
                delay=0.0,
                waiting=True,
                values=dict(lease_owner=None, lease_expires_at=None, attempts=runs.c.attempts - 1),
            )
            if parked is None:  # rolls the marks back with it
                raise FencedError(f"run {claim.run_id}: lease of epoch {claim.epoch} lost before it waited its turn")
            behind = ahead[:LOGGED_AHEAD]
            detail = dict(behind=behind, ahead=len(ahead), **writes.position(parked))
            store.log_event(conn, record.run_id, "session_wait", parked.seq, **detail)
            woken = self._give_turn(conn, record.session_id, now, publish_grace)
        return Parked(record=parked, ahead=ahead, woken=woken)

    def wake(self, record: RunRecord, *, publish_grace: float) -> RunRecord | None:
        """After the move that stopped `record`: when a run waits behind it, give the first one
        waiting in its session its turn; that run, due, whose step the caller publishes (None:
        none goes now). No database round trip for a run nobody waits behind."""
        if not record.wakes_session or record.status not in STOPPED:
            return None
        return self.wake_session(record.session_id, publish_grace=publish_grace)

    def wake_session(self, session_id: str, *, publish_grace: float) -> RunRecord | None:
        """Give the first run waiting in the session its turn if none is ahead of it (see `wake`)."""
        now = self._store.clock()
        with self._store.engine.begin() as conn:
            self._backend.lock_names(conn, [session_lock(session_id)])
            return self._give_turn(conn, session_id, now, publish_grace)

    def owed(self) -> list[str]:
        """The sessions where a run that stopped is still marked: its stopper died, or is about
        to wake the session (a second wake changes nothing). At most OWED_BATCH."""
        # Every marked run, filtered here: they are few (runs with one waiting behind them), and
        # a condition on the status in the query would have SQLite walk the status index instead.
        rows = self._backend.quick(lambda c: c.execute(_MARKED_RUNS).all())
        stopped = {s.value for s in STOPPED}
        return sorted({r.session_id for r in rows if r.status in stopped})[:OWED_BATCH]

    def _give_turn(self, conn: Connection, session_id: str, now: float, publish_grace: float) -> RunRecord | None:
        """Under the session's lock: clear the marks of its stopped runs, and mark its first
        waiting run due if nothing is ahead of it (else mark what is); that run, or None."""
        store = self._store
        stopped = [s.value for s in STOPPED]
        conn.execute(
            update(runs)
            .where(runs.c.session_id == session_id, _MARKED, runs.c.status.in_(stopped))
            .values(wakes_session=None)
        )
        order = (runs.c.created_at, runs.c.run_id)
        rows = conn.execute(select(runs).where(_waiting(session_id)).order_by(*order).limit(2)).all()
        if not rows:
            return None
        first = RunRecord.from_row(rows[0])
        if _mark_ahead(conn, first):
            return None
        values: dict[str, Any] = dict(publish_after=due_at(S.QUEUED, now, publish_grace=publish_grace), updated_at=now)
        if len(rows) > 1:  # the next one waits behind this one
            values["wakes_session"] = True
        row = conn.execute(
            update(runs)
            .where(runs.c.run_id == first.run_id, runs.c.epoch == first.epoch, _waiting(session_id))
            .values(**values)
            .returning(*runs.c)
        ).first()
        if row is None:
            return None
        woken = RunRecord.from_row(row)
        store.log_event(conn, woken.run_id, "session_turn", woken.seq, **writes.position(woken))
        return woken


def session_lock(session_id: str) -> str:
    """The name of the lock that orders the writes giving a session's runs their turns."""
    return f"ratchet.session:{session_id}"
