"""Following a run: its durable events and, for a streamed run, its live ones, merged in id order.

Each poll reads the run's durable events in one snapshot of the store (`durable_events`), then
the live events its delta sink got since the last poll. The order of the two reads matters: a
step writes its deltas before it commits, so every delta that sorts before a durable event the
snapshot shows is in the sink by the time it is read. A delta of a claim the snapshot does not
show yet (its epoch is higher than the run's) is held back until one does, so no durable event
can later turn up below an id already handed out. The reader ends once the run is final or
PAUSED and everything that snapshot showed is out.

Between polls `follow` waits on the sink (`DeltaSink.wait`): on Redis a blocking read of the
run's stream, so a delta wakes the reader at once; the wait's timeout is the polling schedule
(`delays`), so a durable event is seen as soon as before. The deltas that woke the reader go out
without reading the store again when no durable event can sort below them: those of a claim the
last snapshot showed, and those of the claim that follows a QUEUED agent run's snapshot (its
epoch one higher, at the same message count: every event an agent run logs while QUEUED is
written with the move that queued it, or bumps the epoch, as a cancel does). Anything else (a
later claim, a team) takes a full poll, as before.
`afollow` sleeps instead: a blocking wait would hold one of the event loop's few worker threads
for each reader.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator

from orchestrator import events
from orchestrator.errors import RunWaitTimeout
from orchestrator.events import Key, RunEvent, parse_id
from orchestrator.ports import DeltaSink
from orchestrator.run import RunRecord
from orchestrator.status import RunStatus
from orchestrator.store import Store

log = logging.getLogger("ratchet.reader")


def durable_events(store: Store, run_id: str, after: Key | None = None) -> tuple[RunRecord, list[RunEvent]]:
    """The run's row and its durable events after `after` in id order, derived from rows the
    store read in one snapshot (`Store.event_rows`)."""
    rows = store.event_rows(run_id, since=events.since(after))
    derived = events.derive(
        rows.record, rows.messages, rows.logged, rows.members, after=after, requirements=rows.requirements
    )
    return rows.record, derived


def delays() -> Iterator[float]:
    """Seconds between polls of a run that had nothing new: 2 ms at first, backing off to 50 ms."""
    delay = 0.002
    while True:
        yield delay
        delay = min(delay * 1.5, 0.05)


class Follower:
    """The state of one reader of one run: the last id handed out and the sink's cursor."""

    def __init__(self, store: Store, sink: DeltaSink, run_id: str, after: str | None = None) -> None:
        self.store = store
        self.sink = sink
        self.run_id = run_id
        self.last: Key | None = parse_id(after) if after is not None else None
        self.cursor: str | None = None
        self.held: list[RunEvent] = []
        #: Live events the last wait read, not handed out yet.
        self.woken: list[RunEvent] = []
        #: Live events keyed at or below this epoch (the key's second part) can go out without a
        #: new snapshot; and, if set, those keyed at this (message count, epoch): the next claim's.
        self.ready = 0
        self.next_claim: tuple[int, int] | None = None
        self.stream = False
        self.done = False
        #: The sink failed its last read: live events are skipped until it answers again.
        self.sink_down = False

    def poll(self) -> list[RunEvent]:
        """The events that are new since the last poll, in id order (sets `done` at the end)."""
        if self.woken and (early := self._early()) is not None:
            return early
        for _ in range(2):
            record, durable = durable_events(self.store, self.run_id, after=self.last)
            if not record.stream:
                break
            live = self._read_live()
            self.held += [e for e in live if self.last is None or e.key > self.last]
            if all(e.key[1] <= record.epoch + 1 for e in self.held):
                break
            # The snapshot came before a claim whose delta came after it: a claim commits before
            # its deltas are written, so a second snapshot (then read, as always) shows it.
        ready: list[RunEvent] = []
        self.stream = record.stream
        if record.stream:
            # Live keys carry the claim's epoch + 1: ready once the snapshot shows that claim.
            ready = [e for e in self.held if e.key[1] <= record.epoch + 1]
            self.held = [e for e in self.held if e.key[1] > record.epoch + 1]
        out: list[RunEvent] = []
        for event in sorted(durable + ready, key=lambda e: e.key):
            if self.last is None or event.key > self.last:  # a stale attempt's late delta sorts below
                out.append(event)
                self.last = event.key
        self.done = record.status.is_final
        self.ready = record.epoch + 1
        queued_agent = record.status == RunStatus.QUEUED and record.kind == "agent"
        self.next_claim = (record.n_messages, record.epoch + 2) if queued_agent else None
        return out

    def _early(self) -> list[RunEvent] | None:
        """The live events the wait read, if no durable event can sort below any of them (see
        the module docstring); else None, and a full poll hands them out."""
        live = self.held + self.woken
        if not all(e.key[1] <= self.ready or e.key[:2] == self.next_claim for e in live):
            return None
        self.held, self.woken = [], []
        if any(e.key[:2] == self.next_claim for e in live):  # that claim is the run's now
            self.ready, self.next_claim = self.ready + 1, None
        out: list[RunEvent] = []
        for event in sorted(live, key=lambda e: e.key):
            if self.last is None or event.key > self.last:
                out.append(event)
                self.last = event.key
        return out

    def _read_live(self) -> list[RunEvent]:
        """The sink's new live events (after those the last wait read); none while it cannot be
        read (Redis down): the durable events, rebuilt from the database, still tell the whole run."""
        woken, self.woken = self.woken, []
        try:
            live, self.cursor = self.sink.read(self.run_id, self.cursor)
        except Exception as exc:
            if not self.sink_down:
                log.warning("run %s: live events unreadable (%s); following its stored events", self.run_id, exc)
            self.sink_down = True
            return woken  # read already: the cursor is past them
        self.sink_down = False
        return woken + live

    def wait(self, timeout: float) -> None:
        """Wait up to `timeout` seconds before the next poll, less if a streamed run's sink gets a
        live event (kept for the poll, which hands it out at once if it can: `_early`)."""
        if self.stream and not self.sink_down:
            try:
                woken, self.cursor = self.sink.wait(self.run_id, self.cursor, timeout)
                self.woken += woken
                return
            except Exception:  # logged by the read that finds it down
                self.sink_down = True
        time.sleep(timeout)


def follow(follower: Follower, timeout: float | None = None) -> Iterator[RunEvent]:
    """Yield the run's events as they happen until it is final or PAUSED (RunWaitTimeout after
    `timeout` seconds; the run goes on, and `after=` the last id seen picks it up again)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    waits = delays()
    while True:
        events = follower.poll()
        yield from events
        if follower.done:
            return
        if events:
            waits = delays()
        _check(follower, deadline, timeout)
        follower.wait(next(waits))


async def afollow(follower: Follower, timeout: float | None = None) -> AsyncIterator[RunEvent]:
    """`follow` for asyncio: each poll runs in a thread, the waits do not block the event loop."""
    deadline = None if timeout is None else time.monotonic() + timeout
    waits = delays()
    while True:
        events = await asyncio.to_thread(follower.poll)
        for event in events:
            yield event
        if follower.done:
            return
        if events:
            waits = delays()
        _check(follower, deadline, timeout)
        await asyncio.sleep(next(waits))


def _check(follower: Follower, deadline: float | None, timeout: float | None) -> None:
    if deadline is not None and time.monotonic() >= deadline:
        last = "-".join(map(str, follower.last)) if follower.last is not None else None
        raise RunWaitTimeout(
            f"run {follower.run_id} is still going after {timeout}s; follow it again with after={last!r}"
        )
