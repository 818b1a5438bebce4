"""The claim's side of a deploy (`orchestrator.deploys`): which definition a claimed step runs on.

The claim returns the run's row, and with it the definition the run is on. When that is the
definition of the run's agent this worker serves (always, but across a deploy), the step goes
on with nothing read: its claim is stamped with the hash, which every message it writes carries
(the definition each step ran on, beside the run's). Otherwise, and only then, `Versions` reads
the catalog's entries of the agent (and a tool step's decided calls) and applies
`deploys.decide`: the run takes this worker's definition (logged as "definition"), the step is
handed on to a worker of the run's (logged as "handed_on"; on its version queue), or it fails
with DefinitionChangedError, saying what changed.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from orchestrator import deploys
from orchestrator.agent import find_agent
from orchestrator.catalog import Definition, describe, entry_of, live_seconds
from orchestrator.messages import ToolCall, unanswered_calls
from orchestrator.ports import StepKind, StepRef
from orchestrator.routing import queue_for
from orchestrator.steps.context import StepContext
from orchestrator.steps.inflight import InFlight
from orchestrator.store import Claim

log = logging.getLogger("ratchet.steps")


class Versions:
    """Checks each claim's definition against this worker's, through its runner's step protocol."""

    def __init__(self, steps: StepContext) -> None:
        self.steps = steps
        self.store = steps.store

    def checked(self, claim: Claim, kind: StepKind, flight: InFlight) -> Claim | None:
        """The claim stamped with this worker's definition of its run's agent, to run the step
        with; None when the step was handed on to a worker of the run's own (nothing of it is
        left here). DefinitionChangedError when the run cannot go on under this worker's."""
        agent = find_agent(claim.record.agent_name)
        if agent is None:  # the step fails as any step of an agent this worker does not define
            return claim
        own = describe(agent)
        flight.definition_hash = own.hash
        if claim.record.definition_hash == own.hash:
            return replace(claim, definition_hash=own.hash)
        return self._other(claim, kind, own)

    def _other(self, claim: Claim, kind: StepKind, own: Definition) -> Claim | None:
        """A claim of a run on another definition than this worker's (see the module docstring)."""
        record = claim.record
        served, live = None, False
        if record.accepted_definition != own.hash and record.definition_hash is not None:
            served, live = self._served(record.agent_name, record.definition_hash)
        calls = unanswered_calls(claim.messages) if kind == "tools" else []
        decided = {}
        if calls and served is not None and not live:
            paused = self.store.requirements.decided(record.run_id, [c.id for c in calls])
            decided = {call_id: held.requirement for call_id, held in paused.items()}
        verdict = deploys.decide(record, own, served, live=live, calls=calls, decided=decided)
        if verdict.action == "hand_on":
            assert served is not None
            self._hand_on(claim, kind, served, calls)
            return None
        if verdict.action == "refuse":
            assert record.definition_hash is not None
            raise deploys.refused(record, record.definition_hash, own.hash, verdict.changes)
        self.steps.durably(claim, lambda: self.store.definitions.adopt(claim, own.hash, why=verdict.why))
        was = (record.definition_hash or "none")[: deploys.SHORT]
        log.info(
            "run %s: goes on under definition %s (was %s: %s)",
            record.run_id,
            own.hash[: deploys.SHORT],
            was,
            verdict.why,
        )
        # The step keeps the run's row as claimed (its old definition), so that a tool step
        # still reads the decisions stored for its calls before the deploy (`pausing.sort`).
        return replace(claim, definition_hash=own.hash)

    def _served(self, name: str, definition_hash: str) -> tuple[Definition | None, bool]:
        """The run's definition as the catalog holds it (None: no worker ever served it), and
        whether a worker of it is live."""
        row = next((r for r in self.store.catalog.read(name) if r.definition_hash == definition_hash), None)
        if row is None:
            return None, False
        entry = entry_of(row, now=self.store.clock(), window=live_seconds(self.steps.settings))
        return entry.definition, entry.live

    def _hand_on(self, claim: Claim, kind: StepKind, served: Definition, calls: list[ToolCall]) -> None:
        """Give the step back to the queue for a worker of the run's definition `served`."""
        settings = self.steps.settings
        record = self.steps.durably(
            claim,
            lambda: self.store.definitions.hand_on(claim, to=served.hash, publish_grace=settings.publish_grace_seconds),
        )
        self.steps.end(claim)
        queue = queue_for(served, kind, lambda: calls)
        log.info(
            "run %s step %s: handed on to a worker of definition %s",
            record.run_id,
            record.seq,
            served.hash[: deploys.SHORT],
        )
        step = StepRef(run_id=record.run_id, seq=record.seq, kind=kind, queue=queue, priority=record.priority)
        self.steps.publish(replace(step, definition=served.hash))
