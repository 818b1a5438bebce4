"""The model step's side of flow control (`orchestrator.flow`): ask the limiter before the call,
park the step when it says wait, correct the call's token estimate, share the provider's 429s,
and release a run's place when it ends."""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING

from orchestrator import flow
from orchestrator.errors import ModelCallError
from orchestrator.models.base import ModelReply
from orchestrator.ports import Ask, Limiter
from orchestrator.routing import step_of
from orchestrator.run import RunRecord
from orchestrator.store import Claim

if TYPE_CHECKING:
    from orchestrator.steps.runner import StepRunner

log = logging.getLogger("ratchet.engine")
#: Up to this share of a rate's wait is added at random, so the steps parked on one bucket do
#: not all come back in the same instant.
JITTER = 0.1


class Throttle:
    """Flow control for one step runner."""

    def __init__(self, runner: StepRunner) -> None:
        self.runner = runner

    @property
    def limiter(self) -> Limiter:
        """The runner's runtime's limiter."""
        return self.runner.runtime.limiter

    def parked(self, claim: Claim, ask: Ask) -> bool:
        """Ask the limiter for the claimed step; if it says wait, park the step QUEUED (the
        claim ends here, holding no worker) and say so. A step waiting for a place among its
        key's runs is published by the release that gives it one, or by the sweeper after
        RATCHET_PUBLISH_GRACE_SECONDS; one waiting for a rate, with a countdown of that wait."""
        verdict = self.limiter.admit(ask)
        if verdict.admitted:
            return False
        settings = self.runner.settings
        waiting = verdict.reason == "concurrency"
        if waiting:
            delay, short = min(verdict.wait, settings.publish_grace_seconds), False
        else:
            delay = verdict.wait * (1 + JITTER * random.random())
            short = delay <= settings.max_countdown
        reason = verdict.reason or ""
        record = self.runner.durably(
            claim,
            lambda: self.runner.store.park_throttled(
                claim, delay=delay, published=short, reason=reason, publish_grace=settings.publish_grace_seconds
            ),
        )
        self.runner.end(claim)
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
                self.runner.publish(step)  # a place came free between the verdict and the park
        elif short:
            self.runner.publish(step_of(record, countdown=delay))
        return True

    def used(self, ask: Ask, reply: ModelReply) -> None:
        """Correct the call's token estimate with the usage its provider reported."""
        if ask.model is None or ask.rate is None or ask.rate.tokens is None:
            return
        used = flow.used_tokens(reply.usage)
        if used is None:
            return
        # As `admit` charged it: a call counts for at most the whole limit, whatever a provider
        # (or a proxy in front of it) says it used, so one reply cannot park a model for years.
        cap = ask.rate.tokens
        correction = min(used, cap) - min(ask.tokens, cap)
        if correction:
            self.limiter.settle(ask.model, ask.rate, correction)

    def failed(self, ask: Ask, exc: ModelCallError) -> None:
        """A 429 blocks the model for every worker for its Retry-After (the run retries as usual)."""
        if ask.model is not None and exc.status_code == 429:
            seconds = exc.retry_after if exc.retry_after is not None else flow.DEFAULT_BLOCK
            # No longer than a run of its own may be parked (`_retry` errors out a run told to
            # wait longer): a provider's Retry-After must not silently park every run of the model.
            seconds = min(seconds, self.runner.settings.max_retry_after)
            log.info("model %s: the provider said 429; no call of it for %.2fs on any worker", ask.model, seconds)
            self.limiter.block(ask.model, seconds)

    def release(self, record: RunRecord) -> None:
        """The run ended or paused: free its place, and publish the step of the run that takes it."""
        step = flow.release(self.runner.settings, lambda: self.limiter, record)
        if step is not None:
            log.info("run %s: a place came free; run %s goes on", record.run_id, step.run_id)
            self.runner.publish(step)
