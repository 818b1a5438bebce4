"""How the HTTP API answers a failure: one JSON shape and one status per error.

Every error body, a route's or FastAPI's own (a path no route serves, a method it does not take,
a request that does not fit), is `{"detail": ..., "error": {"type": ..., "message": ...}}`
(`workers.api.contract.ErrorBody`): `detail` says what went wrong and what to do, where a FastAPI
client looks first, and `error.message` says the same; `error.type` names the error, for a client
to branch on; `error.run_id` where a run was saved anyway (503) or is in the way (409 RunLiveError)
and `error.details` for a request that does not fit its schema (422). A user's mistake is always a
4xx; a 500 means a fault of the server, logged with its traceback.

    AgentNotFoundError, RunNotFoundError, SessionNotFound   404
    RequirementNotFoundError (no such requirement of the run)  404
    ScheduleNotFoundError 404, ScheduleConflictError (the id is taken)  409
    RunConflictError, RunBusyError, RunNotContinuableError  409
    RunNotPausedError, DecisionExpiredError                 409  (the run moved on; the deadline passed)
    DecisionConflictError (decided already, another way)    409  (`decided_by`, `decided_at`: the first one)
    DecisionKindError (a decision that does not answer it)  422
    PausedToolChangedError (a deploy changed the paused tool)  409  (a DecisionKindError; says what changed)
    SessionOwnedError (a start in another user's session)   409  (names the session, neither user)
    RunLiveError (a delete met a live run: `run_id` names it)  409
    InvalidInputError, a body or query that does not fit    422  (also a body that is not UTF-8 JSON)
    QueueFullError (a start while its agent's or user's runs wait)  429  (Retry-After; nothing written)
    a body larger than RATCHET_API_MAX_BODY_BYTES           413
    without tokens: a foreign Host, Origin, a write not JSON  421, 403, 415  (`workers.api.loopback`)
    no token, or one refused (InvalidToken: says why)       401  (`workers.api.gate`)
    InsufficientScope, ForeignUser (another user_id named)  403  (`workers.api.access`)
    JwksUnavailable (the JWKS cannot be fetched)            503
    BrokerUnavailableError (the run is saved as QUEUED)     503
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import iter_route_contexts
from starlette.exceptions import HTTPException
from starlette.routing import Match

from orchestrator.errors import (
    AgentNotFoundError,
    BrokerUnavailableError,
    DecisionConflictError,
    DecisionExpiredError,
    DecisionKindError,
    InvalidInputError,
    PausedToolChangedError,
    QueueFullError,
    RatchetError,
    RequirementNotFoundError,
    RunBusyError,
    RunConflictError,
    RunLiveError,
    RunNotContinuableError,
    RunNotFoundError,
    RunNotPausedError,
    ScheduleConflictError,
    ScheduleNotFoundError,
    SessionOwnedError,
)

log = logging.getLogger("ratchet.api")

#: The status of each error a request can cause; the first class in an error's MRO found here wins.
STATUS: dict[type[RatchetError], int] = {
    AgentNotFoundError: 404,
    RunNotFoundError: 404,
    RequirementNotFoundError: 404,
    ScheduleNotFoundError: 404,
    ScheduleConflictError: 409,
    RunConflictError: 409,
    # The session id is taken, as a run_id can be (not 403: the caller may start runs, only not there).
    SessionOwnedError: 409,
    RunBusyError: 409,
    RunNotContinuableError: 409,
    RunLiveError: 409,
    # A person in the loop: the run, or the requirement, is no longer where a decision can land.
    RunNotPausedError: 409,
    DecisionConflictError: 409,
    DecisionExpiredError: 409,
    # Not the decider's mistake: what the agent serves changed since the pause (the same request
    # can succeed after a deploy that serves the tool as it was).
    PausedToolChangedError: 409,
    InvalidInputError: 422,
    DecisionKindError: 422,
    QueueFullError: 429,
    BrokerUnavailableError: 503,
}
#: How long a start refused by a full queue is told to wait before it is sent again: about one
#: sweep at the default RATCHET_SWEEP_SECONDS, as a 503's run is.
QUEUE_FULL_RETRY_AFTER = "5"


class ApiError(Exception):
    """A refusal of the API's own (not a Ratchet error): its status, type name and message."""

    def __init__(self, status: int, type: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.type = type
        self.headers = headers


def error_response(status: int, type: str, message: str, **extra: Any) -> JSONResponse:
    """The one error shape, `{"detail": message, "error": {"type", "message", ...extra}}`."""
    headers = extra.pop("headers", None)
    body = {"detail": message, "error": {"type": type, "message": message, **extra}}
    return JSONResponse(body, status_code=status, headers=headers)


def status_of(exc: RatchetError) -> int:
    """The status for a Ratchet error: its class's (or an ancestor's) in STATUS, else 500."""
    return next((STATUS[cls] for cls in type(exc).__mro__ if cls in STATUS), 500)


def install(app: FastAPI) -> None:
    """Answer every failure in the one JSON shape."""
    app.add_exception_handler(RatchetError, _ratchet_error)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)


async def _ratchet_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RatchetError)
    status = status_of(exc)
    if status >= 500 and not isinstance(exc, BrokerUnavailableError):
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    if isinstance(exc, BrokerUnavailableError):  # the run is saved: say which, and when to look again
        return error_response(status, type(exc).__name__, str(exc), run_id=exc.run_id, headers={"Retry-After": "5"})
    if isinstance(exc, RunLiveError):
        return error_response(status, type(exc).__name__, str(exc), run_id=exc.run_id)
    if isinstance(exc, QueueFullError):  # nothing was written: when to send the start again
        return error_response(status, type(exc).__name__, str(exc), headers={"Retry-After": QUEUE_FULL_RETRY_AFTER})
    if isinstance(exc, DecisionConflictError):  # who decided first, for a client to show
        return error_response(
            status, type(exc).__name__, str(exc), decided_by=exc.decided_by, decided_at=exc.decided_at
        )
    return error_response(status, type(exc).__name__, str(exc))


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.type, str(exc), headers=exc.headers)


async def _invalid_request(request: Request, exc: Exception) -> JSONResponse:
    """422 naming each field that does not fit and why. The offending values are left out: an
    input can be a megabyte, and whatever was sent is the client's already."""
    assert isinstance(exc, RequestValidationError)
    details = [
        {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")} for e in exc.errors()
    ]
    where = "; ".join(f"{'.'.join(str(p) for p in d['loc'])}: {d['msg']}" for d in details)
    return error_response(422, "RequestValidationError", f"the request does not fit: {where}", details=details)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's and FastAPI's own refusals (no such path, method not allowed, a body too large
    or that cannot be decoded), in the one shape."""
    assert isinstance(exc, HTTPException)
    code = exc.status_code
    if code == 400:  # FastAPI's one 400: a JSON body it could not decode (not UTF-8, nested too deep)
        return error_response(
            422, "RequestValidationError", "the request body cannot be decoded: send JSON in UTF-8", details=[]
        )
    message = {404: f"no endpoint {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}
    kind = "ContentTooLarge" if code == 413 else "HTTPError"
    headers = exc.headers
    if code == 405:
        headers = {**(headers or {}), "Allow": allowed_methods(request)}
        message[405] += f": use {headers['Allow']}"
    return error_response(code, kind, message.get(code, str(exc.detail)), headers=headers)


def allowed_methods(request: Request) -> str:
    """Every method some route takes on the request's path: Starlette's 405 names only those of
    the first route it found there (GET and DELETE `/sessions/{id}` are two routes)."""
    methods: set[str] = set()
    for route in iter_route_contexts(request.app.routes):  # included routers' routes too
        if route.methods and route.matches(request.scope)[0] != Match.NONE:
            methods |= route.methods
    return ", ".join(sorted(methods))


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    """A fault of the server's: the JSON shape still, and the traceback in the server's log
    (Starlette raises the error on after this answer, and uvicorn logs it)."""
    return error_response(500, "InternalError", "the server failed on this request; its log says why")
