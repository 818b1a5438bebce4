"""The delta sink on Redis: one stream per streamed run, `ratchet:deltas:{run_id}`.

Each batch of a run's live events is one entry, an XADD (trimmed to about RATCHET_STREAM_MAXLEN
entries) sent with an EXPIRE of RATCHET_STREAM_TTL in the same round trip, so a stream expires that
long after its last write, also when the worker that wrote it died and nothing would ever have
cleaned it up. An entry's `e` is one event, or a JSON array of the events a batch carried: one
command a run and batch, not one an event (a streamed step of 29 deltas cost 0.95 ms in 58
commands, 0.65 ms in 4).

Writes leave the model call's thread: `write` queues the event and a flusher thread (one per
sink and process, started on first use) sends whatever has piled up in one pipeline, in the
order written, so a step pays no round trip per delta. A step's first event (its StepRestarted or
first delta) goes out at once on the caller's thread when nothing is queued or in flight: the
first token does not wait for a thread switch. The flusher yields once when woken before it
takes what is queued, so a burst of deltas goes out as one batch, not one round trip each.
`flush(run_id)` sends what the flusher has not taken yet on the caller's thread, then waits
until the run's queued events are sent; a step calls it before its commit. A batch that fails
(or whose send was interrupted, by a step's soft time limit from the moment the batch was taken)
is logged and dropped, and its runs' later events are dropped until their step flushes: a reader
sees a prefix of a step's text, never one with a hole in it, and the sink is never left busy.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import redis
from pydantic import TypeAdapter

from orchestrator.events import RunEvent
from orchestrator.settings import Settings
from workers.celery.app import BROKER_CONNECT_TIMEOUT, BROKER_SOCKET_TIMEOUT

KEY = "ratchet:deltas:{run_id}"
_BATCH = TypeAdapter(list[RunEvent])
#: Seconds `flush` waits for a Redis that does not answer before the step goes on without it.
FLUSH_TIMEOUT = 10.0
log = logging.getLogger("ratchet.worker")


class RedisDeltaSink:
    """A `DeltaSink` (orchestrator.ports) on the Redis at `url` (RATCHET_REDIS_URL)."""

    def __init__(self, settings: Settings, url: str) -> None:
        # Bounded like the broker's client (workers.celery.app): a Redis that stops answering holds the
        # sender thread, and so a streamed step's flush, for seconds, not for ever.
        self.client = redis.Redis.from_url(
            url, socket_timeout=BROKER_SOCKET_TIMEOUT, socket_connect_timeout=BROKER_CONNECT_TIMEOUT
        )
        self.ttl = max(1, round(settings.stream_ttl))
        self.maxlen = settings.stream_maxlen
        self._cond = threading.Condition()
        self._queue: list[RunEvent] = []
        self._busy = False  # a batch is on its way to Redis
        #: The thread sending that batch and the batch's runs: what `_abandon` gives up when a
        #: signal lands after the take and before the send's own `finally` could.
        self._sender: tuple[int, frozenset[str]] | None = None
        self._taken = 0  # how many queued events that batch stood for (broken runs' are dropped)
        self._queued = self._sent = 0  # events queued, and of those sent or given up, in order
        self._last: dict[str, int] = {}  # run_id -> the number of its last queued event
        self._broken: set[str] = set()  # runs whose events are dropped until their step flushes
        self._flusher: threading.Thread | None = None

    def write(self, event: RunEvent) -> None:
        """Queue the event; send it at once if it starts a step and nothing is ahead of it."""
        try:
            with self._cond:
                if event.run_id in self._broken:
                    return
                self._queue.append(event)
                self._queued += 1
                self._last[event.run_id] = self._queued
                if self._busy or len(self._queue) > 1 or event.key[3] > 1:
                    if self._flusher is None or not self._flusher.is_alive():  # not alive: a forked child
                        self._flusher = threading.Thread(target=self._flush_loop, name="ratchet-deltas", daemon=True)
                        self._flusher.start()
                    if not self._busy:  # a sending flusher takes the queue when its batch is sent
                        self._cond.notify_all()
                    return
                batch = self._take()
            self._send(batch)
        except BaseException:
            self._abandon()
            raise

    def flush(self, run_id: str) -> None:
        """Send what of the queue the flusher has not taken (this run's events may be in it), then
        wait until every event of the run queued so far is sent (or given up)."""
        batch = None
        try:
            with self._cond:
                n = self._last.get(run_id, 0)
                if self._sent < n and self._queue and not self._busy:
                    batch = self._take()  # sent on this thread rather than waiting for the flusher's turn
            if batch is not None:
                self._send(batch)
        except BaseException:
            self._abandon()
            raise
        with self._cond:
            if not self._cond.wait_for(lambda: self._sent >= n, FLUSH_TIMEOUT):
                log.warning("run %s: live events not sent after %ss; the run goes on", run_id, FLUSH_TIMEOUT)
            if self._last.get(run_id) == n:
                del self._last[run_id]
            self._broken.discard(run_id)

    def _take(self) -> list[RunEvent]:
        """Everything queued but broken runs' events, as the next batch (the caller holds the lock)."""
        batch = [e for e in self._queue if e.run_id not in self._broken]
        sender = (threading.get_ident(), frozenset(e.run_id for e in batch))
        # One statement of plain stores: CPython runs a signal's handler only at a call or a jump
        # back, so the handler finds all of these set or none, and the sender known whenever busy.
        self._busy, self._taken, self._queue, self._sender = True, len(self._queue), [], sender
        return batch

    def _done(self, failed: set[str] | frozenset[str]) -> None:
        """The batch in flight is sent or given up; `failed`: its runs given up for their step."""
        with self._cond:
            # One statement of plain stores again (see `_take`): `_abandon` after a signal in here
            # must not count the batch twice.
            self._sent, self._busy, self._broken, self._sender = (
                self._sent + self._taken,
                False,
                self._broken | failed,
                None,
            )
            self._cond.notify_all()

    def _abandon(self) -> None:
        """This thread was interrupted (a step's soft time limit, raised by a signal) between
        taking a batch and the end of its send: if that batch is still in flight, give up its
        runs for their step as an interrupted send does, so the sink is not left busy for good
        (every flush in the process would then wait FLUSH_TIMEOUT)."""
        with self._cond:
            sender = self._sender
        if sender is not None and sender[0] == threading.get_ident():
            self._done(sender[1])

    def _flush_loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._queue) and not self._busy)
            time.sleep(0)  # the writer's thread may queue more of its burst meanwhile
            with self._cond:
                if not self._queue or self._busy:
                    continue
                batch = self._take()
            try:
                self._send(batch)
            except BaseException:  # the process's only sender must outlive any one batch
                self._abandon()
                log.exception("live events: a batch failed in the sender thread")

    def _send(self, batch: list[RunEvent]) -> None:
        """XADD the batch and renew each stream's expiry, in one round trip. A Redis error gives
        up the batch's runs for their step; anything else (a step's soft time limit, when the
        step's own thread sends) propagates, with the sender's state left consistent and the
        batch's runs given up for their step as for a Redis error: a step's flush sends other
        runs' events too, and a reader must never see one of them with a hole in its text."""
        failed: set[str] = set()
        try:
            payloads: list[tuple[str, str]] = []
            for event in batch:
                try:
                    payloads.append((event.run_id, event.model_dump_json()))
                except ValueError as exc:  # this event's run only, not the batch's other runs
                    failed.add(event.run_id)
                    log.warning("run %s: a live event could not be written (%s); its step goes on", event.run_id, exc)
            bodies: dict[str, list[str]] = {}
            for run_id, body in payloads:
                if run_id not in failed:
                    bodies.setdefault(run_id, []).append(body)
            if bodies:
                pipe = self.client.pipeline(transaction=False)
                for run_id, some in bodies.items():  # one entry a run: its events of the batch, in order
                    entry = some[0] if len(some) == 1 else "[" + ",".join(some) + "]"
                    pipe.xadd(KEY.format(run_id=run_id), {"e": entry}, maxlen=self.maxlen, approximate=True)
                    pipe.expire(KEY.format(run_id=run_id), self.ttl)
                pipe.execute()
        except (redis.RedisError, OSError) as exc:  # a live view never fails a step
            failed |= {e.run_id for e in batch}
            log.warning("runs %s: live events stopped for this step (%s); the runs go on", sorted(failed), exc)
        except BaseException:  # interrupted: whether the batch reached Redis is unknown
            failed |= {e.run_id for e in batch}
            raise
        finally:
            self._done(failed)  # counted once sent: `flush` relies on the order

    def discard(self, run_ids: Sequence[str]) -> None:
        """Delete the runs' streams; if Redis does not answer, they expire after RATCHET_STREAM_TTL."""
        try:
            for i in range(0, len(run_ids), 500):
                self.client.delete(*(KEY.format(run_id=run_id) for run_id in run_ids[i : i + 500]))
        except (redis.RedisError, OSError) as exc:
            log.warning("the live events of %d deleted runs are left to expire (%s)", len(run_ids), exc)

    def read(self, run_id: str, cursor: str | None) -> tuple[list[RunEvent], str | None]:
        """The stream's entries after the entry id `cursor`, in the order written."""
        start = "-" if cursor is None else f"({cursor}"
        return _events(self.client.xrange(KEY.format(run_id=run_id), min=start, max="+"), cursor)

    def wait(self, run_id: str, cursor: str | None, timeout: float) -> tuple[list[RunEvent], str | None]:
        """Block on the stream (XREAD BLOCK, at least 1 ms) until there are entries after
        `cursor`, and return them (all there are: the stream is trimmed to RATCHET_STREAM_MAXLEN)."""
        got: Any = self.client.xread({KEY.format(run_id=run_id): cursor or "0-0"}, block=max(1, round(timeout * 1000)))
        return _events(got[0][1] if got else [], cursor)  # [[key, entries]] (RESP2, as the client speaks)


def _events(entries: Any, cursor: str | None) -> tuple[list[RunEvent], str | None]:
    """The live events of a stream's entries, and the id of the last as the next cursor."""
    if not entries:
        return [], cursor
    events: list[RunEvent] = []
    for _, fields in entries:
        body = (fields or {}).get(b"e", b"")
        if body[:1] == b"[":  # a batch's events of the run
            events += _BATCH.validate_json(body)
        elif body:
            events.append(RunEvent.model_validate_json(body))
    last = entries[-1][0]
    return events, last.decode() if isinstance(last, bytes) else str(last)
