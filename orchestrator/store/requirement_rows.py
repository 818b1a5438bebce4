"""A requirement's row read back (`ratchet_requirements`): what `store/paused.py` writes
and every reader of a run's requirements (`reads.output_of`) shows."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Connection, select
from sqlalchemy.engine import Row

from orchestrator.requirements import Decision, RunRequirement, ToolExecution
from orchestrator.store.tables import requirements


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
