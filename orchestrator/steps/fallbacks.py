"""The model step's fallback stage: a model that failed for good hands the step to the next
model of its agent's chain (`orchestrator.models.fallback` says which), in the same step.

The move is written before the next model is called (`Store.fall_back`): the run's
`model_index` names the model the step is on, so a worker that dies in that call leaves a step
the sweeper hands back to the model it was trying, not to the one that had failed; and it is
logged ("fallback": FallbackModelActivated, the step's log), with the error that caused it.
The move bumps the claim's epoch (as a claim taken back does), so that the live events of a
streamed call that failed sort before the next call's. When the last model of the chain fails
too, the step fails with each model's error, read back from those log entries (a crash or a
retry between two models loses none of them).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from orchestrator.agent import AgentDefinition
from orchestrator.errors import FencedError, ModelCallError
from orchestrator.run import RunRecord
from orchestrator.steps.context import StepContext
from orchestrator.steps.inflight import InFlight
from orchestrator.store import Claim
from orchestrator.store.transient import retry_transient

log = logging.getLogger("ratchet.steps")


class Fallbacks:
    """Moves a claimed model step along its agent's fallback chain."""

    def __init__(self, steps: StepContext) -> None:
        self.steps = steps
        self.store = steps.store

    def switch(
        self, claim: Claim, flight: InFlight, agent: AgentDefinition, index: int, following: int, exc: ModelCallError
    ) -> Claim:
        """Record that the step leaves the model at `index`, which failed with `exc`, for the one
        at `following`: the claim the step goes on under (its new epoch)."""
        chain = agent.fallback
        why: dict[str, Any] = {
            "from": chain.model(index).id,
            "to": chain.model(following).id,
            "error": exc.to_record(),
        }
        lease = self.steps.settings.lease_seconds
        flight.moves += 1  # odd: a renewal sent with the old epoch that fails now is not a lost claim
        try:
            record = retry_transient(
                lambda: self.store.fall_back(claim, index=following, lease_seconds=lease, **why),
                landed=lambda: self._landed(claim, following),
                within=lease,
                what=f"run {claim.run_id} fallback",
            )
            flight.epoch = record.epoch
        finally:
            flight.moves += 1
        log.warning(
            "run %s step %s: %s failed (%s); falling back to %s",
            claim.run_id,
            record.seq,
            chain.model(index).describe(),
            exc.kind,
            chain.model(following).describe(),
        )
        return replace(claim, record=record)

    def _landed(self, claim: Claim, following: int) -> RunRecord | None:
        """After a transient error: the run if the fallback's move committed after all."""
        record = self.store.get_record(claim.run_id)
        mine = record.lease_owner == claim.record.lease_owner
        if mine and record.epoch == claim.epoch + 1 and record.model_index == following:
            return record
        if mine and record.epoch == claim.epoch:
            return None
        raise FencedError(f"run {claim.run_id}: the claim of epoch {claim.epoch} was taken over during its fallback")

    def exhausted(self, claim: Claim, agent: AgentDefinition, index: int, exc: ModelCallError) -> ModelCallError:
        """The error a step fails with when the model at `index` failed for good with `exc` and
        no model follows it: `exc` itself when the step never fell back, else one that says
        what each model of the chain it went through failed with (its type: the first one's)."""
        if index <= 0:
            return exc
        errors = self._errors(claim, index)
        errors.append(dict(exc.to_record(), model=agent.fallback.model(index).id))
        said = "; ".join(f"({n}) {_named(e)}" for n, e in enumerate(errors, 1))
        return ModelCallError(
            f"every model of the fallback chain failed ({len(errors)} tried): {said}. Fix the cause (a model's "
            "error above) and continue the run: it starts again from the agent's own model",
            retryable=False,
            status_code=exc.status_code,
            kind=str(errors[0].get("type", exc.kind)),
        )

    def _errors(self, claim: Claim, index: int) -> list[dict[str, str]]:
        """The errors of the models this step left, in order, from its "fallback" log entries:
        for each model it moved to (up to `index`), the latest entry at this message count."""
        latest: dict[int, dict[str, Any]] = {}
        here = claim.record.n_messages
        for entry in self.store.get_events(claim.run_id):
            detail = entry.get("detail") or {}
            if entry["kind"] == "fallback" and detail.get("n_messages") == here:
                latest[int(detail.get("index", 0))] = detail
        moved = [latest[k] for k in sorted(latest) if k <= index]
        return [dict(d.get("error") or {}, model=str(d.get("from", ""))) for d in moved]


def _named(error: dict[str, str]) -> str:
    """An error's text, naming its model where the text does not already."""
    message, model = error.get("message", ""), error.get("model", "")
    return message if model and model in message else f"{model}: {message}"
