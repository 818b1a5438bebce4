"""Task events (for Flower) sent from a thread of their own, in batches, off the steps' way.

A worker sends three task events per step (received, started, succeeded). Where the steps run in
the worker's own process (the threads, gevent, eventlet and solo pools), whatever sends them
takes the interpreter from the steps: without an event loop (gevent, the filesystem broker)
Celery publishes each one where it happens, a broker round trip before the step is handed to the
pool and another before it starts; with one (threads on Redis) its loop publishes the buffer
after every step, right as the next one starts.

`BackgroundTaskEvents` turns on Celery's own buffering of the `task` group and sends the buffer
from a thread every `INTERVAL` seconds: the same events, in the same order, as `task.multi`
batches (as the prefork pool sends them), at most that much later, one publish for every step of
that time. What is buffered when the consumer stops is sent then, before Celery closes the
dispatcher. A worker killed outright loses its last unsent events: they are for monitoring only.

Left to Celery: the prefork pool (events are sent by the main process, not where steps run) and
a broker with heartbeats on the event loop (RabbitMQ), whose connection is not the thread's to use.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import bootsteps
from celery.concurrency.prefork import TaskPool as PreforkPool

log = logging.getLogger("ratchet.events")

#: Seconds between sends of the buffered task events.
INTERVAL = 0.2
#: Events held before a step sends them itself (Celery's default is 24): the thread sends them
#: well before, unless a worker runs more than this many steps in `INTERVAL`.
BUFFER_LIMIT = 1000


class BackgroundTaskEvents(bootsteps.StartStopStep):  # type: ignore[misc]
    """A consumer step: the dispatcher's task events go out from a sender thread."""

    requires = ("celery.worker.consumer.events:Events",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        self._stop = threading.Event()  # each thread gets its own (`start`)
        self._thread: threading.Thread | None = None
        self._dispatcher: Any = None

    def start(self, c: Any) -> None:
        dispatcher = c.event_dispatcher
        if dispatcher is None or not dispatcher.enabled or isinstance(c.pool, PreforkPool):
            return
        if c.hub is not None and c.amqheartbeat and dispatcher.connection.supports_heartbeats:
            return  # the loop reads this connection's heartbeats: publishing beside it is not safe
        dispatcher.buffer_group = frozenset({"task"})
        dispatcher.buffer_limit = BUFFER_LIMIT
        dispatcher.on_send_buffered = None  # not after every step: the thread sends them
        self._dispatcher = dispatcher
        # A new event: a thread an earlier stop gave up waiting for (stuck in a publish) stays stopped
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._send, args=(dispatcher, self._stop), name="ratchet-task-events", daemon=True
        )
        self._thread.start()

    def stop(self, c: Any) -> None:
        thread, dispatcher = self._thread, self._dispatcher
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout=5)
        self._thread = self._dispatcher = None
        self._flush(dispatcher)  # what the thread had not sent yet

    shutdown = stop

    @classmethod
    def _send(cls, dispatcher: Any, stop: threading.Event) -> None:
        while not stop.wait(INTERVAL):
            cls._flush(dispatcher)

    @staticmethod
    def _flush(dispatcher: Any) -> None:
        # A publish that fails is kept in the dispatcher's outbound buffer (buffer_while_offline)
        # and sent again by the next flush; nothing here may end the thread.
        try:
            dispatcher.flush(errors=True, groups=True)
        except Exception:
            log.exception("could not send task events; they are sent with the next ones")
