"""The Celery app and its settings: Celery delivers each step at least once, the database decides.

JSON only; acks_late with reject_on_worker_lost so a killed worker's message comes back;
prefetch 1; task events on for Flower (RATCHET_TASK_EVENTS); model calls, tool
batches and control on separate queues (a plain `celery worker` consumes all three), and the
queues agents and tools name for their own steps (`orchestrator.routing`); priorities 0-9, higher
first, on Redis and RabbitMQ; time limits under the visibility timeout (see
`orchestrator.settings`). No result backend: the run store is the only source of truth.

Every worker runs the sweeper in its main process (`workers.celery.worker.SweeperStep`, one of the
fleet at a time: `orchestrator.sweeping`); `beat_schedule` sends `ratchet.sweep` every
RATCHET_SWEEP_SECONDS too, for a deployment that runs `ratchet beat` instead.

The agents' modules (RATCHET_APP) are Celery's `imports`, so `celery -A workers.celery.app worker`
imports them as `ratchet worker --app` does (`workers.celery.worker`).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import worker_process_init, worker_process_shutdown
from kombu.entity import Exchange, Queue

from orchestrator import runtime, tracing
from orchestrator.errors import ConfigurationError
from orchestrator.settings import Settings
from orchestrator.store import forget_stores
from orchestrator.validation import PRIORITY_MAX
from workers.celery.broker import FILESYSTEM_TRANSPORT, PRIORITY_STEPS, REDIS_SCHEMES, message_priority
from workers.celery.broker import TRANSPORT as BROKER_TRANSPORT
from workers.celery.task_events import BackgroundTaskEvents

MODEL_TASK = "ratchet.model_call"
TOOLS_TASK = "ratchet.tool_batch"
START_TASK = "ratchet.start_run"
CONTINUE_TASK = "ratchet.continue_run"
SWEEP_TASK = "ratchet.sweep"
#: The worker step that runs the sweeper (`workers.celery.worker.SweeperStep`).
SWEEPER_STEP = "workers.celery.worker:SweeperStep"
#: Seconds a Redis broker may take to answer one command, and to accept a connection. A live
#: Redis answers in milliseconds; these bound how long a silent one holds a producer.
BROKER_SOCKET_TIMEOUT = 3.0
BROKER_CONNECT_TIMEOUT = 3.0
NO_AGENT_MODULES = (
    "no agent modules to import: set RATCHET_APP to the module(s) that define your agents, comma-separated "
    "(e.g. RATCHET_APP=myproject.agents celery -A workers.celery.app worker), or pass --app MODULE to ratchet worker"
)
#: The modules `import_agent_modules` imported in this process (a pool process imports them again).
_agent_modules: list[str] = []


class RatchetCelery(Celery):  # type: ignore[misc]  # Celery is untyped
    """Celery with Ratchet's worker program (`workers.celery.worker.Worker`), loaded when first used."""

    @cached_property
    def Worker(self) -> Any:  # Celery's name
        return self.subclass_with_self("workers.celery.worker:Worker")


def create_app(settings: Settings | None = None) -> Celery:
    """A Celery app for these settings, with Ratchet's tasks registered on it."""
    settings = settings or Settings.from_env()
    tracing.stamp_log_records()  # the worker's boot lines and its sweeper's carry `trace_id` too
    app = RatchetCelery("ratchet", broker=settings.broker_url, set_as_current=False)
    app.conf.update(celery_config(settings))
    app.ratchet_settings = settings
    app.steps["consumer"].add(BackgroundTaskEvents)
    app.steps["consumer"].add("workers.celery.catalog_boot:CatalogStep")  # the agent catalog, written at boot
    # The sweeper, in the worker's main process (by name: the worker program imports this module)
    app.steps["worker"].add(SWEEPER_STEP)
    from workers.celery.tasks import register_tasks

    register_tasks(app)
    return app


def celery_config(settings: Settings) -> dict[str, Any]:
    """The Celery settings Ratchet runs with."""
    transport = _transport_options(settings)
    # A message published without a priority (beat's sweep; a start sent by name, by `send_task`
    # or Flower) is one of no priority: on Redis kombu's default, 0, is the list served first.
    unranked = message_priority(settings.broker_url, None)
    route = {} if unranked is None else {"priority": unranked}  # a priority the sender gives wins
    queues = {
        MODEL_TASK: {"queue": settings.model_queue, **route},
        TOOLS_TASK: {"queue": settings.tools_queue, **route},
        START_TASK: {"queue": settings.control_queue, **route},
        CONTINUE_TASK: {"queue": settings.control_queue, **route},
        SWEEP_TASK: {"queue": settings.control_queue, **route},
    }
    # Declared as Celery declares a queue it creates on first use (a direct exchange of the same
    # name): a worker started without -Q consumes all three.
    defaults = [settings.model_queue, settings.tools_queue, settings.control_queue]
    return {
        "imports": agent_modules(settings),
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_backend": None,
        "task_ignore_result": True,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_acks_on_failure_or_timeout": True,
        "worker_prefetch_multiplier": 1,
        # On for Flower; with RATCHET_TASK_EVENTS=false, only once a monitor asks (enable_events).
        "worker_send_task_events": settings.task_events,
        # Flower sees every task from the workers' events; a "sent" event from the publisher as
        # well costs a second Redis publish per step (0.25 ms of 0.6, measured by bench/).
        "task_send_sent_event": False,
        "task_track_started": False,
        "task_soft_time_limit": settings.soft_time_limit,
        "task_time_limit": settings.hard_time_limit,
        "task_routes": queues,
        "task_queues": [Queue(name, Exchange(name), routing_key=name) for name in defaults],  # type: ignore[no-untyped-call]
        "task_default_queue": settings.control_queue,
        # RabbitMQ: every queue is declared with x-max-priority, so a step's priority (0-9, higher
        # first) orders it; a queue declared earlier without it must be deleted first (RabbitMQ
        # refuses to change a queue's arguments). Redis: kombu's `priority_steps` (`workers.celery.broker`).
        "task_queue_max_priority": PRIORITY_MAX,
        "task_default_priority": unranked,  # a task of no route called without one; the routes: by name too
        "broker_transport_options": transport,
        # kombu's Redis transport with one publishing client per pool, not one per message.
        "broker_transport": _transport(settings.broker_url),
        "broker_connection_retry_on_startup": True,
        "broker_connection_retry": True,
        "broker_connection_max_retries": None,
        # A broker blip must not kill the steps in flight: they write to the database, not the
        # broker, and a redelivered copy of their message is dropped by the claim.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        "worker_hijack_root_logger": False,
        "worker_deduplicate_successful_tasks": False,
        "beat_schedule": {"ratchet-sweep": {"task": SWEEP_TASK, "schedule": settings.sweep_seconds}},
        # Records each sweep it sends, for `ratchet health --check beat` (`workers.celery.beat`).
        "beat_scheduler": "workers.celery.beat:Scheduler",
    }


def _transport(url: str) -> str | None:
    """Ratchet's own transport classes for the brokers it fixes (`workers.celery.broker`), else kombu's."""
    if url.startswith("redis://"):
        return BROKER_TRANSPORT
    return FILESYSTEM_TRANSPORT if url.startswith("filesystem://") else None


def _transport_options(settings: Settings) -> dict[str, Any]:
    """The broker transport's options: the filesystem broker's folders, Redis's priorities and timeouts."""
    transport: dict[str, Any] = {"visibility_timeout": settings.visibility_timeout}
    if settings.broker_url.startswith("filesystem://"):
        folder = Path(settings.broker_folder)
        for sub in ("queue", "processed", "control"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        transport = {
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "processed_folder": str(folder / "processed"),
            "control_folder": str(folder / "control"),
            "store_processed": False,
            "polling_interval": 0.05,
        }
    elif settings.broker_url.startswith(REDIS_SCHEMES):
        transport.update(
            {
                # One list per priority, the lowest served first (`workers.celery.broker.message_priority`).
                "priority_steps": PRIORITY_STEPS,
                "socket_keepalive": True,
                "health_check_interval": 25,
                # Without timeouts a broker that accepts connections and never answers blocks a
                # publish (and `Client.start`) forever. Consuming is unaffected: kombu sends BRPOP
                # with a 1 s server-side timeout and reads its reply only once the socket is
                # readable. A timed-out command is not retried by redis-py (that would double
                # the wait); the publisher's retry policy and the run's outbox marker cover it.
                "socket_timeout": BROKER_SOCKET_TIMEOUT,
                "socket_connect_timeout": BROKER_CONNECT_TIMEOUT,
                "retry_on_timeout": False,
            }
        )
    return transport


def agent_modules(settings: Settings) -> list[str]:
    """The modules RATCHET_APP names (comma-separated)."""
    return [m.strip() for m in (settings.app or "").split(",") if m.strip()]


def import_apps(given: Sequence[str]) -> list[str]:
    """Import the modules `--app` names, else those RATCHET_APP names; return their names."""
    modules = list(given) or agent_modules(Settings.from_env())
    import_agent_modules(modules)
    return modules


def import_agent_modules(modules: Sequence[str]) -> None:
    """Import the modules that define the agents, or ConfigurationError saying which failed. The
    working directory comes first on the path, as with `celery -A`: `--app agents` finds the
    `agents.py` beside you, where an installed script would look only where it is installed."""
    if modules and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ConfigurationError(
                f"cannot import --app {name!r} (or RATCHET_APP): {exc}; is it on PYTHONPATH, or in the folder "
                "the process starts in?"
            ) from None
        if name not in _agent_modules:
            _agent_modules.append(name)


@worker_process_init.connect
def _after_fork(**_: Any) -> None:
    # A prefork child must not reuse the parent's pooled database connections, nor a runtime
    # built on them.
    runtime.forget()
    forget_stores()
    # Forked with the agents' modules, which this finds imported; a pool that starts its
    # processes afresh (not by fork) imports them here.
    import_agent_modules(list(_agent_modules))


@worker_process_shutdown.connect
def _flush_traces(**_: Any) -> None:
    # A prefork child ends with os._exit, which runs no exit handler: spans a batch processor
    # still holds would be lost at every pool recycle and shutdown.
    tracing.flush()


app: Celery  # built on first access, below


def __getattr__(name: str) -> Any:
    # `celery -A workers.celery.app` and `ratchet worker` look up `app`; build it from the environment
    # only then, so importing this module for create_app() reads no settings.
    if name == "app":
        global app
        app = create_app()
        return app
    raise AttributeError(name)
