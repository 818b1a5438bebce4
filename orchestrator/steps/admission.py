"""The model step's admission: a serialized session's run waits its turn at its first step
(`orchestrator.store.turns`), and the limiter's stage (`orchestrator.limits` says what the limits
are): ask the limiter before the call, park the step when it says wait, correct the call's token
estimate, share the provider's 429s; and when a run ends, release its place and give the next
run of its session its turn."""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence

from orchestrator import limits
from orchestrator.agent import AgentDefinition
from orchestrator.errors import ModelCallError
from orchestrator.messages import Message
from orchestrator.models.base import Model, ModelReply
from orchestrator.ports import Ask, Limiter
from orchestrator.routing import step_of
from orchestrator.run import RunRecord
from orchestrator.steps.context import StepContext
from orchestrator.store import Claim

log = logging.getLogger("ratchet.steps")
#: Up to this share of a rate's wait is added at random, so the steps parked on one bucket do
#: not all come back in the same instant.
JITTER = 0.1


class Admission:
    """Whether the steps of one step runner may go now: their session's turns, the limiter's
    verdicts, parks and releases."""

    def __init__(self, steps: StepContext, limiter: Limiter) -> None:
        self.steps = steps
        self.settings = steps.settings
        #: The runtime's limiter.
        self.limiter = limiter

    def waits_turn(self, agent: AgentDefinition, claim: Claim) -> bool:
        """The first step of a run of a serialized session (`serialize_session_runs`): park it
        QUEUED behind the runs of its session ahead of it (the claim ends here, holding no
        worker) and say so; it goes on when the last of them stops (`turn`). No round trip for
        any other step."""
        record = claim.record
        if not agent.serialize_session_runs or record.parent_run_id is not None or record.seq != 0:
            return False
        grace = self.settings.publish_grace_seconds
        parked = self.steps.durably(claim, lambda: self.steps.store.turns.park(claim, publish_grace=grace))
        if parked is None:
            return False
        self.steps.end(claim)
        log.info(
            "run %s: waits its turn in session %s behind %d run(s), first %s",
            claim.run_id,
            record.session_id,
            len(parked.ahead),
            parked.ahead[0],
        )
        if parked.woken is not None:  # a run waiting ahead of it, which parked behind it meanwhile
            self.steps.publish(step_of(parked.woken))
        return True

    def turn(self, record: RunRecord) -> None:
        """The run stopped: if a run of its session waits behind it, publish the step of the
        first one waiting (`store/turns.py`). A failure here leaves the stopped run marked, and
        the sweeper gives the turn: the step that stopped the run has committed and is not failed."""
        try:
            woken = self.steps.store.turns.wake(record, publish_grace=self.settings.publish_grace_seconds)
        except Exception as exc:
            log.warning(
                "run %s: could not give the next run of its session its turn (%s); the sweeper will", record.run_id, exc
            )
            return
        if woken is not None:
            log.info(
                "run %s stopped: run %s of session %s takes its turn", record.run_id, woken.run_id, woken.session_id
            )
            self.steps.publish(step_of(woken))

    def ask(self, agent: AgentDefinition, record: RunRecord, prompt: Sequence[Message], model: Model) -> Ask | None:
        """What the step asks of the limiter before it calls `model` (`limits.ask_for`); None
        when no limit applies to it, and then nothing is asked: no round trip."""
        return limits.ask_for(self.settings, agent, record, prompt, model)

    def parked(self, claim: Claim, ask: Ask | None) -> bool:
        """Ask the limiter for the claimed step; if it says wait, park the step QUEUED (the
        claim ends here, holding no worker) and say so. A step waiting for a place among its
        key's runs is published by the release that gives it one, or by the sweeper after
        RATCHET_PUBLISH_GRACE_SECONDS; one waiting for a rate, with a countdown of that wait."""
        if ask is None:
            return False
        verdict = self.limiter.admit(ask)
        if verdict.admitted:
            return False
        settings = self.settings
        waiting = verdict.reason == "concurrency"
        if waiting:
            delay, short = min(verdict.wait, settings.publish_grace_seconds), False
        else:
            delay = verdict.wait * (1 + JITTER * random.random())
            short = delay <= settings.max_countdown
        reason = verdict.reason or ""
        record = self.steps.durably(
            claim,
            lambda: self.steps.store.park_throttled(
                claim, delay=delay, published=short, reason=reason, publish_grace=settings.publish_grace_seconds
            ),
        )
        self.steps.end(claim)
        what = f"key {ask.key!r}" if waiting else f"model {ask.model!r}"
        log.info(
            "run %s step %s: throttled (%s of %s), parked for up to %.2fs",
            claim.run_id,
            record.seq,
            reason,
            what,
            delay,
        )
        if waiting:
            assert ask.key is not None
            step = step_of(record)
            if self.limiter.wait_for_room(ask.key, ask.limit, step):
                self.steps.publish(step)  # a place came free between the verdict and the park
        elif short:
            self.steps.publish(step_of(record, countdown=delay))
        return True

    def used(self, ask: Ask | None, reply: ModelReply) -> None:
        """Correct the call's token estimate with the usage its provider reported."""
        if ask is None or ask.model is None or ask.rate is None or ask.rate.tokens is None:
            return
        used = limits.used_tokens(reply.usage)
        if used is None:
            return
        # As `admit` charged it: a call counts for at most the whole limit, whatever a provider
        # (or a proxy in front of it) says it used, so one reply cannot park a model for years.
        cap = ask.rate.tokens
        correction = min(used, cap) - min(ask.tokens, cap)
        if correction:
            self.limiter.settle(ask.model, ask.rate, correction)

    def failed(self, ask: Ask | None, exc: ModelCallError) -> None:
        """A 429 blocks the model for every worker for its Retry-After (the run retries as usual)."""
        if ask is not None and ask.model is not None and exc.status_code == 429:
            seconds = exc.retry_after if exc.retry_after is not None else limits.DEFAULT_BLOCK
            # No longer than a run of its own may be parked (`ModelStep._retry` errors out a run
            # told to wait longer): a provider's Retry-After must not silently park every run of
            # the model.
            seconds = min(seconds, self.settings.max_retry_after)
            log.info("model %s: the provider said 429; no call of it for %.2fs on any worker", ask.model, seconds)
            self.limiter.block(ask.model, seconds)

    def release(self, record: RunRecord) -> None:
        """The run ended or paused: free its place, and publish the step of the run that takes
        it; a run that stopped gives the next run of its session its turn (`turn`)."""
        step = limits.release(self.settings, lambda: self.limiter, record)
        if step is not None:
            log.info("run %s: a place came free; run %s goes on", record.run_id, step.run_id)
            self.steps.publish(step)
        self.turn(record)
