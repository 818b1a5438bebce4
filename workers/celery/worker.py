"""The worker program: Celery's `celery worker`, with the agents' modules imported first.

A worker finds agents by name, so it must import the modules that define them before it takes a
step. They are Celery's own `imports` (`workers.celery.app.create_app` sets them from RATCHET_APP, and
`ratchet worker --app` from its flags), which Celery imports in the worker's main process before
its pool starts: every prefork child, a child that `--max-tasks-per-child` replaces included, is
forked with them (and imports them again, a no-op, where a pool does not fork). This class makes
a missing or broken module a one-line error at start instead of every run going to ERROR with
AgentNotFoundError, and names the queues the agents route to that the worker does not consume.

Both `celery -A workers.celery.app worker ...` (any Celery flag) and `ratchet worker` run it.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from celery.apps.worker import Worker as CeleryWorker

from orchestrator.errors import ConfigurationError
from orchestrator.routing import named_queues
from workers.celery.app import NO_AGENT_MODULES, import_agent_modules

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
                ", ".join(missing), ",".join(missing),
            )  # fmt: skip
