"""The HTTP API's routes on many runs at once: continue or cancel them, each on its own.

    POST /batches/continue   {"run_ids": [...]} or {"status": ["ERROR"], "agent": ..., "limit": ..., "cursor": ...}
    POST /batches/cancel     the same

Each calls `Client.continue_runs` or `Client.cancel_runs` (`orchestrator.batches`) and answers its
`Batch`: each run's outcome, ok or refused with the error's type and text, and a filter's
`next_cursor`. A batch that names no runs, both ids and a filter, a filter without a status, or
more than `BATCH_MAX` runs is a 422, and nothing is done. A user's token (a JWT) acts on its own
runs only: another user's run is refused as unknown (RunNotFoundError), as `POST
/runs/{run_id}/continue` answers it 404, and a filter reaches its own runs (another user_id is a 403).
"""

from __future__ import annotations

from typing import Any

from orchestrator import batches, validation
from orchestrator.batches import Batch
from workers.api.access import CallerDep, listed_user
from workers.api.contract import BatchRequest, refusals
from workers.api.deps import ClientDep, token_router

router = token_router()


def _batch(action: batches.Action, body: BatchRequest, client: ClientDep, caller: CallerDep) -> Batch:
    for run_id in body.run_ids or ():  # an id that cannot be one is the request's fault: 422, nothing done
        validation.known_run_id(run_id)
    selection: dict[str, Any] = {
        key: value
        for key, value in body.model_dump(exclude={"run_ids"}).items()
        if value is not None and key not in ("user_id", "status")
    }
    if body.status is not None:
        selection["status"] = [s for item in body.status for s in item.split(",")]
    if body.run_ids is None:
        user = listed_user(caller, body.user_id)
        if user is not None:
            selection["user_id"] = user
    elif body.user_id is not None:
        selection["user_id"] = body.user_id  # refused with the ids: a filter or ids, not both
    ids, next_cursor = batches.named(body.run_ids, selection, client.list_runs)  # type: ignore[arg-type]
    return batches.act(
        client.control, client.store, action, ids, next_cursor=next_cursor, reaches=lambda r: caller.sees(r.user_id)
    )


@router.post(
    "/batches/continue",
    operation_id="continueRuns",
    summary="Continue many runs",
    response_model=Batch,
    tags=["runs"],
    responses=refusals(401, 413, 422),
)
def continue_runs(body: BatchRequest, client: ClientDep, caller: CallerDep) -> Batch:
    """Continue many runs in place, each on its own, as `POST /runs/{run_id}/continue` continues
    one: by id, or a batch of the runs a filter with a status matches (newest first; pass
    `next_cursor` as `cursor` for the next). A COMPLETED run is refused (its continue would fork
    it: continue it on its own), and so is a PAUSED one (it waits for decisions)."""
    return _batch("continue", body, client, caller)


@router.post(
    "/batches/cancel",
    operation_id="cancelRuns",
    summary="Cancel many runs",
    response_model=Batch,
    tags=["runs"],
    responses=refusals(401, 413, 422),
)
def cancel_runs(body: BatchRequest, client: ClientDep, caller: CallerDep) -> Batch:
    """Cancel many runs, each on its own, as `POST /runs/{run_id}/cancel` cancels one, named as
    `POST /batches/continue` names them; a COMPLETED run is refused."""
    return _batch("cancel", body, client, caller)
