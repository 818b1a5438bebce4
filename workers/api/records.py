"""The HTTP API's routes on stored runs: list them, read a run's log and steps, read and delete a session.

    GET    /runs                 a page of runs, newest first: ?status=ERROR&agent=a&since=6h&cursor=...
    GET    /runs/{run_id}/log    what happened to the run besides its messages (retries, errors...)
    GET    /runs/{run_id}/steps  its steps: task, attempt, status, duration, tokens (`orchestrator.timeline`)
    GET    /sessions/{id}        a session: its user, its state and its runs (?user_id=: only if it is theirs)
    GET    /sessions/{id}/runs   the same (the path it had first)
    DELETE /sessions/{id}        the session, its runs and everything stored for them

Each calls `Client` (`list_runs`, `get_log`, `get_steps`, `get_session`, `delete_session`) with the
same arguments and errors. `GET /runs/{run_id}/events` is another thing: the run's events as a live stream
(`workers.api.routes`); the log is a stored record, read at once. Pruning old runs is the command
line's and Python's (`ratchet prune`, `Client.prune`): a bulk delete is an operator's job, run
from a schedule, not a request a token holder makes.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Query
from pydantic import BaseModel, Field, WithJsonSchema

from orchestrator import validation as v
from orchestrator.run import LogEntry, RunPage, Session
from orchestrator.timeline import Step
from workers.api.access import CallerDep, listed_user, own_run
from workers.api.contract import CURSOR, MOMENT, STATUSES, RunId, SessionId, name, pattern, refusals, text, texts
from workers.api.deps import ClientDep, token_router
from workers.api.problems import ApiError

router = token_router()


class RunLog(BaseModel):
    """The answer of `GET /runs/{run_id}/log`."""

    run_id: str
    entries: list[LogEntry] = Field(description="oldest first")


class RunSteps(BaseModel):
    """The answer of `GET /runs/{run_id}/steps`."""

    run_id: str
    steps: list[Step] = Field(description="in the order they ran")


class SessionDeleted(BaseModel):
    """The answer of `DELETE /sessions/{session_id}`."""

    session_id: str
    runs: int = Field(description="runs deleted, member runs included")


@router.get(
    "/runs",
    operation_id="listRuns",
    summary="List runs",
    response_model=RunPage,
    tags=["runs"],
    responses=refusals(401, 422),
)
def list_runs(
    client: ClientDep,
    caller: CallerDep,
    status: Annotated[
        list[str] | None,
        texts(pattern(STATUSES)),
        Query(
            description="QUEUED, RUNNING, WAITING, PAUSED, ERROR, COMPLETED or CANCELLED; "
            "several: repeat it, or separate them with commas"
        ),
    ] = None,
    agent: Annotated[str | None, Query(description="runs of this agent or team"), text(name(v.AGENT_NAME_MAX))] = None,
    session_id: Annotated[str | None, Query(description="runs in this session"), text(name(v.SESSION_ID_MAX))] = None,
    user_id: Annotated[str | None, Query(description="runs for this user"), text(name(v.USER_ID_MAX))] = None,
    since: Annotated[
        str | None,
        Query(
            description='created at or after: ISO 8601, UNIX seconds, or how long ago ("6h", "7d")',
        ),
        text(pattern(MOMENT)),
    ] = None,
    until: Annotated[str | None, Query(description="created before (the same forms)"), text(pattern(MOMENT))] = None,
    limit: Annotated[
        int,
        Query(description="runs a page"),
        WithJsonSchema({"type": "integer", "minimum": 1, "maximum": v.PAGE_MAX, "default": 50}),
    ] = 50,
    cursor: Annotated[
        str | None,
        Query(
            description="the next_cursor of the previous page, as it was returned (another is a 422)",
        ),
        text(pattern(CURSOR)),
    ] = None,
    members: Annotated[bool, Query(description="also member runs of teams (default: top-level runs)")] = False,
) -> RunPage:
    """A page of runs, newest first, and the cursor of the next page (null on the last). A run
    started meanwhile never shifts a page; each page costs the same however deep. A user's
    token (a JWT) lists its own runs only: a user_id of another user is a 403."""
    user_id = listed_user(caller, user_id)
    statuses = None if status is None else [s for item in status for s in item.split(",")]
    return client.list_runs(
        status=statuses,
        agent=agent,
        session_id=session_id,
        user_id=user_id,
        since=since,
        until=until,
        limit=limit,
        cursor=cursor,
        members=members,
    )


@router.get(
    "/runs/{run_id}/log",
    operation_id="getRunLog",
    summary="Get a run's log",
    response_model=RunLog,
    tags=["runs"],
    responses=refusals(401, 404, 422),
)
def run_log(run_id: RunId, client: ClientDep, caller: CallerDep) -> RunLog:
    """The run's log, oldest first: retries, errors, leases the sweeper took back, fenced writes,
    delegations and fan-ins, continues, cancels (not its member runs': ask for each)."""
    own_run(client, caller, run_id)
    return RunLog(run_id=run_id, entries=client.get_log(run_id))


@router.get(
    "/runs/{run_id}/steps",
    operation_id="getRunSteps",
    summary="Get a run's steps",
    response_model=RunSteps,
    tags=["runs"],
    responses=refusals(401, 404, 422),
)
def run_steps(run_id: RunId, client: ClientDep, caller: CallerDep) -> RunSteps:
    """The run's steps in order: each one's task (a model call, a tool batch, a fan-in), status,
    attempt, when it could start and ended (its duration includes time in the queue: a claim's
    time is not kept), tokens, failed tool calls and error; the worker and Celery task id of the
    step in progress only (a commit clears the lease that names them). Not its member runs'."""
    own_run(client, caller, run_id)
    return RunSteps(run_id=run_id, steps=client.get_steps(run_id))


@router.delete(
    "/sessions/{session_id}",
    operation_id="deleteSession",
    summary="Delete a session",
    response_model=SessionDeleted,
    tags=["sessions"],
    responses=refusals(401, 404, 409, 422),
)
def delete_session(session_id: SessionId, client: ClientDep, caller: CallerDep) -> SessionDeleted:
    """Delete the session, its runs (member runs included) and everything stored for them. 409
    (RunLiveError, naming the run in `run_id`) if a run in it is live, and nothing is deleted:
    cancel it or let it stop first. A user's token deletes its own sessions only (another's: 404)."""
    if not caller.admin and client.get_session(session_id, user_id=caller.user_id) is None:
        raise ApiError(404, "SessionNotFound", f"no session {session_id!r} of user_id {caller.user_id!r}")
    deleted = client.delete_session(session_id)
    if deleted is None:
        raise ApiError(404, "SessionNotFound", f"no run was ever started in session {session_id!r}")
    return SessionDeleted(session_id=session_id, runs=deleted.runs)


@router.get(
    "/sessions/{session_id}",
    operation_id="getSession",
    summary="Get a session",
    response_model=Session,
    tags=["sessions"],
    responses=refusals(401, 404, 422),
)
@router.get(
    "/sessions/{session_id}/runs",
    operation_id="getSessionRuns",
    summary="Get a session (its first path)",
    description="The same answer as `GET /sessions/{session_id}` (getSession), at the path it had first.",
    response_model=Session,
    tags=["sessions"],
    responses=refusals(401, 404, 422),
)
def get_session(
    session_id: SessionId,
    client: ClientDep,
    caller: CallerDep,
    user_id: Annotated[
        str | None,
        Query(description="the session only if it is this user's, with this user's runs"),
        text(name(v.USER_ID_MAX)),
    ] = None,
) -> Session:
    """The session: its user, its state, and its runs, oldest first, each with its messages and
    member runs. With `user_id`: 404 unless the session is that user's (its first run's), and
    only that user's runs. A user's token (a JWT) gets its own sessions only, as with its user_id
    (another user_id is a 403)."""
    user_id = listed_user(caller, user_id)
    session = client.get_session(session_id, user_id=user_id)
    if session is None:
        if user_id is not None:  # whether the session is somebody else's is not said
            raise ApiError(404, "SessionNotFound", f"no session {session_id!r} of user_id {user_id!r}")
        raise ApiError(404, "SessionNotFound", f"no run was ever started in session {session_id!r}")
    return session
