"""Task events (for Flower) sent from a thread of their own, off the path of the steps.

A worker sends three task events per step (received, started, succeeded). On the prefork pool
Celery buffers them and its event loop sends them in batches; on the threads and gevent pools it
has no event loop, so each event is a Redis PUBLISH made where it happens: in the consumer before
the step is handed to the pool, and in the pool thread before the step starts. That is two
round trips on the path from one step's publish to the next step's start.

`BackgroundTaskEvents` turns on Celery's own buffering of the `task` group on those pools and
sends the buffer from a thread of its own, woken by each event: the events reach Flower in the
same order, as batches (`task.multi`, as the prefork pool sends them), milliseconds later. What is
buffered when the consumer stops is sent then, before Celery closes the dispatcher.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import bootsteps

log = logging.getLogger("ratchet.events")


class BackgroundTaskEvents(bootsteps.StartStopStep):  # type: ignore[misc]
    """A consumer step: the dispatcher's task events go out from a flusher thread."""

    requires = ("celery.worker.consumer.events:Events",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._dispatcher: Any = None

    def start(self, c: Any) -> None:
        dispatcher = c.event_dispatcher
        # The prefork pool's event loop buffers and sends them already (`c.hub`).
        if dispatcher is None or not dispatcher.enabled or c.hub is not None:
            return
        dispatcher.buffer_group = frozenset({"task"})
        dispatcher.on_send_buffered = self._wake.set
        self._dispatcher = dispatcher
        self._stop.clear()
        self._thread = threading.Thread(target=self._send, name="ratchet-task-events", daemon=True)
        self._thread.start()

    def stop(self, c: Any) -> None:
        thread, dispatcher = self._thread, self._dispatcher
        if thread is None:
            return
        self._stop.set()
        self._wake.set()
        thread.join(timeout=5)
        self._thread = self._dispatcher = None
        # What the thread had not sent yet; later events (none: the consumer is stopping) would
        # wait in the buffer for the dispatcher's next flush.
        self._flush(dispatcher)

    shutdown = stop

    def _send(self) -> None:
        dispatcher = self._dispatcher
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            self._flush(dispatcher)

    @staticmethod
    def _flush(dispatcher: Any) -> None:
        # A publish that fails is kept in the dispatcher's outbound buffer (buffer_while_offline)
        # and sent again by the next flush; nothing here may end the thread.
        try:
            dispatcher.flush(errors=True, groups=True)
        except Exception:
            log.exception("could not send task events; they are sent with the next ones")
