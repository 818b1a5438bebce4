"""The worker program: Celery's `celery worker`, with the agents' modules imported first.

A worker finds agents by name, so it must import the modules that define them before it takes a
step. They are Celery's own `imports` (`workers.celery.app.create_app` sets them from RATCHET_APP, and
`ratchet worker --app` from its flags), which Celery imports in the worker's main process before
its pool starts: every prefork child, a child that `--max-tasks-per-child` replaces included, is
forked with them (and imports them again, a no-op, where a pool does not fork). This class makes
a missing or broken module a one-line error at start instead of every run going to ERROR with
AgentNotFoundError, and names the queues the agents route to that the worker does not consume.

Both `celery -A workers.celery.app worker ...` (any Celery flag) and `ratchet worker` run it,
with `SweeperStep`: the sweeper, in the worker's main process (`orchestrator.sweeping`).
"""

from __future__ import annotations

import logging
import os
import sys
import uuid
from typing import Any

from celery import bootsteps
from celery.apps.worker import Worker as CeleryWorker

from orchestrator.errors import ConfigurationError
from orchestrator.routing import named_queues
from orchestrator.sweeping import SweeperThread
from workers.celery.app import NO_AGENT_MODULES, import_agent_modules
from workers.celery.tasks import runner_for

log = logging.getLogger("ratchet.worker")


class Worker(CeleryWorker):  # type: ignore[misc]  # Celery is untyped
    """`celery worker` that imports the agents' modules first and refuses to start without them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        try:
            modules = list(self.app.conf.imports or ())
            if not modules:
                raise ConfigurationError(NO_AGENT_MODULES)
            import_agent_modules(modules)
        except ConfigurationError as exc:
            print(f"ratchet: error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        super().__init__(*args, **kwargs)

    def setup_queues(self, include: Any, exclude: Any = None) -> None:
        super().setup_queues(include, exclude)
        queues = self.app.amqp.queues
        consumed = set(queues.consume_from or queues)
        missing = sorted(named_queues() - consumed)
        if missing:
            # Not an error: a worker of the default queues is meant to leave a GPU queue alone.
            log.warning(
                "the agents of this worker route steps to queue(s) %s, which it does not consume: those steps wait "
                "there for a worker started with -Q %s",
                ", ".join(missing),
                ",".join(missing),
            )


class SweeperStep(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery is untyped
    """A worker step: the fleet's sweeper in a thread of the worker's main process.

    A step of the worker, not of a pool process, so a prefork worker runs one sweeper, however
    many children it has; started after the pool, so the children fork before its thread opens
    the database. It sends no task and no task event: each pass runs here, not as `ratchet.sweep`.
    Left out with RATCHET_WORKER_SWEEPS=false, as where `ratchet beat` sends the sweep instead,
    or for a worker built with `without_sweeper=True` (`EmbeddedWorker(sweep=False)`). Its lease
    owner names the worker's node and process and a token of its own, so two workers under one
    node name still hold the lease apart."""

    label = "Sweeper"
    requires = ("celery.worker.components:Pool",)

    def __init__(self, w: Any, without_sweeper: bool = False, **kwargs: Any) -> None:
        super().__init__(w, **kwargs)
        settings = getattr(w.app, "ratchet_settings", None)
        self.enabled = bool(settings is not None and settings.worker_sweeps and not without_sweeper)
        if settings is not None and not settings.worker_sweeps:
            log.warning(
                "this worker does not sweep (RATCHET_WORKER_SWEEPS=false): run `ratchet beat`, or the runs of a "
                "worker that dies stay RUNNING and due steps are not published again"
            )
        self.thread: SweeperThread | None = None

    def start(self, w: Any) -> None:
        owner = f"{w.hostname[:200]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"  # within ratchet_leases.owner
        every = w.app.ratchet_settings.sweep_seconds
        self.thread = SweeperThread(lambda: runner_for(w.app), owner, every=every)
        self.thread.start()

    def stop(self, w: Any) -> None:
        if self.thread is not None:
            self.thread.stop()
            self.thread = None

    terminate = stop  # a cold shutdown: the pass in progress still ends first
