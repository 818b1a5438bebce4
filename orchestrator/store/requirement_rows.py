"""A requirement's row read back (`ratchet_requirements`): what `store/paused.py` writes
and every reader of a run's requirements (`reads.output_of`) shows; with what the row keeps of
its tool as it paused (`PausedCall`), and the producer's check of a decision against what is
served now (`Door`), which `Requirements.decide` runs before it stores one."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import Connection, select
from sqlalchemy.engine import Row

from orchestrator.requirements import Decision, RunRequirement, ToolExecution
from orchestrator.store.catalog_rows import CatalogRow
from orchestrator.store.tables import requirements


@dataclass(frozen=True, kw_only=True)
class PausedCall:
    """A requirement, with the agent whose call it is and what its row keeps of the tool as it
    paused (`orchestrator.paused_tools`)."""

    requirement: RunRequirement
    agent_name: str
    #: The hash of the definition the pausing worker served (None: a budget, or a row written before).
    definition_hash: str | None
    #: The digest of the paused tool (None: a budget, or a row written before).
    tool_digest: str | None


class Door(Protocol):
    """A producer's check of a decision against what the deployment serves now, run by
    `Requirements.decide` before it stores a decision that needs the paused tool
    (`requirements.needs_the_tool`); it raises to refuse it."""

    #: How long after a worker last marked a catalog definition it counts as served (live).
    window: float

    def __call__(self, paused: PausedCall, served: CatalogRow | None) -> None:
        """Refuse (raise) a decision on `paused` that `served`, the newest live definition of
        its agent in the catalog (None: none is live), would not apply to the tool it paused on."""


def of_run(conn: Connection, run_id: str) -> list[RunRequirement]:
    """The run's own requirements, oldest first."""
    query = select(requirements).where(requirements.c.run_id == run_id).order_by(requirements.c.created_at)
    return [from_row(row) for row in conn.execute(query)]


def from_row(row: Row[Any]) -> RunRequirement:
    """A requirement as its row holds it."""
    detail = json.loads(row.detail) if row.detail else {}
    call = (
        ToolExecution(
            tool_call_id=row.tool_call_id,
            tool_name=row.tool_name or "",
            tool_args=json.loads(row.tool_args) if row.tool_args else None,
        )
        if row.tool_call_id is not None
        else None
    )
    decision = Decision.from_json(json.loads(row.decision)) if row.decision else None
    fields = detail.get("fields")
    if fields is not None and decision is not None and decision.values:
        fields = [{**f, "value": decision.values.get(f["name"])} for f in fields]
    return RunRequirement(
        id=row.id,
        run_id=row.run_id,
        tool_execution=call,
        pause_type=row.pause_type,
        created_at=row.created_at,
        status=row.status,
        deadline_at=row.deadline_at,
        on_timeout=row.on_timeout,
        user_input_schema=fields,
        budget=detail.get("budget"),
        decision=decision,
        decided_by=row.decided_by,
        decided_at=row.decided_at,
    )


def paused_call(row: Row[Any]) -> PausedCall:
    """A requirement's row as a paused call."""
    return PausedCall(
        requirement=from_row(row),
        agent_name=row.agent_name,
        definition_hash=row.definition_hash,
        tool_digest=row.tool_digest,
    )
