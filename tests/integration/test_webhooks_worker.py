"""A webhook on a real worker: a run started by the `ratchet.start_run` task by name with a
`webhook` kwarg, on PostgreSQL, is POSTed to a real receiver by the worker's own sweeper."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from celery import Celery

from orchestrator import Agent, Client, RunStatus
from orchestrator.errors import RunNotFoundError
from orchestrator.models import OpenAIChat
from orchestrator.settings import Settings
from orchestrator.testing.waiting import wait_until
from orchestrator.webhooks import verify
from tests.conftest import make_settings
from tests.webhook_support import SECRET, Receiver, receiving


@pytest.fixture
def settings(pg_url: str, redis_url: str) -> Settings:
    """The worker's settings (one database: one worker-backed test): signing, 127.0.0.1 allowed."""
    return make_settings(pg_url, redis_url, webhook_secret=SECRET, webhook_allow="127.0.0.1")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with receiving() as r:
        yield r


@pytest.mark.usefixtures("worker", "scripted")
def test_a_run_started_by_task_name_with_a_webhook_is_posted_by_the_workers_sweeper(
    settings: Settings, receiver: Receiver
) -> None:
    name = f"hooks-task-{uuid.uuid4().hex[:6]}"
    Agent(name=name, model=OpenAIChat(id="gpt-4o-mini"), instructions="Be brief.")
    producer = Celery(broker=settings.broker_url, set_as_current=False)
    producer.conf.task_serializer = "json"
    run_id = str(uuid.uuid4())

    producer.send_task(
        "ratchet.start_run", args=[name, "hello"], kwargs={"run_id": run_id, "webhook": receiver.url},
        queue=settings.control_queue,
    )  # fmt: skip

    client = Client(settings)
    wait_until(lambda: client.get_run(run_id), 30, what="the run to be written", ignore=(RunNotFoundError,))
    assert client.wait(run_id, timeout=30).status == RunStatus.COMPLETED
    wait_until(lambda: receiver.requests, 30, what="the worker's sweeper to deliver the webhook")
    [(headers, body)] = receiver.requests
    assert verify(SECRET, body, headers["Ratchet-Signature"])
    assert json.loads(body)["run"] == json.loads(body)["run"] | {"run_id": run_id, "status": "COMPLETED"}
    # The receiver holds the request before the sweeper records the delivery: wait for the record.
    wait_until(
        lambda: [d.state for d in client.webhook_deliveries(run_id)] == ["delivered"],
        30,
        what="the sweeper to record the delivery",
    )
    [shown] = client.webhook_deliveries(run_id)
    assert shown.delivery_id == headers["Ratchet-Delivery"]
