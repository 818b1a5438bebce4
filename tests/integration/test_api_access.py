"""Users over the HTTP API (`workers/api/access.py`): two users' JWTs, each reaching only its own
runs and sessions on every route the app serves (walked from the app, so a new route without a
rule fails here), each route asking for its scope, a static token and an admin JWT reaching
both users', a refused token saying why, and CORS by setting. The JWTs are signed here with a
generated RSA key, with an HMAC secret, and with a key served as a JWKS by a local HTTP server.
In process over ASGI with real steps run inline (`in_memory`); the event stream of a live run
from a real `ratchet api` with a real worker at the end."""

from __future__ import annotations

import asyncio
import http.server
import json
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from fastapi import FastAPI
from fastapi.routing import iter_route_contexts

import tests.integration.api_agents  # noqa: F401  (the embedded worker runs its agent)
from orchestrator import Agent, RunStatus, tool
from orchestrator.catalog import write_served
from orchestrator.settings import Settings
from orchestrator.testing import InMemoryDispatcher, in_memory
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.scripted_model import ScriptedModel
from tests.conftest import make_settings
from tests.integration.test_api import JSON, error_of, start_api
from tests.integration.test_api_events import read_events
from workers.api import create_app
from workers.api.access import ADMIN, ROUTE_SCOPES, SCOPES
from workers.api.gate import PUBLIC_PATHS
from workers.celery.embedded import EmbeddedWorker

AUDIENCE, ISSUER = "ratchet-test", "https://id.example"
SERVICE_TOKEN = "service-token"
USER_SCOPES = "read write decide"
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
OTHER_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
HMAC_SECRET = uuid.uuid4().hex + uuid.uuid4().hex


def pem(key: rsa.RSAPrivateKey) -> str:
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return public.decode()


@tool(requires_confirmation=True)
def approve(what: str) -> str:
    """Do something once a person approves it."""
    return f"done: {what}"


CHAT = Agent(name="access-chat", model=ScriptedModel(script=ScriptConfig(final_text="hello")))
ASKER = Agent(
    name="access-asker",
    model=ScriptedModel(
        script=ScriptConfig(batches=[[{"tool": "approve", "arguments": {"what": "x"}}]], final_text="ok")
    ),
    tools=[approve],
)


@dataclass
class Signer:
    """How the test's tokens are signed, and the settings that verify them."""

    key: Any
    algorithm: str
    settings: dict[str, str]
    headers: dict[str, str] = field(default_factory=dict)

    def token(self, sub: str | None, scope: str | None = USER_SCOPES, **claims: Any) -> str:
        now = int(time.time())
        payload = {"sub": sub, "scope": scope, "aud": AUDIENCE, "iss": ISSUER, "exp": now + 600, "iat": now, **claims}
        payload = {k: v for k, v in payload.items() if v is not None}
        return jwt.encode(payload, self.key, algorithm=self.algorithm, headers=self.headers or None)


@pytest.fixture(scope="module")
def jwks_url() -> Iterator[str]:
    """A JWKS endpoint, as an identity provider serves one: the RSA key's public half, by kid."""
    jwk = {**json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(RSA_KEY.public_key())), "kid": "k1", "use": "sig"}
    body = json.dumps({"keys": [jwk]}).encode()

    class Keys(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Keys)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/.well-known/jwks.json"
    server.shutdown()


@pytest.fixture(params=["rsa-key", "hmac-secret", "jwks"])
def signer(request: pytest.FixtureRequest) -> Signer:
    common = {"jwt_audience": AUDIENCE, "jwt_issuer": ISSUER}
    if request.param == "rsa-key":
        return Signer(RSA_KEY, "RS256", {**common, "jwt_key": pem(RSA_KEY)})
    if request.param == "hmac-secret":
        return Signer(HMAC_SECRET, "HS256", {**common, "jwt_key": HMAC_SECRET})
    url = request.getfixturevalue("jwks_url")
    return Signer(RSA_KEY, "RS256", {**common, "jwt_jwks_url": url}, headers={"kid": "k1"})


def settings_for(redis_url: str, tmp_path: Path, signer: Signer, **more: Any) -> Settings:
    return make_settings(
        f"sqlite:///{tmp_path / 'ratchet.db'}", redis_url, api_tokens=SERVICE_TOKEN, **signer.settings, **more
    )


def call(app: FastAPI, method: str, path: str, token: str | None, **kwargs: Any) -> httpx.Response:
    """One request to the app in process, as a client sends it, with this bearer token."""
    headers = {**JSON, **({"Authorization": f"Bearer {token}"} if token else {}), **kwargs.pop("headers", {})}

    async def send() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as http:
            return await http.request(method, path, headers=headers, **kwargs)

    return asyncio.run(send())


def guarded(app: FastAPI) -> dict[tuple[str, str], str]:
    """(method, path template) -> operation id of every route that needs a token: all but the
    public ones and the run pages' files (`/ui/{name}` serves only those, public, and a 404)."""
    return {
        (method, route.path): route.operation_id
        for route in iter_route_contexts(app.routes)
        if route.path is not None and route.methods and route.path not in PUBLIC_PATHS and route.path != "/ui/{name}"
        for method in route.methods
    }


@dataclass
class World:
    """Each user's runs and sessions, and the tokens to call with."""

    app: FastAPI
    signer: Signer
    alice: str
    bob: str
    admin: str
    runs: dict[str, str]  # "alice", "alice-paused", "bob", "bob-paused" -> run_id
    requirement: dict[str, str]  # "alice", "bob" -> the paused run's requirement id

    def as_alice(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return call(self.app, method, path, self.alice, **kwargs)

    def not_found(self, method: str, path: str, run_id: str, **kwargs: Any) -> None:
        """Alice asking this of Bob's run is told what an unknown run is told."""
        body = error_of(self.as_alice(method, path.format(run=run_id), **kwargs), 404, "RunNotFoundError")
        assert body["message"] == f"no run with run_id {run_id!r} in this database"

    def owned(self, method: str, path: str, status: int, **kwargs: Any) -> httpx.Response:
        """Alice asking this of Bob's run is a 404; of her own, `status`."""
        self.not_found(method, path, self.runs["bob"], **kwargs)
        mine = self.as_alice(method, path.format(run=self.runs["alice"]), **kwargs)
        assert mine.status_code == status, mine.text
        return mine


@pytest.fixture
def world(redis_url: str, tmp_path: Path, signer: Signer) -> Iterator[World]:
    settings = settings_for(redis_url, tmp_path, signer)
    with in_memory(settings) as inline:
        write_served(inline.client.store, [CHAT, ASKER])
        yield seeded(create_app(settings, client=inline.client), inline, signer)


def seeded(app: FastAPI, inline: InMemoryDispatcher, signer: Signer) -> World:
    client = inline.client
    runs, requirement = {}, {}
    for user in ("alice", "bob"):
        runs[user] = client.start(CHAT.name, input="hi", user_id=user, session_id=f"s-{user}").run_id
        paused = client.start(ASKER.name, input="go", user_id=user, session_id=f"p-{user}").run_id
        run = client.get_run(paused)
        assert run.status == RunStatus.PAUSED
        runs[f"{user}-paused"], requirement[user] = paused, run.requirements[0].id
        client.start(CHAT.name, input="old", user_id=user, session_id=f"old-{user}")
    return World(
        app=app,
        signer=signer,
        alice=signer.token("alice"),
        bob=signer.token("bob"),
        admin=signer.token("ops", scope="admin"),
        runs=runs,
        requirement=requirement,
    )


def _start(w: World) -> None:
    error_of(w.as_alice("POST", "/runs", json={"agent": CHAT.name, "input": "x", "user_id": "bob"}), 403, "ForeignUser")
    started = w.as_alice("POST", "/runs", json={"agent": CHAT.name, "input": "x"})
    assert started.status_code == 202 and started.json()["user_id"] == "alice", started.text
    mine = w.as_alice("POST", "/runs", json={"agent": CHAT.name, "input": "x", "user_id": "alice"})
    assert mine.status_code == 202 and mine.json()["user_id"] == "alice"
    into_bobs = w.as_alice("POST", "/runs", json={"agent": CHAT.name, "input": "x", "session_id": "s-bob"})
    error_of(into_bobs, 409, "SessionOwnedError")
    # A service (a static token, an admin JWT) starts runs for whom it names
    for token in (SERVICE_TOKEN, w.admin):
        theirs = call(w.app, "POST", "/runs", token, json={"agent": CHAT.name, "input": "x", "user_id": "bob"})
        assert theirs.status_code == 202 and theirs.json()["user_id"] == "bob"


def _list_runs(w: World) -> None:
    for user, token in (("alice", w.alice), ("bob", w.bob)):
        listed = call(w.app, "GET", "/runs", token, params={"members": "true", "limit": 1000}).json()["runs"]
        assert listed and {r["user_id"] for r in listed} == {user}
        assert w.runs[user] in {r["run_id"] for r in listed}
    error_of(w.as_alice("GET", "/runs", params={"user_id": "bob"}), 403, "ForeignUser")
    assert w.as_alice("GET", "/runs", params={"user_id": "alice"}).status_code == 200
    for token in (SERVICE_TOKEN, w.admin):
        every = call(w.app, "GET", "/runs", token, params={"limit": 1000}).json()["runs"]
        assert {"alice", "bob"} <= {r["user_id"] for r in every}


def _events(w: World) -> None:
    w.not_found("GET", "/runs/{run}/events", w.runs["bob"])
    mine = w.as_alice("GET", f"/runs/{w.runs['alice']}/events")
    assert mine.status_code == 200 and mine.headers["content-type"].startswith("text/event-stream"), mine.text
    assert f'"run_id":"{w.runs["alice"]}"' in mine.text and "RunCompleted" in mine.text


def _session(path: str) -> Callable[[World], None]:
    def check(w: World) -> None:
        error_of(w.as_alice("GET", path.format(session="s-bob")), 404, "SessionNotFound")
        mine = w.as_alice("GET", path.format(session="s-alice"))
        assert mine.status_code == 200 and mine.json()["user_id"] == "alice"
        error_of(w.as_alice("GET", path.format(session="s-alice"), params={"user_id": "bob"}), 403, "ForeignUser")
        assert call(w.app, "GET", path.format(session="s-bob"), w.admin).status_code == 200

    return check


def _delete_session(w: World) -> None:
    error_of(w.as_alice("DELETE", "/sessions/old-bob"), 404, "SessionNotFound")
    assert call(w.app, "GET", "/sessions/old-bob", w.bob).status_code == 200  # still there
    gone = w.as_alice("DELETE", "/sessions/old-alice")
    assert gone.status_code == 200 and gone.json()["runs"] == 1


def _agents(path: str) -> Callable[[World], None]:
    def check(w: World) -> None:
        assert w.as_alice("GET", path).status_code == call(w.app, "GET", path, w.bob).status_code == 200

    return check


def _approvals(w: World) -> None:
    for user, token in (("alice", w.alice), ("bob", w.bob)):
        pending = call(w.app, "GET", "/approvals", token).json()["approvals"]
        assert [a["run_id"] for a in pending] == [w.runs[f"{user}-paused"]]
    error_of(w.as_alice("GET", "/approvals", params={"user_id": "bob"}), 403, "ForeignUser")
    assert len(call(w.app, "GET", "/approvals", w.admin).json()["approvals"]) == 2


def _decide(w: World) -> None:
    approve = {"kind": "confirm", "by": "alice"}
    bobs = f"/runs/{{run}}/requirements/{w.requirement['bob']}"
    w.not_found("POST", bobs, w.runs["bob-paused"], json=approve)
    # A continue that carries decisions is held to the run's owner, and needs decide too
    carried = {"requirements": [{"id": w.requirement["bob"], "decision": {"kind": "confirm"}}]}
    w.not_found("POST", "/runs/{run}/continue", w.runs["bob-paused"], json=carried)
    write_only = call(
        w.app, "POST", f"/runs/{w.runs['alice-paused']}/continue", w.signer.token("alice", scope="write"),
        json={"requirements": [{"id": w.requirement["alice"], "decision": {"kind": "confirm"}}]},
    )  # fmt: skip
    error_of(write_only, 403, "InsufficientScope")
    decided = w.as_alice("POST", f"/runs/{w.runs['alice-paused']}/requirements/{w.requirement['alice']}", json=approve)
    assert decided.status_code == 200 and decided.json()["status"] == "decided", decided.text
    assert call(w.app, "GET", f"/runs/{w.runs['bob-paused']}", w.bob).json()["status"] == "PAUSED"


def _schedule(w: World, user: str, schedule_id: str) -> None:
    """A schedule of `user`'s, made by a service (a static token names the user)."""
    body = {"agent": CHAT.name, "cron": "@daily", "input": "x", "user_id": user, "schedule_id": schedule_id}
    assert call(w.app, "POST", "/schedules", SERVICE_TOKEN, json=body).status_code == 201


def _create_schedule(w: World) -> None:
    body = {"agent": CHAT.name, "cron": "0 9 * * mon-fri", "timezone": "Europe/Paris", "input": "report"}
    error_of(w.as_alice("POST", "/schedules", json={**body, "user_id": "bob"}), 403, "ForeignUser")
    made = w.as_alice("POST", "/schedules", json=body)
    assert made.status_code == 201 and made.json()["user_id"] == "alice" and made.json()["next_at"] > time.time()
    bad = error_of(w.as_alice("POST", "/schedules", json={**body, "cron": "0 9 * *"}), 422, "InvalidInputError")
    assert "has 4 fields" in bad["message"]
    taken = {**body, "schedule_id": made.json()["schedule_id"]}
    error_of(w.as_alice("POST", "/schedules", json=taken), 409, "ScheduleConflictError")
    error_of(w.as_alice("POST", "/schedules", json={**body, "agent": "made-up"}), 404, "AgentNotFoundError")
    error_of(w.as_alice("POST", "/schedules", json={**body, "session_id": "s-bob"}), 409, "SessionOwnedError")


def _list_schedules(w: World) -> None:
    _schedule(w, "bob", "bobs-listed")
    mine = w.as_alice("GET", "/schedules").json()["schedules"]
    assert {s["user_id"] for s in mine} <= {"alice"} and "bobs-listed" not in {s["schedule_id"] for s in mine}
    error_of(w.as_alice("GET", "/schedules", params={"user_id": "bob"}), 403, "ForeignUser")
    every = call(w.app, "GET", "/schedules", w.admin).json()["schedules"]
    assert "bobs-listed" in {s["schedule_id"] for s in every}


def _delete_schedule(w: World) -> None:
    _schedule(w, "bob", "bobs-kept")
    _schedule(w, "alice", "alices-gone")
    error_of(w.as_alice("DELETE", "/schedules/bobs-kept"), 404, "ScheduleNotFoundError")
    assert w.as_alice("DELETE", "/schedules/alices-gone").status_code == 204
    error_of(w.as_alice("DELETE", "/schedules/alices-gone"), 404, "ScheduleNotFoundError")
    assert "bobs-kept" in {s["schedule_id"] for s in call(w.app, "GET", "/schedules", w.bob).json()["schedules"]}


def _batch(action: str) -> Callable[[World], None]:
    """A batch of a user's acts on its own runs only: another's, named by id, is refused as an
    unknown run; a filter reaches its own (naming another user is a 403); an admin reaches both.
    (On COMPLETED runs, which both batches refuse: the later checks find every run as it was.)"""

    def check(w: World) -> None:
        mine, bobs = w.runs["alice"], w.runs["bob"]
        answer = w.as_alice("POST", f"/batches/{action}", json={"run_ids": [mine, bobs]})
        assert answer.status_code == 200, answer.text
        reached, theirs = answer.json()["results"]
        assert (reached["run_id"], reached["status"], reached["error"]) == (mine, "COMPLETED", "RunNotContinuableError")
        unknown = f"no run with run_id {bobs!r} in this database"
        assert theirs == {"run_id": bobs, "ok": False, "status": None, "error": "RunNotFoundError", "reason": unknown}
        filtered = w.as_alice("POST", f"/batches/{action}", json={"status": ["COMPLETED"]}).json()["results"]
        assert mine in {r["run_id"] for r in filtered} and bobs not in {r["run_id"] for r in filtered}
        foreign = w.as_alice("POST", f"/batches/{action}", json={"status": ["COMPLETED"], "user_id": "bob"})
        error_of(foreign, 403, "ForeignUser")
        admin = call(w.app, "POST", f"/batches/{action}", w.admin, json={"run_ids": [bobs]}).json()["results"][0]
        assert (admin["status"], admin["error"]) == ("COMPLETED", "RunNotContinuableError")

    return check


def _ops(path: str, **params: str) -> Callable[[World], None]:
    def check(w: World) -> None:
        error_of(w.as_alice("GET", path), 403, "InsufficientScope")
        for token in (SERVICE_TOKEN, w.admin):
            assert call(w.app, "GET", path, token, params=params).status_code == 200

    return check


#: What each guarded route is held to, for two users: the app's routes must be exactly these.
CHECKS: dict[tuple[str, str], Callable[[World], object]] = {
    ("POST", "/runs"): _start,
    ("GET", "/runs"): _list_runs,
    ("GET", "/runs/{run_id}"): lambda w: w.owned("GET", "/runs/{run}", 200),
    ("GET", "/runs/{run_id}/wait"): lambda w: w.owned("GET", "/runs/{run}/wait", 200, params={"timeout": 1}),
    ("POST", "/runs/{run_id}/continue"): lambda w: w.owned("POST", "/runs/{run}/continue", 202),
    ("POST", "/runs/{run_id}/cancel"): lambda w: w.owned("POST", "/runs/{run}/cancel", 409),
    ("POST", "/batches/continue"): _batch("continue"),
    ("POST", "/batches/cancel"): _batch("cancel"),
    ("GET", "/runs/{run_id}/events"): _events,
    ("GET", "/runs/{run_id}/log"): lambda w: w.owned("GET", "/runs/{run}/log", 200),
    ("GET", "/runs/{run_id}/steps"): lambda w: w.owned("GET", "/runs/{run}/steps", 200),
    ("GET", "/runs/{run_id}/webhooks"): lambda w: w.owned("GET", "/runs/{run}/webhooks", 200),
    ("GET", "/sessions/{session_id}"): _session("/sessions/{session}"),
    ("GET", "/sessions/{session_id}/runs"): _session("/sessions/{session}/runs"),
    ("DELETE", "/sessions/{session_id}"): _delete_session,
    ("GET", "/agents"): _agents("/agents"),
    ("GET", "/agents/{agent}"): _agents(f"/agents/{CHAT.name}"),
    ("GET", "/approvals"): _approvals,
    ("POST", "/runs/{run_id}/requirements/{requirement_id}"): _decide,
    ("POST", "/schedules"): _create_schedule,
    ("GET", "/schedules"): _list_schedules,
    ("DELETE", "/schedules/{schedule_id}"): _delete_schedule,
    ("GET", "/metrics"): _ops("/metrics"),
    ("GET", "/health/checks"): _ops("/health/checks", check="database"),
}


def test_each_user_reaches_only_its_own_runs_and_sessions_on_every_route(world: World) -> None:
    routes = guarded(world.app)
    assert set(routes) == set(CHECKS), "a route without a check here (and a rule in access.ROUTE_SCOPES)"
    assert set(routes.values()) == set(ROUTE_SCOPES)
    for route, check in CHECKS.items():
        try:
            check(world)
        except AssertionError as exc:
            raise AssertionError(f"{route}: {exc}") from exc


@pytest.fixture
def rsa_app(redis_url: str, tmp_path: Path) -> FastAPI:
    signer = Signer(RSA_KEY, "RS256", {"jwt_key": pem(RSA_KEY), "jwt_audience": AUDIENCE, "jwt_issuer": ISSUER})
    return create_app(settings_for(redis_url, tmp_path, signer, api_cors_origins="https://app.example"))


RSA = Signer(RSA_KEY, "RS256", {})


def test_each_route_asks_for_its_scope_and_admin_holds_every_one(rsa_app: FastAPI) -> None:
    operations = [op for ops in rsa_app.openapi()["paths"].values() for op in ops.values()]
    declared = {op["operationId"]: op.get("x-ratchet-scope") for op in operations if "403" in op["responses"]}
    assert declared == ROUTE_SCOPES  # the schema says each one's scope, and its 403
    for (method, template), operation in guarded(rsa_app).items():
        path = re.sub(r"\{[^}]+\}", "x1", template)
        needed = ROUTE_SCOPES[operation]
        lacking = call(rsa_app, method, path, RSA.token("alice", scope=" ".join(sorted(SCOPES - {needed, ADMIN}))))
        body = error_of(lacking, 403, "InsufficientScope")
        assert repr(needed) in body["message"], (method, path)
        assert lacking.headers["www-authenticate"] == f'Bearer error="insufficient_scope", scope="{needed}"'
        for scope in {needed, ADMIN}:  # past the scope check: the route's own answer (the quick health check)
            past = call(rsa_app, method, path, RSA.token("alice", scope=scope), params={"check": "database"})
            assert past.status_code not in (401, 403), (path, past.text)


def test_a_refused_token_is_a_401_saying_why(rsa_app: FastAPI) -> None:
    now = int(time.time())
    refused = {
        "expired": RSA.token("alice", exp=now - 120),
        "not valid yet": RSA.token("alice", nbf=now + 600),
        "aud": RSA.token("alice", aud="another-api"),
        "iss": RSA.token("alice", iss="https://elsewhere.example"),
        "no 'sub'": RSA.token(None),
        "none of the scopes": RSA.token("alice", scope="email profile"),
        "InvalidSignatureError": Signer(OTHER_KEY, "RS256", {}).token("alice"),
        # an algorithm not configured (HMAC, to pass as the key holder), and none at all
        "InvalidAlgorithmError": Signer("a-secret-of-thirty-two-bytes-or-more", "HS256", {}).token("alice"),
        "InvalidAlgorithmError ": Signer(None, "none", {}).token("alice", scope="admin"),
        "DecodeError": "a.b.c",
    }
    for reason, token in refused.items():
        answer = call(rsa_app, "GET", "/runs", token)
        body = error_of(answer, 401, "InvalidToken")
        assert reason.strip() in body["message"], (reason, body["message"])
        assert answer.headers["www-authenticate"].startswith('Bearer error="invalid_token", error_description="')
    no_exp = jwt.encode({"sub": "alice", "aud": AUDIENCE, "iss": ISSUER, "scope": "read"}, RSA_KEY, algorithm="RS256")
    assert "'exp'" in error_of(call(rsa_app, "GET", "/runs", no_exp), 401, "InvalidToken")["message"]
    for header in ({"Authorization": f"Basic {RSA.token('alice')}"}, {}):
        error_of(call(rsa_app, "GET", "/runs", None, headers=header), 401, "Unauthorized")
    assert call(rsa_app, "GET", "/runs", RSA.token("alice")).status_code == 200
    assert call(rsa_app, "GET", "/health", None).status_code == 200  # public as before


def test_cors_lets_the_listed_origins_pages_call_with_a_jwt(rsa_app: FastAPI) -> None:
    preflight = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type",
    }
    listed = call(rsa_app, "OPTIONS", "/runs", None, headers={"Origin": "https://app.example", **preflight})
    assert listed.status_code == 200 and listed.headers["access-control-allow-origin"] == "https://app.example"
    other = call(rsa_app, "OPTIONS", "/runs", None, headers={"Origin": "https://other.example", **preflight})
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    read = call(rsa_app, "GET", "/runs", RSA.token("alice"), headers={"Origin": "https://app.example"})
    assert read.status_code == 200 and read.headers["access-control-allow-origin"] == "https://app.example"


def test_a_jwks_key_is_chosen_by_kid_and_a_jwks_out_of_reach_is_a_503(
    redis_url: str, tmp_path: Path, jwks_url: str
) -> None:
    signer = Signer(RSA_KEY, "RS256", {"jwt_jwks_url": jwks_url, "jwt_issuer": ISSUER}, headers={"kid": "k2"})
    app = create_app(settings_for(redis_url, tmp_path, signer))
    unknown_kid = signer.token("alice", aud=None)
    assert '"k2"' in error_of(call(app, "GET", "/runs", unknown_kid), 401, "InvalidToken")["message"]
    known = Signer(RSA_KEY, "RS256", {}, headers={"kid": "k1"})
    assert call(app, "GET", "/runs", known.token("alice", aud=None)).status_code == 200
    # No RATCHET_JWT_AUDIENCE: a token naming an audience is for another service
    refused = error_of(call(app, "GET", "/runs", known.token("alice")), 401, "InvalidToken")
    assert "RATCHET_JWT_AUDIENCE names none" in refused["message"]
    with socket_closed() as url:
        gone = Signer(RSA_KEY, "RS256", {"jwt_jwks_url": url}, headers={"kid": "k1"})
        away = create_app(settings_for(redis_url, tmp_path, gone))
        answer = call(away, "GET", "/runs", gone.token("alice"))
        assert "RATCHET_JWT_JWKS_URL" in error_of(answer, 503, "JwksUnavailable")["message"]
        assert answer.headers["retry-after"] == "5"


@contextmanager
def socket_closed() -> Iterator[str]:
    """The URL of a port nothing listens on (bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    yield f"http://127.0.0.1:{port}/jwks.json"


def test_a_users_live_run_streams_to_it_and_to_no_other_user_of_a_real_server(redis_url: str, tmp_path: Path) -> None:
    """`ratchet api` with RATCHET_JWT_KEY_FILE and a real worker: Alice starts a run as herself,
    streams it live to its end; Bob, who may read, is told it does not exist on each path."""
    key_file = tmp_path / "jwt.pem"
    key_file.write_text(pem(RSA_KEY))
    settings = make_settings(f"sqlite:///{tmp_path / 'ratchet.db'}", redis_url)
    env = {"RATCHET_JWT_KEY_FILE": str(key_file), "RATCHET_JWT_AUDIENCE": AUDIENCE, "RATCHET_JWT_ISSUER": ISSUER}
    api = start_api(settings, tmp_path / "api.log", env=env, app="tests.integration.api_agents")
    try:
        alice = {"Authorization": f"Bearer {RSA.token('alice')}"}
        bob = {"Authorization": f"Bearer {RSA.token('bob')}"}
        with api.client() as http:
            started = http.post(
                "/runs", json={"agent": "api-streamer", "input": "otters", "stream": True}, headers=alice
            )
            assert started.status_code == 202 and started.json()["user_id"] == "alice", started.text
            run_id = started.json()["run_id"]
            for path in (f"/runs/{run_id}/events", f"/runs/{run_id}", f"/runs/{run_id}/steps"):
                error_of(http.get(path, headers=bob), 404, "RunNotFoundError")
            with EmbeddedWorker(settings):
                events = read_events(http, f"/runs/{run_id}/events", headers=alice)
            assert events[0].event == "RunStarted" and events[-1].event == "RunCompleted"
            assert "RunContent" in {e.event for e in events}
            error_of(http.get(f"/runs/{run_id}/events", headers=bob), 404, "RunNotFoundError")
            assert http.get("/runs", headers=bob).json()["runs"] == []
            assert [r["run_id"] for r in http.get("/runs", headers=alice).json()["runs"]] == [run_id]
        assert RSA.token("alice") not in api.log.read_text() and "BEGIN PUBLIC KEY" not in api.log.read_text()
    finally:
        api.stop()
