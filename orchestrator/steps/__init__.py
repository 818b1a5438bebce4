"""The step engine: what one task does to a run. No Celery here; `workers.celery.tasks` calls it.

- `runner`: `StepRunner`, the step protocol (claim, durable commit, publish, abort, the failure
  handler's flush) applied to every step a process runs.
- `model`: `ModelStep`, one model call and the commit of its reply, as stages run in order.
- `admission`: its limiter stage (`orchestrator.limits`): the verdict, the park, the release.
- `context`: `StepContext`, what the runner gives a step object (settings, store, its protocol).
- `live`: the live events of a streamed run's step.
- `tools`: `ToolStep`, a batch of tool calls run concurrently, at most once where a tool asks.
- `inflight`: what each held step built but has not committed (the failure handler flushes it)
  and the claims the lease heartbeat renews.
- `versions`: which definition a claimed step runs on, across a deploy (`orchestrator.deploys`).
"""

from orchestrator.steps.runner import StepRunner

__all__ = ["StepRunner"]
