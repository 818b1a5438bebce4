"""`webhook` from each producer but Python's (tests/unit/test_webhooks_inline.py): the HTTP API's
start body and its GET /runs/{run_id}/webhooks, and `ratchet run --webhook` then `ratchet sweep`,
on the in-memory dispatcher and a real receiver. The task by name runs on a real worker in
tests/integration/test_webhooks_worker.py."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from orchestrator import Agent
from orchestrator.testing import InMemoryDispatcher, in_memory
from orchestrator.webhooks import verify
from tests.support import CountingModel
from tests.webhook_support import SECRET, Receiver, hook_settings, receiving
from workers.api.routes import create_app
from workers.cli.commands import main


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with receiving() as r:
        yield r


@pytest.fixture
def hooked(tmp_path: Path) -> Iterator[InMemoryDispatcher]:
    with in_memory(hook_settings(f"sqlite:///{tmp_path / 'runs.db'}")) as dispatcher:
        yield dispatcher


def call(hooked: InMemoryDispatcher, method: str, path: str, **kwargs: Any) -> httpx.Response:
    app = create_app(hooked.settings, client=hooked.client)

    async def send() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as http:
            return await http.request(method, path, **kwargs)

    return asyncio.run(send())


def test_the_api_starts_a_run_with_a_webhook_and_lists_its_deliveries(
    hooked: InMemoryDispatcher, receiver: Receiver
) -> None:
    name = f"hooks-api-{uuid.uuid4().hex[:6]}"
    Agent(name=name, model=CountingModel())
    started = call(hooked, "POST", "/runs", json={"agent": name, "input": "hi", "webhook": receiver.url})
    assert started.status_code == 202, started.text
    run_id = started.json()["run_id"]
    hooked.sweep()

    listed = call(hooked, "GET", f"/runs/{run_id}/webhooks")
    assert listed.status_code == 200
    [shown] = listed.json()
    assert (shown["run_status"], shown["state"], shown["url"]) == ("COMPLETED", "delivered", receiver.url)
    [(headers, body)] = receiver.requests
    assert verify(SECRET, body, headers["Ratchet-Signature"]) and json.loads(body)["run"]["run_id"] == run_id

    refused = call(hooked, "POST", "/runs", json={"agent": name, "input": "hi", "webhook": "http://169.254.169.254/"})
    assert refused.status_code == 422 and "RATCHET_WEBHOOK_ALLOW" in refused.text
    assert call(hooked, "GET", "/runs/no-such-run/webhooks").status_code == 404


def test_ratchet_run_webhook_then_ratchet_sweep_delivers_it(
    hooked: InMemoryDispatcher, receiver: Receiver, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {
        "RATCHET_DATABASE_URL": hooked.settings.database_url,
        "RATCHET_DISPATCHER": "orchestrator.testing:InMemoryDispatcher",
        "RATCHET_WEBHOOK_SECRET": SECRET,
        "RATCHET_WEBHOOK_ALLOW": "127.0.0.1",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    name = f"hooks-cli-{uuid.uuid4().hex[:6]}"
    Agent(name=name, model=CountingModel())

    assert main(["run", name, "hello", "--webhook", receiver.url, "--json"]) == 0
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    assert main(["sweep"]) == 0

    assert [json.loads(b)["run"]["run_id"] for _, b in receiver.requests] == [run_id]
    assert main(["run", name, "hello", "--webhook", "http://10.0.0.1/"]) == 2
    assert "not a public address" in capsys.readouterr().err
