"""`CeleryDispatcher`: the broker port implemented with Celery's `send_task`.

Only `(run_id, seq)` crosses the broker. Each publish gets a fresh task id that starts with the
run id, so Flower shows every delivery of a step (`<run_id>.<seq>.<kind>.<nonce>`).

A step goes to the queue its agent or tool names (`orchestrator.routing`), else to the default
queue of its kind, with its run's priority (0-9, higher first, on Redis as on RabbitMQ: see
`workers.broker`). A step its publisher could not route carries `reroute=True`, and the worker
that takes it sends it on (`StepRunner.reroute`).
"""

from __future__ import annotations

import uuid

from celery import Celery

from orchestrator.ports import StepRef
from orchestrator.settings import Settings
from workers.app import MODEL_TASK, TOOLS_TASK, create_app

_TASKS = {"model": MODEL_TASK, "tools": TOOLS_TASK}


class CeleryDispatcher:
    """Publishes steps as Celery tasks."""

    def __init__(self, settings: Settings, app: Celery | None = None) -> None:
        self.settings = settings
        self.app = app or create_app(settings)
        self._queues = {"model": settings.model_queue, "tools": settings.tools_queue}

    def publish(self, step: StepRef) -> None:
        """Send the step's task; raises if the broker cannot take it (after kombu's short retry).

        Bounded: at most three attempts, each bounded by the broker's socket timeouts
        (`workers.app.BROKER_SOCKET_TIMEOUT`), so a broker that does not answer fails the publish
        in seconds; the run's outbox marker lets the sweeper publish it later."""
        self.app.send_task(
            _TASKS[step.kind],
            args=[step.run_id, step.seq],
            kwargs=None if step.routed else {"reroute": True},
            queue=step.queue or self._queues[step.kind],
            priority=step.priority,
            task_id=f"{step.run_id}.{step.seq}.{step.kind}.{uuid.uuid4().hex[:8]}",
            countdown=step.countdown,
            retry=True,
            retry_policy={"max_retries": 2, "interval_start": 0, "interval_step": 0.25, "interval_max": 0.5},
        )
