"""The in-flight registry: the steps this process holds a claim on, and what each built but has
not committed.

Two readers besides the step itself: the failure handler (`StepRunner.fail_step`) takes a failed
step's entry and flushes its messages onto the run's ERROR row; the lease heartbeat
(`orchestrator.heartbeat`) renews the lease of every entry while the step runs.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from orchestrator.messages import Message
from orchestrator.state import StateChange
from orchestrator.store import Claim


@dataclass
class InFlight:
    """What a step built but has not committed: flushed onto the ERROR row if the step fails.
    Also the claim the heartbeat renews while the step runs (`orchestrator.heartbeat`)."""

    epoch: int
    run_id: str = ""
    #: The claim's owner, as stored in the run's `lease_owner`.
    owner: str = ""
    claimed_at: float = 0.0
    #: False once the heartbeat found the claim lost or the step past its hard time limit.
    renewing: bool = True
    #: Odd while the step moves its claim to a new epoch (a fallback: `steps.fallbacks`), and
    #: bumped again once `epoch` is the new one: a renewal sent meanwhile may name the old epoch,
    #: and its failure does not mean the claim was lost.
    moves: int = 0
    system_message: str | None = None
    messages: list[Message] = field(default_factory=list)
    #: What each tool call (by id) changed in the session's state: committed with its result,
    #: or flushed with it (`orchestrator.state`).
    state_changes: dict[str, StateChange] = field(default_factory=dict)
    #: The step's own exception: Celery hands the failure handler a copy rebuilt from JSON,
    #: which loses the error's attributes.
    error: BaseException | None = None
    #: The definition of the run's agent this worker serves (`steps.versions`): logged with
    #: the step's error if it fails.
    definition_hash: str | None = None

    def changes_of(self, results: list[Message]) -> list[StateChange]:
        """What the calls whose `results` these are changed in the session's state, in order."""
        return [self.state_changes[m.tool_call_id] for m in results if m.tool_call_id in self.state_changes]


class InFlightSteps:
    """The `InFlight` of every step this process holds. Thread-safe: the heartbeat reads it from
    its own thread, and an embedded worker may run several steps at once."""

    def __init__(self) -> None:
        # Keyed by the claim's owner (host, pid, task id), not by (run_id, seq): under the threads
        # pool one process may hold a stale and a live attempt of the same step at once.
        self._steps: dict[str, InFlight] = {}
        self._lock = threading.Lock()

    def begin(self, claim: Claim) -> InFlight:
        """Register a step that has just taken its claim."""
        held = claim.record
        flight = InFlight(
            epoch=claim.epoch, run_id=claim.run_id, owner=held.lease_owner or "", claimed_at=held.updated_at
        )
        with self._lock:
            self._steps[flight.owner] = flight
        return flight

    def end(self, claim: Claim) -> None:
        """Forget a step that committed (or was fenced): nothing of it is left to flush."""
        with self._lock:
            self._steps.pop(claim.record.lease_owner or "", None)

    def take(self, owner: str) -> InFlight | None:
        """Remove and return the step of this claim owner, if it is still held (the failure handler)."""
        with self._lock:
            return self._steps.pop(owner, None)

    def held(self) -> list[InFlight]:
        """The steps this process holds a claim on now (what the heartbeat renews)."""
        with self._lock:
            return list(self._steps.values())
