"""The HTTP API: runs started, read, waited for, continued, cancelled and streamed over HTTP.

A producer like the command line: every route calls an `orchestrator.Client`, and the workers
run the steps. `create_app()` builds the ASGI app; `mount()` serves it inside an app of your own,
under a path; `ratchet api` serves it on uvicorn (`workers.api.serve`). Each operation has an
explicit operationId in camelCase (`startRun`, `getRun`...) and a summary of its own.

    POST /runs                      start a run (Idempotency-Key: the same key starts one run)
    GET  /runs/{run_id}             the run, its messages and member runs
    GET  /runs/{run_id}/wait        the run once it stops, or as it is after `timeout` seconds
    POST /runs/{run_id}/continue    continue it (ERROR in place; COMPLETED forks; PAUSED with decisions)
    POST /runs/{run_id}/cancel      cancel it and its member runs
    GET  /runs/{run_id}/events      its events as server-sent events, resumable by Last-Event-ID
                                    (204 once the run has stopped and nothing is left to send)
    GET  /runs, GET /runs/{run_id}/log, /steps, GET and DELETE /sessions/{id}: listing, logs,
                                    steps, sessions (`records.py`)
    POST /batches/continue, POST /batches/cancel: many runs at once, by id or a filter (`batch_routes.py`)
    GET  /agents, GET /agents/{agent}: the agent catalog, what the workers serve (`agents.py`)
    POST /runs/{run_id}/requirements/{requirement_id}, GET /approvals: a person's decisions, and
                                    what paused runs wait for (`decisions.py`)
    POST, GET /schedules, DELETE /schedules/{id}: agents run on a cron schedule (`schedule_routes.py`)
    GET  /ui/                       the run pages: the list of runs and each run's timeline (`ui.py`)
    GET  /health                    liveness (no token needed), as are /openapi.json and /docs
    GET  /metrics                   Prometheus metrics, read from the store and the broker (`workers.prometheus`)
    GET  /health/checks             `ratchet health`: database, broker, workers (workers/api/checks.py)

Errors are JSON (`workers.api.problems`); the token and body-size checks are `workers.api.gate`;
who may call which route, and reach whose runs (static tokens, users' JWTs, scopes), `workers.api.access`;
without tokens, the Host, Origin and Content-Type checks that keep other sites' pages out are
`workers.api.loopback`; the bodies and each value's limits in the schema, `workers.api.contract`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request, Response
from fastapi.responses import PlainTextResponse
from fastapi.sse import EventSourceResponse, ServerSentEvent
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from starlette.applications import Starlette

from orchestrator import catalog, validation
from orchestrator.client import Client
from orchestrator.control import derived_run_id
from orchestrator.errors import (
    AgentNotFoundError,
    ConfigurationError,
    RunConflictError,
    RunNotFoundError,
    RunWaitTimeout,
    SessionOwnedError,
)
from orchestrator.events import RunEvent
from orchestrator.run import RunOutput, RunRecord
from orchestrator.settings import Settings
from orchestrator.webhooks import WebhookDelivery
from workers.api import agents, batch_routes, checks, decisions, problems, records, schedule_routes, ui
from workers.api.access import DECIDE, CallerDep, Verifier, declare_scopes, own_run, starting_user
from workers.api.contract import (
    EVENT_ID,
    HEADER_NAME,
    LAST_EVENT_ID,
    RUN_LINKS,
    ContinueRequest,
    Health,
    RunId,
    StartRequest,
    json_refusals,
    name,
    pattern,
    refusals,
    text,
)
from workers.api.deps import ClientDep, root_path, token_router
from workers.api.gate import Gate
from workers.api.loopback import Guard, add_cors, declare_refusals
from workers.api.problems import ApiError
from workers.prometheus import exposition

#: The longest a client may ask `/wait` to hold its request, in seconds: past it, ask again.
MAX_WAIT = 300.0


router = token_router()


def create_app(settings: Settings | None = None, *, client: Client | None = None) -> FastAPI:
    """The API's ASGI app over `client` (default: a Client of `settings`, default from the env).
    To serve it inside a FastAPI app of your own, under a path: `mount`."""
    settings = settings or Settings.from_env()
    client = client or Client(settings)

    @asynccontextmanager
    async def opened(app: FastAPI) -> AsyncIterator[None]:
        # Open the store and build the dispatcher at start, not in the first requests' threads at
        # once: a database that cannot be opened stops the server before it takes a request.
        _ = client.store, client.dispatcher
        yield

    app = FastAPI(
        title="Ratchet",
        summary="Durable LLM agents and teams on Celery: start, follow and steer runs over HTTP.",
        version="0.1.0",
        lifespan=opened,
    )
    app.state.client = client
    problems.install(app)
    app.add_exception_handler(_NothingNew, lambda request, exc: Response(status_code=204))
    # Outermost last: CORS answers a preflight before the guard or the token is asked for.
    verifier = Verifier(settings) if settings.jwt_key is not None or settings.jwt_jwks_url else None
    app.add_middleware(
        Gate, tokens=settings.api_token_values, max_body_bytes=settings.api_max_body_bytes, verifier=verifier
    )
    if not settings.api_auth:
        app.add_middleware(Guard, origins=settings.api_cors_origin_values)
        declare_refusals(app)
    elif verifier is not None:
        declare_scopes(app, jwks=verifier.fetches)
    if settings.api_cors_origin_values:
        add_cors(app, settings.api_cors_origin_values)
    app.include_router(router)
    app.include_router(records.router)
    app.include_router(batch_routes.router)
    app.include_router(agents.router)
    app.include_router(decisions.router)
    app.include_router(schedule_routes.router)
    app.include_router(ui.router)
    app.include_router(checks.router)
    app.add_api_route(
        "/health",
        _health,
        methods=["GET"],
        operation_id="getHealth",
        summary="Liveness",
        response_model=Health,
        tags=["meta"],
        responses=refusals(),
    )
    return app


def mount(
    app: Starlette, path: str = "/ratchet", settings: Settings | None = None, *, client: Client | None = None
) -> FastAPI:
    """Serve the API inside `app`, an app of your own, under `path`, and return the API's app.
    All of it is there: its routes, its schema and docs (`{path}/openapi.json`, `{path}/docs`),
    the token check, the limits, the error shape and the run pages; and its start (the store
    opened) runs in `app`'s lifespan, around your own, since a server starts only the outer app.
    Your own routes, their middleware and their errors are left as they were."""
    if not path.startswith("/") or path.endswith("/"):
        raise ConfigurationError(f"mount the API under a path such as '/ratchet', not {path!r}: a '/' first, none last")
    ratchet = create_app(settings, client=client)
    app.mount(path, ratchet)
    yours = app.router.lifespan_context

    @asynccontextmanager
    async def both(outer: Any) -> AsyncIterator[Any]:
        async with ratchet.router.lifespan_context(ratchet), yours(outer) as state:
            yield state

    app.router.lifespan_context = both
    return ratchet


def _health() -> Health:
    """The server is up (needs no token)."""
    return Health()


@router.post(
    "/runs",
    operation_id="startRun",
    summary="Start a run",
    status_code=202,
    response_model=RunOutput,
    tags=["runs"],
    responses={202: {"links": RUN_LINKS}, **refusals(401, 404, 409, 413, 422, 429, 503)},
)
def start_run(
    body: StartRequest,
    request: Request,
    response: Response,
    client: ClientDep,
    caller: CallerDep,
    idempotency_key: Annotated[
        str | None,
        text({**name(validation.IDEMPOTENCY_KEY_MAX), "pattern": HEADER_NAME}),
        Header(
            description="the same key with the same body starts one run and returns it again; with another "
            "agent, input, stream, priority or session_state, or a session_id not the run's, it is a 409. Keys are "
            "per user_id: another user's same key starts a run of its own",
        ),
    ] = None,
) -> RunOutput:
    """Start a run of an agent or team; 202 with the run as saved (QUEUED, or further along if
    the same Idempotency-Key started it before). Location: the run's URL. A user's token (a JWT)
    starts runs for its own user_id only: none named is its own, another's is a 403. 429
    QueueFullError (with Retry-After), nothing written, while the agent (or the user) has its
    most runs QUEUED (`max_queued=`, RATCHET_MAX_QUEUED_PER_AGENT, RATCHET_MAX_QUEUED_PER_USER)."""
    user_id = starting_user(caller, body.user_id)
    _served(client, validation.agent_name(body.agent))
    key = None if idempotency_key is None else validation.idempotency_key(idempotency_key)
    run_id = None if key is None else idempotent_run_id(key, user_id)
    try:
        handle = client.start(
            body.agent,
            input=body.input,
            session_id=body.session_id,
            run_id=run_id,
            stream=body.stream,
            user_id=user_id,
            session_state=body.session_state,
            priority=body.priority,
            webhook=body.webhook,
            run_timeout=body.run_timeout,
        )
    except SessionOwnedError:  # about the session, not the key: said as it is
        raise
    except RunConflictError as exc:  # the control compares the whole request (`orchestrator.idempotency`)
        if key is None:
            raise
        raise RunConflictError(
            f"Idempotency-Key {key!r} was sent with another request before ({exc}); a new request needs a new key"
        ) from None
    run = client.get_run(handle.run_id)
    # Under the path a proxy (`ratchet api --root-path`) or a mount puts in front: the URL a client can follow.
    response.headers["Location"] = f"{root_path(request.scope)}/runs/{run.run_id}"
    return run


def idempotent_run_id(key: str, user_id: str | None) -> str:
    """The run id an Idempotency-Key stands for: one per key and user_id, so two users' keys
    never meet (each gets a run of its own), and a key that leaks names no other user's run. A
    key sent without a user_id keeps the id it had before keys were per user."""
    return derived_run_id("idempotency", key) if user_id is None else derived_run_id("idempotency", user_id, key)


def _served(client: Client, agent: str) -> None:
    """AgentNotFoundError (404) for a name that neither a module of this server defines nor any
    worker ever served (the agent catalog), as `ratchet run` refuses it: said for an HTTP client,
    before anything is written."""
    if not catalog.known(client.store, agent):
        raise AgentNotFoundError(
            f"no agent or team named {agent!r} is known here: none of this server's --app modules defines it "
            "and no worker has served it (GET /agents lists those that have); start a worker whose module defines it"
        )


@router.get(
    "/runs/{run_id}",
    operation_id="getRun",
    summary="Get a run",
    response_model=RunOutput,
    tags=["runs"],
    responses=refusals(401, 404, 422),
)
def get_run(run_id: RunId, client: ClientDep, caller: CallerDep) -> RunOutput:
    """The run with its messages and member runs."""
    own_run(client, caller, run_id)
    return client.get_run(run_id)


@router.get(
    "/runs/{run_id}/webhooks",
    operation_id="listRunWebhooks",
    summary="List a run's webhook deliveries",
    response_model=list[WebhookDelivery],
    tags=["runs"],
    responses=refusals(401, 404, 422),
)
def list_run_webhooks(run_id: RunId, client: ClientDep, caller: CallerDep) -> list[WebhookDelivery]:
    """What the run's webhook was told: one delivery per stop, pending, delivered or failed."""
    own_run(client, caller, run_id)
    return client.webhook_deliveries(run_id)


@router.get(
    "/runs/{run_id}/wait",
    operation_id="waitForRun",
    summary="Wait for a run to stop",
    response_model=RunOutput,
    tags=["runs"],
    responses=refusals(401, 404, 422),
)
async def wait_run(
    run_id: RunId,
    client: ClientDep,
    caller: CallerDep,
    timeout: Annotated[float, Query(gt=0, le=MAX_WAIT, allow_inf_nan=False, description="seconds to wait")] = 30.0,
) -> RunOutput:
    """The run once it stops (COMPLETED, ERROR or CANCELLED); if it is still going after
    `timeout` seconds, 200 with the run as it is then: its `status` says which, so wait again."""
    await asyncio.to_thread(own_run, client, caller, run_id)
    try:
        return await client.await_run(run_id, timeout)
    except RunWaitTimeout:
        return await asyncio.to_thread(client.get_run, run_id)


@router.post(
    "/runs/{run_id}/continue",
    operation_id="continueRun",
    summary="Continue a run",
    status_code=202,
    response_model=RunOutput,
    tags=["runs"],
    responses={202: {"links": RUN_LINKS}, **refusals(401, 404, 409, 413, 422, 503)},
)
def continue_run(run_id: RunId, client: ClientDep, caller: CallerDep, body: ContinueRequest | None = None) -> RunOutput:
    """Continue a run: ERROR and an expired RUNNING resume in place; COMPLETED forks a new
    run (the one returned); QUEUED and WAITING are going already. 409 for a CANCELLED run, or a
    RUNNING one whose worker is alive. A PAUSED run resumes in place once every requirement is
    decided: the decisions in `requirements` are stored first, one by one, as `POST
    /runs/{run_id}/requirements/{id}` stores each (and refused alike: 404, 409, 422); without
    them, or with some still pending, it stays PAUSED, and input for it is a 409. Decisions
    need the decide scope besides write. `accept_definition`: a definition a deploy's
    DefinitionChangedError names, accepted (422 for one no worker ever served)."""
    body = body or ContinueRequest()
    own_run(client, caller, run_id)
    if body.requirements and not caller.may(DECIDE):
        raise ApiError(
            403, "InsufficientScope", "decisions in a continue need the 'decide' scope, which the token does not grant"
        )
    requirements = decisions.carried(client, run_id, body.requirements or [], by=body.by)
    handle = client.continue_run(
        run_id,
        input=body.input,
        fork_key=body.fork_key,
        requirements=requirements,
        by=body.by,
        run_timeout=body.run_timeout,
        accept_definition=body.accept_definition,
    )
    return client.get_run(handle.run_id)


@router.post(
    "/runs/{run_id}/cancel",
    operation_id="cancelRun",
    summary="Cancel a run",
    response_model=RunOutput,
    tags=["runs"],
    responses=refusals(401, 404, 409, 422),
)
def cancel_run(run_id: RunId, client: ClientDep, caller: CallerDep) -> RunOutput:
    """Cancel a run that has not finished, and its member runs; 409 for a COMPLETED run."""
    own_run(client, caller, run_id)
    return client.cancel(run_id)


def _known_run(run_id: RunId, client: ClientDep, caller: CallerDep) -> RunRecord:
    """The run, once found: an unknown run is a 404, not an empty stream, and so is another
    user's run for a user's token."""
    record = client.store.get_record(validation.known_run_id(run_id))
    if not caller.sees(record.user_id):
        raise RunNotFoundError(f"no run with run_id {run_id!r} in this database")
    return record


class _NothingNew(Exception):
    """A stopped run has no event after the one asked for (answered 204)."""


async def _run_events(
    record: Annotated[RunRecord, Depends(_known_run)],
    client: ClientDep,
    after: Annotated[
        str | None, Query(description="an event id: send only the events after it"), text(pattern(EVENT_ID))
    ] = None,
    last_event_id: Annotated[
        str | None, Header(description="sent by a reconnecting client; wins over ?after"), text(LAST_EVENT_ID)
    ] = None,
) -> AsyncIterator[RunEvent]:
    """The events to send, resolved before the response starts: a bad id is a 422, not a broken
    stream. A run that has stopped has a stream of known length: if nothing is left in it, 204,
    which tells a browser's EventSource to stop reconnecting."""
    # Off the event loop: it reads the run (a database round trip) before returning the iterator.
    events = await asyncio.to_thread(client.astream, record.run_id, after=last_event_id or after)
    if not record.status.is_final:
        return events
    first = await anext(events, None)
    if first is None:
        raise _NothingNew
    return _prepend(first, events)


async def _prepend(first: RunEvent, rest: AsyncIterator[RunEvent]) -> AsyncIterator[RunEvent]:
    yield first
    async for event in rest:
        yield event


@router.get(
    "/runs/{run_id}/events",
    operation_id="streamRunEvents",
    summary="Stream a run's events",
    response_class=EventSourceResponse,
    tags=["runs"],
    responses={
        200: {"content": {"text/event-stream": {}}},
        204: {"description": "the run has stopped and has no event after the one asked for"},
        **json_refusals(401, 404, 422),
    },
)
async def run_events(
    events: Annotated[AsyncIterator[RunEvent], Depends(_run_events)],
) -> AsyncIterator[ServerSentEvent]:
    """The run's events as server-sent events (`id:` the event's id, `event:` its type, `data:`
    the event as JSON), from the start or after the given id, until the run stops (or pauses).
    A client that reconnects with `Last-Event-ID` gets exactly the events it has not seen; a
    RunContent delta sorted before a StepRestarted of its step belongs to an abandoned attempt.
    Waiting on the run holds no server thread; a comment line keeps an idle connection open."""
    async for event in events:
        # ASCII: a lone surrogate in a live delta would otherwise fail the UTF-8 encoding of the stream.
        data = json.dumps(event.model_dump(mode="json"), separators=(",", ":"))
        yield ServerSentEvent(raw_data=data, event=event.event, id=event.id)


@router.get(
    "/metrics",
    operation_id="getMetrics",
    summary="Prometheus metrics",
    response_class=PlainTextResponse,
    tags=["meta"],
    responses={200: {"content": {CONTENT_TYPE_PLAIN_0_0_4: {}}}, **json_refusals(401, 422)},
)
def metrics(client: ClientDep, accept: Annotated[str | None, Header(include_in_schema=False)] = None) -> Response:
    """Prometheus metrics in its text format: runs by agent and status, runs started and
    finished, retries, sweeper recoveries, fenced writes, cancelled steps, errors, poison steps,
    tokens, cost in US dollars, step durations, queue waits, model call latency and time to first
    token by model, tool durations, run durations and queue lengths, read from the store and the
    broker now, so every API process answers the same.
    Needs a token like every route but /health: give Prometheus one (`authorization:` in its
    scrape config)."""
    body, content_type = exposition(client, accept)
    return Response(body, headers={"Content-Type": content_type})
