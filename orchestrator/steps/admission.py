"""The model step's limiter stage (`orchestrator.limits` says what the limits are): ask the
limiter before the call, park the step when it says wait, correct the call's token estimate,
share the provider's 429s, and release a run's place when it ends."""

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
    """The limiter's side of the steps of one step runner: its verdicts, parks and releases."""

    def __init__(self, steps: StepContext, limiter: Limiter) -> None:
        self.steps = steps
        self.settings = steps.settings
        #: The runtime's limiter.
        self.limiter = limiter

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
        """The run ended or paused: free its place, and publish the step of the run that takes it."""
        step = limits.release(self.settings, lambda: self.limiter, record)
        if step is not None:
            log.info("run %s: a place came free; run %s goes on", record.run_id, step.run_id)
            self.steps.publish(step)
