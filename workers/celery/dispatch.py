"""`CeleryDispatcher`: the broker port implemented with Celery's `send_task`.

Only `(run_id, seq)` crosses the broker. Each publish gets a fresh task id that starts with the
run id, so Flower shows every delivery of a step (`<run_id>.<seq>.<kind>.<nonce>`).

A step goes to the queue its agent or tool names (`orchestrator.routing`), else to the default
queue of its kind, with its run's priority (0-9, higher first, on Redis as on RabbitMQ: on Redis
written as kombu orders it, `workers.celery.broker.message_priority`). A step its publisher could
not route carries `reroute=True`, and the worker that takes it sends it on (`StepRunner.reroute`).

A step handed on to the workers of one definition of its agent (`StepRef.definition`, during a
deploy: `orchestrator.deploys`) goes to that queue's version queue, `<queue>@<16 hex digits of
the hash>`, which only the workers serving that definition consume (`version_queues`), from when
they see another definition of the agent live (`workers.celery.catalog_boot`).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable
from contextlib import suppress
from typing import Any

from celery import Celery

from orchestrator import tracing
from orchestrator.agent import AgentDefinition
from orchestrator.catalog import describe
from orchestrator.ports import StepRef
from orchestrator.routing import named_queues
from orchestrator.settings import Settings
from workers.celery.app import MODEL_TASK, TOOLS_TASK, create_app
from workers.celery.broker import message_priority

_TASKS = {"model": MODEL_TASK, "tools": TOOLS_TASK}
#: How many hex digits of a definition hash name its version queues.
VERSION_DIGITS = 16


def version_queue(queue: str, definition_hash: str) -> str:
    """The queue of the steps of `queue` handed on to the workers of one definition."""
    return f"{queue}@{definition_hash[:VERSION_DIGITS]}"


def version_queues(settings: Settings, consumed: Collection[str], agents: Iterable[AgentDefinition]) -> set[str]:
    """The version queues of `agents`' definitions a worker consuming `consumed` takes the
    steps handed on to them from: for each agent, the version queue of each of those queues its
    steps go to."""
    found: set[str] = set()
    for agent in agents:
        bases = {agent.queue or settings.model_queue, agent.queue or settings.tools_queue, agent.tool_queue}
        found.update(version_queue(q, describe(agent).hash) for q in bases if q is not None and q in consumed)
    return found


class CeleryDispatcher:
    """Publishes steps as Celery tasks."""

    def __init__(self, settings: Settings, app: Celery | None = None) -> None:
        self.settings = settings
        self.app = app or create_app(settings)
        self._queues = {"model": settings.model_queue, "tools": settings.tools_queue}

    def queue_lengths(self) -> dict[str, int]:
        """Messages waiting in the model, tools and control queues and in every queue the agents
        of this process name (on Redis with the priority lists kombu keeps beside a queue; not
        those delivered to a worker and not yet acked): a passive declare of each, which every
        kombu transport answers. A queue the broker does not know (never declared, or on Redis
        empty) holds nothing. Raises if the broker cannot be reached (bounded by its connection
        and socket timeouts)."""
        defaults = {self.settings.model_queue, self.settings.tools_queue, self.settings.control_queue}
        names = sorted(defaults | named_queues())
        lengths: dict[str, int] = {}
        with self.app.connection_for_read() as conn:
            # One more try at once, not kombu's default two seconds later: a scrape waits on it.
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0)
            for name in names:
                channel = conn.channel()
                try:
                    lengths[name] = int(channel.queue_declare(queue=name, passive=True).message_count)
                except conn.channel_errors:  # AMQP closes the channel: a new one for the next queue
                    lengths[name] = 0
                finally:
                    with suppress(*conn.channel_errors, *conn.connection_errors):
                        channel.close()
        return lengths

    def _queue_of(self, step: StepRef) -> str:
        queue = step.queue or self._queues[step.kind]
        return queue if step.definition is None else version_queue(queue, step.definition)

    def publish(self, step: StepRef) -> None:
        """Send the step's task; raises if the broker cannot take it (after kombu's short retry).

        Bounded: at most three attempts, each bounded by the broker's socket timeouts
        (`workers.celery.app.BROKER_SOCKET_TIMEOUT`), so a broker that does not answer fails the publish
        in seconds; the run's outbox marker lets the sweeper publish it later."""
        headers: dict[str, Any] = {}
        # Traced: the run's span is current for the publish, and its context goes in the headers
        # (OpenTelemetry's Celery instrumentation, where it is on, replaces it with its own span's).
        with tracing.publishing(step.run_id, step.trace_context, headers):
            self.app.send_task(
                _TASKS[step.kind],
                args=[step.run_id, step.seq],
                kwargs=None if step.routed else {"reroute": True},
                queue=self._queue_of(step),
                priority=message_priority(self.settings.broker_url, step.priority),
                task_id=f"{step.run_id}.{step.seq}.{step.kind}.{uuid.uuid4().hex[:8]}",
                countdown=step.countdown,
                retry=True,
                retry_policy={"max_retries": 2, "interval_start": 0, "interval_step": 0.25, "interval_max": 0.5},
                headers=headers or None,
            )
