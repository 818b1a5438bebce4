"""The live events of a claimed step of a streamed run: its text deltas and StepRestarted.

Only runs started with stream=True get here (the model step checks the run row it claimed, so a
step of any other run gains no write and no round trip). Live events are a view: writing one
never fails the step; a sink that fails is given up for the rest of the step, and the durable
events (`orchestrator.events`) still tell the whole run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from orchestrator.events import EventName, RunEvent, event_id, live_key
from orchestrator.ports import DeltaSink
from orchestrator.store import Claim
from orchestrator.untrusted import escape

log = logging.getLogger("ratchet.steps")


class LiveStep:
    """Writes one claimed step's live events, keyed at the message count and epoch of its claim."""

    def __init__(
        self,
        sink: DeltaSink,
        claim: Claim,
        clock: Callable[[], float],
        *,
        timeouts: tuple[type[BaseException], ...] = (),
    ) -> None:
        self.sink = sink
        self.claim = claim
        self.clock = clock
        #: What ends the step at its soft time limit: never taken for a sink's failure.
        self.timeouts = timeouts
        self.k = 0
        self.broken = False

    def begin(self) -> None:
        """Announce a step that had an earlier attempt (a crash, an expired lease, a retried call,
        a model that failed before its fallback):
        readers drop that attempt's deltas, which sort before this event."""
        record = self.claim.record
        if record.attempts > 1 or record.retries > 0 or record.model_index:
            self._write("StepRestarted", None)

    def delta(self, text: str) -> None:
        """Publish one text delta of the model's reply (the model adapter calls this)."""
        if text:
            self.k += 1
            # What a model says is untrusted: a lone surrogate would fail the delta's JSON (and,
            # batched, other runs' deltas with it). Escaped as the committed reply is.
            self._write("RunContent", escape(text)[0])

    def end(self) -> None:
        """Wait until the sink has stored this step's live events (it may send them in the
        background): called when the model call ends, before the step commits anything, so no
        durable event can be read before a delta that sorts below it (`orchestrator.reader`)."""
        if self.broken:
            return
        try:
            self.sink.flush(self.claim.record.run_id)
        except self.timeouts:
            raise
        except Exception as exc:
            record = self.claim.record
            log.warning("run %s step %s: live events not flushed (%s); the run goes on", record.run_id, record.seq, exc)

    def _write(self, name: EventName, content: str | None) -> None:
        if self.broken:
            return
        record = self.claim.record
        event = RunEvent(
            id=event_id(live_key(record.n_messages, record.epoch, self.k)),
            event=name,
            run_id=record.run_id,
            seq=record.seq,
            attempt=record.epoch,
            created_at=self.clock(),
            content=content,
        )
        try:
            self.sink.write(event)
        except self.timeouts:
            raise
        except Exception as exc:
            self.broken = True
            log.warning("run %s step %s: live events stopped (%s); the run goes on", record.run_id, record.seq, exc)
