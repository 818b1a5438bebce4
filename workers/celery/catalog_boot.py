"""A worker writes the agents it serves into the agent catalog when it starts consuming.

`CatalogStep` is a consumer step (`create_app` adds it): when the consumer starts, it writes the
definitions of every agent and team the worker's modules define (`orchestrator.catalog`), and
then marks them seen every RATCHET_CATALOG_SEEN_SECONDS from a thread of its own until the
consumer stops. It runs in the worker's main process (for a prefork pool, before its children
take steps), the same for `ratchet worker`, `celery -A workers.celery.app worker` and the
embedded worker. Producers that do not import the agents route their runs by it.
"""

from __future__ import annotations

from typing import Any

from celery import bootsteps

from orchestrator import runtime
from orchestrator.catalog import CatalogKeeper
from orchestrator.settings import Settings


class CatalogStep(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery is untyped
    """A consumer step: the worker's agents in the catalog, marked seen while it consumes."""

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        self._keeper: CatalogKeeper | None = None

    def start(self, c: Any) -> None:
        settings: Settings = c.app.ratchet_settings
        self._keeper = CatalogKeeper(lambda: runtime.open_store(settings), settings).start()

    def stop(self, c: Any) -> None:
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.stop()

    shutdown = stop
