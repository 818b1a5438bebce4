"""Where the task events of a threads-pool worker on Redis go out: Celery's event loop would send
its buffer after every step, as the next one starts; `workers.celery.task_events` sends it from a thread of
its own every INTERVAL. (That they reach a monitor, in order and in batches: test_native_workers.)"""

from __future__ import annotations

import threading

import pytest

from workers.celery.embedded import EmbeddedWorker
from workers.celery.task_events import BUFFER_LIMIT

pytestmark = pytest.mark.redis


def test_a_threads_worker_on_redis_sends_its_task_events_from_its_own_thread_not_its_event_loop(
    worker: EmbeddedWorker,
) -> None:
    consumer = worker.worker.consumer
    dispatcher = consumer.event_dispatcher
    assert consumer.hub is not None  # Redis: Celery's event loop runs, and would send the events
    assert dispatcher.buffer_group == frozenset({"task"}) and dispatcher.buffer_limit == BUFFER_LIMIT
    assert dispatcher.on_send_buffered is None  # nothing scheduled on the loop after each step
    assert "ratchet-task-events" in [t.name for t in threading.enumerate()]
