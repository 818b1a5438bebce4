"""The HTTP API's routes for a person in the loop: a decision on one requirement of a PAUSED run,
and what paused runs wait for across runs.

    POST /runs/{run_id}/requirements/{requirement_id}   decide one: {"kind", "note"?, "values"?,
                                                        "result"?, "by"?}; the requirement as stored
    GET  /approvals                                     pending requirements across runs, with their
                                                        runs: ?agent=&user_id=&limit=

Each calls `Client` (`decide`, `pending`) with the same arguments and errors (`workers.api.problems`
gives their statuses). A run's requirements, decided ones included, are in the run itself
(`GET /runs/{run_id}`: `requirements`, `active_requirements`, `is_paused`), and `POST
/runs/{run_id}/continue` takes decisions too (`requirements`: a list of {"id", "decision"}),
stored by `carried` as `continue_run(requirements=)` stores them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Annotated

from fastapi import Query
from pydantic import WithJsonSchema

from orchestrator import validation as v
from orchestrator.client import Client
from orchestrator.requirements import RunRequirement
from workers.api.access import CallerDep, listed_user, own_run
from workers.api.contract import DecideRequest, RequirementDecision, RequirementId, RunId, name, refusals, text
from workers.api.deps import ClientDep, token_router
from workers.approvals import Approvals, approvals

router = token_router()


@router.post(
    "/runs/{run_id}/requirements/{requirement_id}",
    operation_id="decideRequirement",
    summary="Decide a requirement",
    response_model=RunRequirement,
    tags=["runs"],
    responses=refusals(401, 404, 409, 413, 422, 503),
)
def decide(
    run_id: RunId, requirement_id: RequirementId, body: DecideRequest, client: ClientDep, caller: CallerDep
) -> RunRequirement:
    """Store one decision on a requirement of a PAUSED run (or of one of its member runs) and
    answer the requirement as stored. The last pending requirement of its run queues the run
    again under the same run_id. The same decision sent again is answered as stored, a no-op;
    another one is a 409 DecisionConflictError whose `error.decided_by` and `error.decided_at`
    name the decision that stands. 404 RequirementNotFoundError for an id the run does not have;
    409 RunNotPausedError for a run that moved on, DecisionExpiredError past the deadline
    (the requirement's, or the run's or its team's `run_timeout`),
    PausedToolChangedError for a decision that would run the paused call (or answer it as its
    tool) when the agent's newest live definition changed that tool since the pause (nothing is
    stored; the message says what changed); 422 DecisionKindError for a decision that does not
    answer what is asked."""
    own_run(client, caller, run_id)
    return client.decide(run_id, requirement_id, body.decision(), by=body.by)


@router.get(
    "/approvals",
    operation_id="listApprovals",
    summary="List what paused runs wait for",
    response_model=Approvals,
    tags=["runs"],
    responses=refusals(401, 422),
)
def list_approvals(
    client: ClientDep,
    caller: CallerDep,
    agent: Annotated[
        str | None, Query(description="of this agent's runs (a member's own name)"), text(name(v.AGENT_NAME_MAX))
    ] = None,
    user_id: Annotated[str | None, Query(description="of this user's runs"), text(name(v.USER_ID_MAX))] = None,
    limit: Annotated[
        int,
        Query(description="requirements at most"),
        WithJsonSchema({"type": "integer", "minimum": 1, "maximum": v.PAGE_MAX, "default": 100}),
    ] = 100,
) -> Approvals:
    """The requirements waiting for a person, across runs, oldest first: each with its run (id,
    agent, user, the team above it), the call it would make and what it asks. A user's token
    (a JWT) lists its own runs' only: a user_id of another user is a 403."""
    return approvals(client, agent_name=agent, user_id=listed_user(caller, user_id), limit=limit)


def carried(
    client: Client, run_id: str, decisions: Sequence[RequirementDecision], by: str | None = None
) -> list[RunRequirement]:
    """The requirements a continue's decisions are on, as `continue_run(requirements=)` takes
    them: each as the run lists it, with the decision sent, and sent as pending, so that the
    store answers it as it answers `POST .../requirements/{id}` (the same decision a no-op,
    another one DecisionConflictError, a run that moved on RunNotPausedError). An id the run
    does not have is refused (RequirementNotFoundError, from the store) before any is stored."""
    if not decisions:
        return []
    asked = {r.id: r for r in client.get_run(run_id).requirements}
    for item in decisions:
        if item.id not in asked:  # the store's RequirementNotFoundError (or, asked since, stored)
            client.decide(run_id, item.id, item.decision.decision(), by=by)
            asked = {r.id: r for r in client.get_run(run_id).requirements}
    return [replace(asked[item.id], decision=item.decision.decision(), status="pending") for item in decisions]
