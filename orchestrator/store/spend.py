"""What a budget check reads (`orchestrator.budgets`): the spend of a run, its session and its
user, summed from the usage stored with their assistant messages (committed rows only), and the
run's decided budget requirements, which raised its limits.

A run's spend is its own replies' and, for a team, its member runs' at any depth (the tree under
it by `parent_run_id`); a session's, every run of the session (members share their team's); a
user's, every run with that user_id. A count or a cost stored as unknown (NULL) adds 0.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import Connection, func, select

from orchestrator.budgets import Scope, Spend, Spending
from orchestrator.requirements import RunRequirement
from orchestrator.run import RunRecord
from orchestrator.store.requirement_rows import from_row
from orchestrator.store.tables import messages, requirements, runs

#: A reply's tokens: input plus output, an unknown count as 0.
_TOKENS = func.coalesce(messages.c.input_tokens, 0) + func.coalesce(messages.c.output_tokens, 0)


def read(conn: Connection, record: RunRecord, scopes: Collection[Scope]) -> Spending:
    """The spend of each of `scopes` for the run `record`, and the run's budget raises."""
    spent: dict[Scope, Spend] = {}
    for scope in scopes:
        where = _runs_of(record, scope)
        if where is not None:
            spent[scope] = _sum(conn, where)
    return Spending(spent=spent, raises=tuple(raises(conn, record.run_id)))


def raises(conn: Connection, run_id: str) -> list[RunRequirement]:
    """The run's decided budget requirements, oldest first."""
    query = (
        select(requirements)
        .where(
            requirements.c.run_id == run_id,
            requirements.c.pause_type == "budget",
            requirements.c.status == "decided",
        )
        .order_by(requirements.c.created_at, requirements.c.id)
    )
    return [from_row(row) for row in conn.execute(query)]


def _runs_of(record: RunRecord, scope: Scope) -> Any:
    """Which runs' messages a scope counts: a condition on `messages.run_id`, or None for a
    user scope of a run without a user."""
    if scope == "session":
        return messages.c.run_id.in_(select(runs.c.run_id).where(runs.c.session_id == record.session_id))
    if scope == "user":
        if record.user_id is None:
            return None
        return messages.c.run_id.in_(select(runs.c.run_id).where(runs.c.user_id == record.user_id))
    if record.kind != "team":  # only a team starts member runs: an agent's tree is itself
        return messages.c.run_id == record.run_id
    tree = select(runs.c.run_id).where(runs.c.run_id == record.run_id).cte("tree", recursive=True)
    tree = tree.union_all(select(runs.c.run_id).where(runs.c.parent_run_id == tree.c.run_id))
    return messages.c.run_id.in_(select(tree.c.run_id))


def _sum(conn: Connection, where: Any) -> Spend:
    query = select(func.coalesce(func.sum(_TOKENS), 0), func.coalesce(func.sum(messages.c.cost), 0.0)).where(
        where, messages.c.role == "assistant"
    )
    tokens, cost = conn.execute(query).one()
    return Spend(tokens=int(tokens), cost=float(cost))
