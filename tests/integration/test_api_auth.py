"""Every route of the API needs a token but those it declares public (`workers.api.gate.PUBLIC_PATHS`):
the routes are walked from the app itself, so a new one is held to the rule without anyone
naming it here; the same where an app of yours mounts the API under a path. In process over
ASGI; a request the gate refuses never reaches the database."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx2 as httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import iter_route_contexts

from tests.conftest import make_settings
from workers.api import create_app, mount
from workers.api.gate import PUBLIC_PATHS

TOKEN = "walk-token"


def routes(app: FastAPI) -> list[tuple[str, str]]:
    """(method, path) of every route the app serves, included routers' too, path parameters filled."""
    found = []
    for route in iter_route_contexts(app.routes):
        if route.path is None or not route.methods:
            continue
        path = re.sub(r"\{[^}]+\}", "x1", route.path)
        found += [(method, path) for method in sorted(route.methods)]
    return found


def answers(app: FastAPI, requests: list[tuple[str, str]], headers: dict[str, str]) -> dict[tuple[str, str], int]:
    async def send() -> dict[tuple[str, str], int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            return {(m, p): (await http.request(m, p, headers=headers)).status_code for m, p in requests}

    return asyncio.run(send())


@pytest.mark.parametrize("prefix", ["", "/ratchet"], ids=["served", "mounted in an app of your own"])
def test_every_route_not_declared_public_answers_401_without_a_token(
    redis_url: str, tmp_path: Path, prefix: str
) -> None:
    settings = make_settings(f"sqlite:///{tmp_path / 'ratchet.db'}", redis_url, api_tokens=TOKEN)
    if prefix:  # the public paths are the API's own, under the path it is mounted at; the rest is yours
        app = FastAPI()
        ratchet = mount(app, prefix, settings)
    else:
        app = ratchet = create_app(settings)
    walked = routes(ratchet)
    guarded = [(m, prefix + p) for m, p in walked if p not in PUBLIC_PATHS]
    assert len(guarded) >= 15 and ("POST", f"{prefix}/runs/x1/cancel") in guarded  # the walk finds the routers' routes

    for headers in ({}, {"Authorization": "Bearer not-the-token"}, {"Authorization": f"Basic {TOKEN}"}):
        got = answers(app, guarded, {**headers, "Content-Type": "application/json"})
        assert {route: status for route, status in got.items() if status != 401} == {}, headers
    # The public ones are served without one (a run page's file, the schema, liveness)
    public = answers(app, [(m, prefix + p) for m, p in walked if p in PUBLIC_PATHS and m == "GET"], {})
    assert {route: status for route, status in public.items() if status == 401} == {}
    assert public[("GET", f"{prefix}/health")] == 200 and public[("GET", f"{prefix}/ui/")] == 200


def test_every_guarded_operation_declares_the_bearer_scheme_so_a_generated_client_sends_the_token(
    redis_url: str, tmp_path: Path
) -> None:
    schema = create_app(make_settings(f"sqlite:///{tmp_path / 'ratchet.db'}", redis_url)).openapi()
    undeclared = [
        f"{method.upper()} {path}"
        for path, operations in schema["paths"].items()
        for method, operation in operations.items()
        if path not in PUBLIC_PATHS and {"HTTPBearer": []} not in operation.get("security", [])
    ]
    assert undeclared == []
    assert "/runs/{run_id}/cancel" in schema["paths"]
