"""A run's events over the HTTP API as server-sent events, from a `ratchet api` subprocess, with
a real worker on SQLite and PostgreSQL: a client that disconnects and reconnects with
Last-Event-ID gets exactly the events it missed, and a streamed run's deltas add up to its
answer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

import tests.integration.api_agents  # noqa: F401  (the embedded worker runs its agent)
from orchestrator.events import MAX_PART
from orchestrator.settings import Settings
from tests.conftest import make_settings
from tests.integration.test_api import JSON, ApiServer, error_of, start_api
from workers.celery.embedded import EmbeddedWorker

AGENT = "api-streamer"


@dataclass(frozen=True)
class Sse:
    """One server-sent event as it came over the wire."""

    id: str
    event: str
    data: dict[str, Any]


def read_events(http: httpx.Client, path: str, *, limit: int | None = None, **kwargs: Any) -> list[Sse]:
    """The events of an SSE response, until the server ends it or `limit` came (then hang up)."""
    events: list[Sse] = []
    with http.stream("GET", path, **kwargs) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        fields: dict[str, str] = {}
        for line in response.iter_lines():
            if line.startswith(":"):  # a keep-alive comment
                continue
            if line:
                name, _, value = line.partition(": ")
                fields[name] = value
                continue
            if fields:
                events.append(Sse(id=fields["id"], event=fields["event"], data=json.loads(fields["data"])))
                fields = {}
            if limit is not None and len(events) >= limit:
                break
    return events


@pytest.fixture
def api_settings(db_url: str, redis_url: str) -> Settings:
    return make_settings(db_url, redis_url)


@pytest.fixture
def api(api_settings: Settings, tmp_path: Path) -> Iterator[ApiServer]:
    server = start_api(api_settings, tmp_path / "api.log", app="tests.integration.api_agents")
    yield server
    server.stop()


def test_a_client_that_reconnects_with_last_event_id_gets_exactly_what_it_missed(
    api: ApiServer, api_settings: Settings
) -> None:
    with api.client() as http:
        # Given a streamed run, and a reader that saw its first event and hung up
        started = http.post("/runs", json={"agent": AGENT, "input": "tell me about otters", "stream": True})
        assert started.status_code == 202, started.text
        run_id = started.json()["run_id"]
        seen = read_events(http, f"/runs/{run_id}/events", limit=1)
        assert [e.event for e in seen] == ["RunStarted"]

        # When the run goes on while it is away, and it reconnects with the last id it saw
        with EmbeddedWorker(api_settings):
            rest = read_events(http, f"/runs/{run_id}/events", headers={"Last-Event-ID": seen[-1].id})

        # Then it got the rest: no gap, no duplicate, in id order, to the end
        everything = read_events(http, f"/runs/{run_id}/events")
        assert seen + rest == everything
        keys = [tuple(map(int, e.id.split("-"))) for e in everything]
        assert keys == sorted(set(keys))
        assert everything[-1].event == "RunCompleted"
        assert {"ToolCallStarted", "ToolCallCompleted", "RunContent"} <= {e.event for e in everything}
        assert all(e.data["run_id"] == run_id and e.data["event"] == e.event for e in everything)

        # And the deltas add up to the answer the run committed
        run = http.get(f"/runs/{run_id}").json()
        assert "".join(e.data["content"] for e in everything if e.event == "RunContent") == run["content"]

        # ?after= resumes too, and a reconnecting client's Last-Event-ID wins over it
        assert read_events(http, f"/runs/{run_id}/events", params={"after": everything[0].id}) == everything[1:]
        last_two = read_events(
            http, f"/runs/{run_id}/events", params={"after": everything[0].id},
            headers={"Last-Event-ID": everything[-3].id},
        )  # fmt: skip
        assert last_two == everything[-2:]

        error_of(http.get(f"/runs/{run_id}/events", headers={"Last-Event-ID": "nonsense"}), 422, "InvalidInputError")

        # A client that saw the last event of the stopped run is told there is nothing more (an
        # EventSource stops reconnecting on 204)
        done = http.get(f"/runs/{run_id}/events", headers={"Last-Event-ID": everything[-1].id})
        assert done.status_code == 204 and done.content == b""


def test_an_event_id_past_what_the_columns_hold_is_a_422_and_one_at_the_limit_a_204(api: ApiServer) -> None:
    # No worker: the run is cancelled while QUEUED, so its stream has a known end
    with api.client() as http:
        run_id = http.post("/runs", json={"agent": AGENT, "input": "hello"}).json()["run_id"]
        assert http.post(f"/runs/{run_id}/cancel", headers=JSON).status_code == 200

        for after in ("999999999999999999-0-0-0", f"{MAX_PART + 1}-0-0-0"):
            refused = http.get(f"/runs/{run_id}/events", headers={"Last-Event-ID": after})
            assert f"a part over {MAX_PART}" in error_of(refused, 422, "InvalidInputError")["message"]
            error_of(http.get(f"/runs/{run_id}/events", params={"after": after}), 422, "InvalidInputError")
        done = http.get(f"/runs/{run_id}/events", headers={"Last-Event-ID": f"{MAX_PART}-{MAX_PART}-0-0"})
        assert done.status_code == 204, done.text
        # An empty Last-Event-ID is none (an EventSource that saw no id sends none): from the start
        assert [e.event for e in read_events(http, f"/runs/{run_id}/events", headers={"Last-Event-ID": ""})] == [
            "RunStarted", "RunCancelled",
        ]  # fmt: skip
    assert "Traceback" not in api.log.read_text()
