"""What the tokenless API refuses (`workers/api/loopback.py`): a request naming another host (DNS
rebinding), a page of another origin, and a POST or DELETE that does not say JSON (a cross-site
form); with tokens none of it applies and CORS is off unless origins are listed. Called in
process over ASGI on a SQLite file (no query differs by database); the run pages in a browser:
tests/integration/test_ui.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from fastapi import FastAPI

from orchestrator import Client, RunStatus
from orchestrator.settings import Settings
from orchestrator.store import Store
from tests.conftest import make_settings
from tests.integration.stored_runs import seed
from tests.integration.test_api import JSON, error_of
from workers.api.routes import create_app

#: The address the test's requests come to, as a browser would name it in Host.
OWN = "127.0.0.1:8000"


@pytest.fixture
def settings(redis_url: str, tmp_path: Path) -> Settings:
    return make_settings(f"sqlite:///{tmp_path / 'ratchet.db'}", redis_url)


@pytest.fixture
def store(settings: Settings) -> Store:
    return Store.open(settings.database_url)


def app_of(settings: Settings, store: Store, **overrides: Any) -> FastAPI:
    configured = Settings.model_validate({**settings.model_dump(), **overrides})
    return create_app(configured, client=Client(configured, store=store))


def call(app: FastAPI, method: str, path: str, *, host: str = OWN, **kwargs: Any) -> httpx.Response:
    """One request to the app as it came to `host`: the Host header a browser sends."""

    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=f"http://{host}") as http:
            return await http.request(method, path, **kwargs)

    return asyncio.run(send())


def test_without_tokens_a_request_naming_another_host_is_refused_so_a_rebound_page_reads_nothing(
    settings: Settings, store: Store
) -> None:
    run_id = seed(store, RunStatus.COMPLETED)
    app = app_of(settings, store)

    # A page of evil.example whose name now resolves to 127.0.0.1 sends its own name as Host
    for host in ("evil.example:8000", "evil.example", "127.0.0.1.evil.example", "localhost.evil.example"):
        refused = call(app, "GET", "/runs", host=host)
        assert "RATCHET_API_TOKENS" in error_of(refused, 421, "MisdirectedRequest")["message"]
        assert run_id not in refused.text
    assert call(app, "GET", "/ui/", host="evil.example:8000").status_code == 421
    # This machine, by any loopback name or address and port
    for host in ("127.0.0.1:8000", "localhost:8000", "LOCALHOST", "[::1]:8000", "127.3.4.5", "app.localhost:9"):
        listed = call(app, "GET", "/runs", host=host)
        assert listed.status_code == 200 and run_id in listed.text, (host, listed.text)


def test_without_tokens_a_page_of_another_origin_is_refused_reading_and_writing(
    settings: Settings, store: Store
) -> None:
    run_id = seed(store, RunStatus.QUEUED)
    app = app_of(settings, store)

    for origin in ("http://evil.example", "null", "http://localhost:8000", "https://127.0.0.1:8000"):
        refused = call(app, "GET", f"/runs/{run_id}", headers={"Origin": origin})
        assert "RATCHET_API_CORS_ORIGINS" in error_of(refused, 403, "ForeignOrigin")["message"], origin
        error_of(call(app, "POST", f"/runs/{run_id}/cancel", headers={**JSON, "Origin": origin}), 403, "ForeignOrigin")
    assert store.get_record(run_id).status == RunStatus.QUEUED

    # The API's own pages (the origin the request came to) and clients that send no Origin
    assert call(app, "GET", f"/runs/{run_id}", headers={"Origin": "http://127.0.0.1:8000"}).status_code == 200
    assert call(app, "GET", "/runs", host="localhost", headers={"Origin": "http://localhost:80"}).status_code == 200
    cancelled = call(app, "POST", f"/runs/{run_id}/cancel", headers={**JSON, "Origin": "http://127.0.0.1:8000"})
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "CANCELLED"


def test_without_tokens_another_sites_request_without_an_origin_is_refused_but_a_link_followed_is_not(
    settings: Settings, store: Store
) -> None:
    run_id = seed(store, RunStatus.COMPLETED)
    app = app_of(settings, store)

    # An <img> or <script> of another site's page sends no Origin, but Sec-Fetch-Site says whose it is
    for site in ("cross-site", "same-site"):
        probe = {"Sec-Fetch-Site": site, "Sec-Fetch-Mode": "no-cors"}
        refused = call(app, "GET", f"/runs/{run_id}", headers=probe)
        assert "another site" in error_of(refused, 403, "ForeignOrigin")["message"], site
        error_of(call(app, "GET", "/health/checks", params={"timeout": 60}, headers=probe), 403, "ForeignOrigin")

    # A person following a link from another site to a run page, and the API's own pages, get in
    link = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}
    assert call(app, "GET", "/ui", headers=link, follow_redirects=True).status_code == 200
    own = {"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors"}
    assert call(app, "GET", f"/runs/{run_id}", headers=own).status_code == 200


def test_without_tokens_a_websocket_of_another_host_or_origin_is_closed_before_any_route(
    settings: Settings, store: Store
) -> None:
    from starlette.testclient import TestClient
    from starlette.websockets import WebSocketDisconnect

    http = TestClient(app_of(settings, store), base_url="http://evil.example")
    for headers in ({}, {"Origin": "http://evil.example"}):
        with pytest.raises(WebSocketDisconnect) as closed:
            with http.websocket_connect("/runs", headers=headers):
                pass
        assert closed.value.code == 1008


def test_a_listed_origin_is_matched_as_a_browser_writes_it() -> None:
    listed = Settings(api_cors_origins="HTTPS://App.example:443/, http://Localhost:80, http://localhost:8080")
    assert listed.api_cors_origin_values == ("https://app.example", "http://localhost", "http://localhost:8080")


def test_without_tokens_a_post_or_delete_that_does_not_say_json_is_refused_so_a_form_cancels_nothing(
    settings: Settings, store: Store
) -> None:
    run_id = seed(store, RunStatus.QUEUED, session_id="s-form")
    app = app_of(settings, store)

    # A form of another site posts with a simple content type (an old browser sends no Origin)
    form = {"content": b"x=1", "headers": {"Content-Type": "application/x-www-form-urlencoded"}}
    for kwargs in (form, {"content": b"{}", "headers": {"Content-Type": "text/plain"}}, {}):
        refused = call(app, "POST", f"/runs/{run_id}/cancel", **kwargs)
        assert "Content-Type: application/json" in error_of(refused, 415, "UnsupportedMediaType")["message"]
    error_of(call(app, "DELETE", "/sessions/s-form"), 415, "UnsupportedMediaType")
    error_of(call(app, "POST", "/runs", content=b"agent=a"), 415, "UnsupportedMediaType")
    # Any method that is not a read, a route for it or not (one added later is covered already)
    for method in ("PUT", "PATCH"):
        error_of(call(app, method, f"/runs/{run_id}", content=b"x=1"), 415, "UnsupportedMediaType")
    assert store.get_record(run_id).status == RunStatus.QUEUED

    # A client's JSON, with a body or without, and with parameters
    charset = {"Content-Type": "Application/JSON; charset=utf-8"}
    assert call(app, "POST", f"/runs/{run_id}/cancel", headers=charset).json()["status"] == "CANCELLED"
    assert call(app, "GET", f"/runs/{run_id}").status_code == 200  # a read needs no Content-Type


def test_with_tokens_no_host_or_origin_is_refused_but_no_page_is_let_in_by_cors(
    settings: Settings, store: Store
) -> None:
    run_id = seed(store, RunStatus.COMPLETED)
    app = app_of(settings, store, api_tokens="tok-cors")
    auth = {"Authorization": "Bearer tok-cors"}

    # Served under any name, to any client that holds a token
    assert call(app, "GET", f"/runs/{run_id}", host="api.example", headers=auth).status_code == 200
    error_of(call(app, "GET", f"/runs/{run_id}", host="api.example"), 401, "Unauthorized")
    # A page of another origin gets no CORS answer: its script cannot read a response
    read = call(app, "GET", f"/runs/{run_id}", host="api.example", headers={**auth, "Origin": "http://app.example"})
    assert read.status_code == 200 and "access-control-allow-origin" not in read.headers
    preflight = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST"}
    asked = call(app, "OPTIONS", "/runs", host="api.example", headers=preflight)
    assert asked.status_code != 200 and "access-control-allow-origin" not in asked.headers


@pytest.mark.parametrize("tokens", [None, "tok-cors"])
def test_a_listed_origin_gets_cors_and_passes_the_loopback_checks(
    settings: Settings, store: Store, tokens: str | None
) -> None:
    run_id = seed(store, RunStatus.COMPLETED)
    app = app_of(settings, store, api_tokens=tokens, api_cors_origins="http://localhost:3000, https://app.example/")
    auth = {"Authorization": "Bearer tok-cors"} if tokens else {}

    preflight = {
        "Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, idempotency-key",
    }  # fmt: skip
    asked = call(app, "OPTIONS", "/runs", headers=preflight)
    assert asked.status_code == 200, asked.text
    assert asked.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert "idempotency-key" in asked.headers["access-control-allow-headers"].lower()
    read = call(app, "GET", f"/runs/{run_id}", headers={**auth, "Origin": "https://app.example"})
    assert read.status_code == 200 and read.headers["access-control-allow-origin"] == "https://app.example"

    other = call(app, "GET", f"/runs/{run_id}", headers={**auth, "Origin": "http://localhost:3001"})
    assert "access-control-allow-origin" not in other.headers
    assert other.status_code == (403 if tokens is None else 200)


@pytest.mark.parametrize("listed", ["*", "http://app.example/ui", "app.example", "ftp://app.example"])
def test_a_cors_origin_that_is_not_an_origin_is_refused_saying_how_to_write_one(listed: str) -> None:
    with pytest.raises(ValueError, match="is not an origin; list each as scheme://host"):
        Settings(api_cors_origins=listed)
