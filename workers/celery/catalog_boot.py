"""A worker writes the agents it serves into the agent catalog when it starts consuming.

`CatalogStep` is a consumer step (`create_app` adds it): when the consumer starts, it writes the
definitions of every agent and team the worker's modules define (`orchestrator.catalog`), and
then marks them seen every RATCHET_CATALOG_SEEN_SECONDS from a thread of its own until the
consumer stops. It runs in the worker's main process (for a prefork pool, before its children
take steps), the same for `ratchet worker`, `celery -A workers.celery.app worker` and the
embedded worker. Producers that do not import the agents route their runs by it.

Across a deploy (`orchestrator.deploys`), a worker of one definition hands the steps of a run of
another on to a version queue of that definition. A worker consumes the version queues of its
own definitions from the first time it marks the catalog seen while another definition of one
of its agents is live (workers of two versions side by side), and until it stops: only then,
since a queue consumed is one more key every fetch of a step asks Redis for (ten, with its
priority lists). A step handed on before a worker of that definition saw the rival waits on the
queue until it does, within RATCHET_CATALOG_SEEN_SECONDS.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps

from orchestrator import runtime
from orchestrator.agent import registered
from orchestrator.catalog import CatalogKeeper, Definition
from orchestrator.settings import Settings
from workers.celery.dispatch import version_queues

log = logging.getLogger("ratchet.worker")


class CatalogStep(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery is untyped
    """A consumer step: the worker's agents in the catalog, marked seen while it consumes."""

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        self._keeper: CatalogKeeper | None = None
        #: The version queues this worker consumes (added once, kept until it stops).
        self.versions: set[str] = set()

    def start(self, c: Any) -> None:
        settings: Settings = c.app.ratchet_settings
        queues = c.app.amqp.queues
        consumed = set(queues.consume_from or queues)  # read here, in the consumer's thread
        self._keeper = CatalogKeeper(
            lambda: runtime.open_store(settings), settings, rivals=lambda found: self._consume(c, consumed, found)
        ).start()

    def _consume(self, c: Any, consumed: set[str], contested: list[Definition]) -> None:
        """Consume the version queues of the `contested` definitions (from the keeper's thread: the
        consumer adds each queue in its own, as Celery's `add_consumer` control command does)."""
        names = {d.name for d in contested}
        agents = [a for a in registered() if a.name in names]
        for name in sorted(version_queues(c.app.ratchet_settings, consumed, agents) - self.versions):
            self.versions.add(name)
            log.info("another definition of an agent this worker serves is live: consuming %s", name)
            c.call_soon(c.add_task_queue, name, exchange=name, routing_key=name)

    def stop(self, c: Any) -> None:
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.stop()

    shutdown = stop
