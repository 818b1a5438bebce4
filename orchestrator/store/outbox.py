"""The outbox marker: when the sweeper publishes a QUEUED run's step (`ratchet_runs.publish_after`).

A write that leaves a run QUEUED is followed by a publish of its step, by the writer or by the
sweeper. The writer can die in between, or the broker can lose the message, so the row itself
says when the sweeper must publish the step if no worker has claimed it by then. Every write of
the marker takes its value from `due_at`, in one vocabulary:

- `publish_grace`: the writer publishes the step itself; the sweeper steps in only if no worker
  claimed it within that many seconds (a publish that was lost, a writer that died).
- `publish_grace=None`: the writer does not publish it (a retry parked longer than a countdown may
  safely wait; a publish that failed): the sweeper publishes it as soon as it is due.
- `delay`: the step may not run before then (a retry's backoff); the marker counts from its end.
- `waiting`: the run waits for its turn among its session's runs (`serialize_session_runs`,
  `store/turns.py`): no marker, so the sweeper does not publish it while the runs ahead of it
  go on; the stop of the last of them marks it (the run ahead holds `wakes_session`, which the
  sweeper reads should the one who stopped it die first).

Any other status has no step to publish: its marker is cleared. The sweeper reads the marker only
on QUEUED rows, so the claim (QUEUED -> RUNNING, the hottest statement) leaves it as it was.
"""

from __future__ import annotations

from orchestrator.status import RunStatus


def due_at(
    status: RunStatus, now: float, *, publish_grace: float | None, delay: float = 0.0, waiting: bool = False
) -> float | None:
    """The marker a write that leaves the run in `status` at `now` stores (see above)."""
    if status != RunStatus.QUEUED or waiting:
        return None
    return now + delay + (publish_grace or 0.0)
