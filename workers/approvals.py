"""What paused runs wait for, across runs, for `GET /approvals` and `ratchet pending`: each
pending requirement (`Client.pending`) with the run it belongs to, so that a person sees whose
call it is and where to send the decision (`POST /runs/{run_id}/requirements/{id}`, `ratchet
approve RUN_ID ID`). The command line's `--json` prints what the API answers."""

from __future__ import annotations

from pydantic import BaseModel, Field

from orchestrator.client import Client
from orchestrator.errors import RunNotFoundError
from orchestrator.requirements import RunRequirement
from orchestrator.run import RunRecord


class Approval(BaseModel):
    """One requirement waiting for a person, and its run."""

    run_id: str = Field(
        description="the run whose call it is (for a member's pause, the member's run): decide it there, or "
        "through any team above it"
    )
    agent_name: str = Field(description="the agent or team of that run")
    user_id: str | None = Field(default=None, description="who the run is for")
    parent_run_id: str | None = Field(default=None, description="the team above a member's run (null at the top)")
    requirement: RunRequirement


class Approvals(BaseModel):
    """The answer of `GET /approvals`."""

    approvals: list[Approval] = Field(description="oldest first")


def approvals(
    client: Client, *, agent_name: str | None = None, user_id: str | None = None, limit: int = 100
) -> Approvals:
    """The requirements waiting for a person (of one agent, of one user's runs), oldest first,
    with their runs: `Client.pending`'s, and one read of each run it names. A run deleted
    between the two reads is left out, as it is no longer waiting."""
    pending = client.pending(agent_name=agent_name, user_id=user_id, limit=limit)
    runs: dict[str, RunRecord | None] = {}
    for requirement in pending:
        if requirement.run_id not in runs:
            runs[requirement.run_id] = _record(client, requirement.run_id)
    found: list[Approval] = []
    for requirement in pending:
        run = runs[requirement.run_id]
        if run is not None:
            found.append(
                Approval(
                    run_id=run.run_id,
                    agent_name=run.agent_name,
                    user_id=run.user_id,
                    parent_run_id=run.parent_run_id,
                    requirement=requirement,
                )
            )
    return Approvals(approvals=found)


def _record(client: Client, run_id: str) -> RunRecord | None:
    try:
        return client.store.get_record(run_id)
    except RunNotFoundError:
        return None
