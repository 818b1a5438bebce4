"""What the store's metrics are (`Store.metrics`, served as Prometheus metrics by `ratchet api`):
runs by agent and status now, and counters that only grow, whichever API process is asked.

Steps run in worker processes on other hosts, so the metrics come from the rows those write:
run events (retries, sweeper recoveries, fenced writes, errors, poison steps), assistant
messages (tokens and cost), and the message a step's own commit carries, stamped with its
claim's time (how long the step took, by kind: a reply is a model step, a tool result a tool step).

A counter is a sum over rows that are only ever added, read in two parts:

- `ratchet_metric_totals`: what the rows written up to its mark (a time) add up to;
- the rows written after the mark, summed at each read (an index range scan on their time).

Each read first moves the mark to SETTLE seconds ago (`fold`), adding the rows in between to the
totals, so a read sums about a minute of rows whatever the tables hold, and every API process
reads the same values. The mark moves under its row's lock: two processes folding at once add
each row once. A row counts by its time (`at`, `created_at`: the writer's clock just before its
transaction commits), so one that committed more than SETTLE seconds after its time, or stamped
by a clock SETTLE behind, would fall behind the mark uncounted: transactions take milliseconds,
and workers' clocks are kept in sync already (leases compare them).

Deleting runs takes their rows away: `keep_counted`, in the deleting transaction, adds the rows
the totals do not hold yet to them first, so no counter goes down (Prometheus would read a
counter that drops as a restart, and count everything again).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, and_, bindparam, case, func, insert, select, true, update

from orchestrator.store.tables import events, messages, metric_totals, runs
from orchestrator.usage import USAGE_COLUMNS

#: Seconds a row's time may precede its commit (see above); reads sum the rows since then.
SETTLE_SECONDS = 60.0
#: Upper bounds of the step-duration buckets, in seconds. Fixed: the stored totals count by them
#: (after a change, delete every row of ratchet_metric_totals but the mark and set the mark to 0:
#: the next read counts the stored rows again, without the runs deleted meanwhile).
BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
#: The run events counted, by the kind `Store.log_event` gives them. "poison" is an "error" event
#: of a poison step (counted under "error" too).
EVENT_KINDS = ("retry", "lease_expired", "fenced", "error")
#: The token counts of a reply, by the label they are counted under.
TOKEN_KINDS = {"input": "input_tokens", "output": "output_tokens", "cache_read": "cache_read_tokens",
               "reasoning": "reasoning_tokens"}  # fmt: skip
#: How a poison step's error event reads (`Store.log_event` writes its detail with json.dumps).
_POISON = "%" + json.dumps({"type": "PoisonStepError"})[1:-1] + "%"
_MARK = and_(metric_totals.c.name == "mark", metric_totals.c.agent == "", metric_totals.c.label == "")

Key = tuple[str, str, str]  # (counter, agent, label)


@dataclass(frozen=True, kw_only=True)
class Durations:
    """Step durations: how many took at most each of `BUCKETS` (cumulative), all, and their sum."""

    buckets: tuple[tuple[float, int], ...]
    count: int
    sum: float


@dataclass(frozen=True, kw_only=True)
class MetricsSnapshot:
    """The store's metrics at one time (`Store.metrics`, `Client.metrics`). Agents are run
    names; "" for events of a run deleted before they were counted."""

    #: (agent, status) -> runs stored in that status now.
    runs: Mapping[tuple[str, str], int] = field(default_factory=dict)
    #: (agent, kind) -> run events ever logged: "retry" (a model call parked to try again),
    #: "lease_expired" (the sweeper took a step back from a worker that stopped renewing its lease),
    #: "fenced" (a worker's write refused: its lease was taken over), "error" (the run went to
    #: ERROR), "poison" (of those, a step the sweeper gave up on after RATCHET_MAX_STEP_ATTEMPTS).
    events: Mapping[tuple[str, str], int] = field(default_factory=dict)
    #: (agent, kind) -> tokens the providers reported: "input", "output", "cache_read", "reasoning".
    tokens: Mapping[tuple[str, str], int] = field(default_factory=dict)
    #: agent -> cost of the replies stored, in the currency of the models' `Prices`.
    cost: Mapping[str, float] = field(default_factory=dict)
    #: (agent, "model" | "tools") -> durations of the steps that committed, claim to commit.
    steps: Mapping[tuple[str, str], Durations] = field(default_factory=dict)
    #: queue -> messages waiting in it (`Client.metrics` asks the broker); None when not known.
    queues: Mapping[str, int] | None = None


def fold(conn: Connection, *, upto: float) -> None:
    """In the caller's write transaction: add the rows written after the mark, up to `upto`, to
    the totals and move the mark there (nothing if the mark is there already)."""
    mark = conn.execute(select(metric_totals.c.value).where(_MARK).with_for_update()).scalar_one()
    if upto <= mark:
        return
    _add(conn, _sums(conn, after=mark, upto=upto))
    conn.execute(update(metric_totals).where(_MARK).values(value=upto))


def keep_counted(conn: Connection, run_ids: Collection[str]) -> None:
    """In the transaction that deletes these runs, before it does: add their rows written after
    the mark to the totals (the rows before it are counted there already)."""
    if run_ids:
        mark = conn.execute(select(metric_totals.c.value).where(_MARK).with_for_update()).scalar_one()
        _add(conn, _sums(conn, after=mark, upto=None, run_ids=run_ids))


def read(conn: Connection) -> MetricsSnapshot:
    """The metrics: the totals up to the mark plus the rows written after it (one snapshot)."""
    counted: dict[Key, float] = defaultdict(float)
    mark = 0.0
    for row in conn.execute(select(metric_totals)):
        if (row.name, row.agent, row.label) == ("mark", "", ""):
            mark = row.value
        else:
            counted[(row.name, row.agent, row.label)] += row.value
    for key, value in _sums(conn, after=mark, upto=None).items():
        counted[key] += value
    stored = select(runs.c.agent_name, runs.c.status, func.count()).group_by(runs.c.agent_name, runs.c.status)
    return _snapshot(counted, {(r[0], r[1]): r[2] for r in conn.execute(stored)})


def _snapshot(counted: Mapping[Key, float], stored: dict[tuple[str, str], int]) -> MetricsSnapshot:
    events_: dict[tuple[str, str], int] = {}
    tokens: dict[tuple[str, str], int] = {}
    cost: dict[str, float] = {}
    steps: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for (name, agent, label), value in counted.items():
        if name == "event":
            events_[(agent, label)] = round(value)
        elif name == "tokens":
            tokens[(agent, label)] = round(value)
        elif name == "cost":
            cost[agent] = value
        elif name == "step":
            kind, _, part = label.partition(":")
            steps[(agent, kind)][part] = value
    durations = {
        key: Durations(
            buckets=tuple((b, round(parts.get(f"le={b:g}", 0))) for b in BUCKETS),
            count=round(parts.get("count", 0)),
            sum=parts.get("sum", 0.0),
        )
        for key, parts in steps.items()
    }
    return MetricsSnapshot(runs=stored, events=events_, tokens=tokens, cost=cost, steps=durations)


def _sums(conn: Connection, *, after: float, upto: float | None, run_ids: Collection[str] = ()) -> dict[Key, float]:
    """What the rows written in (after, upto] (of `run_ids` only, if given) add to each counter."""
    sums: dict[Key, float] = {}
    for row in conn.execute(_events_query(after, upto, run_ids)):
        agent, kind, count, poison = row
        sums[("event", agent, kind)] = count
        if poison:
            sums[("event", agent, "poison")] = poison
    for row in conn.execute(_messages_query(after, upto, run_ids)):
        values = row._mapping
        agent = values["agent"]
        if values["role"] == "assistant":
            for label, column in TOKEN_KINDS.items():
                sums[("tokens", agent, label)] = values[column] or 0
            sums[("cost", agent, "")] = values["cost"] or 0.0
        kind = "model" if values["role"] == "assistant" else "tools"
        if values["steps"]:
            sums[("step", agent, f"{kind}:count")] = values["steps"]
            sums[("step", agent, f"{kind}:sum")] = values["seconds"]
            for b in BUCKETS:
                sums[("step", agent, f"{kind}:le={b:g}")] = values[f"le={b:g}"]
    return {key: value for key, value in sums.items() if value}


def _window(column: Any, after: float, upto: float | None) -> Any:
    return and_(column > after, column <= upto if upto is not None else true())


def _with_agent(table: Any) -> Any:
    """`table` joined to its rows' runs, for their agent ("" once the run is gone)."""
    return table.outerjoin(runs, runs.c.run_id == table.c.run_id)


_AGENT = func.coalesce(runs.c.agent_name, "").label("agent")


def _events_query(after: float, upto: float | None, run_ids: Collection[str]) -> Any:
    e = events
    poison = case((and_(e.c.kind == "error", e.c.detail.like(_POISON)), 1), else_=0)
    where = [e.c.kind.in_(EVENT_KINDS), _window(e.c.at, after, upto)]
    if run_ids:
        where.append(e.c.run_id.in_(list(run_ids)))
    rows = select(_AGENT, e.c.kind, poison.label("poison")).select_from(_with_agent(e)).where(*where).subquery()
    return select(rows.c.agent, rows.c.kind, func.count(), func.sum(rows.c.poison)).group_by(rows.c.agent, rows.c.kind)


def _messages_query(after: float, upto: float | None, run_ids: Collection[str]) -> Any:
    m = messages
    seconds = (m.c.created_at - m.c.step_started_at).label("seconds")
    where = [m.c.role.in_(("assistant", "tool")), _window(m.c.created_at, after, upto)]
    if run_ids:
        where.append(m.c.run_id.in_(list(run_ids)))
    usage = [m.c[c] for c in USAGE_COLUMNS]
    rows = select(_AGENT, m.c.role, seconds, *usage).select_from(_with_agent(m)).where(*where).subquery()
    stamped = rows.c.seconds.is_not(None)
    return select(
        rows.c.agent,
        rows.c.role,
        *(func.sum(rows.c[c]).label(c) for c in USAGE_COLUMNS),
        func.sum(case((stamped, 1), else_=0)).label("steps"),
        func.sum(rows.c.seconds).label("seconds"),
        *(func.sum(case((rows.c.seconds <= b, 1), else_=0)).label(f"le={b:g}") for b in BUCKETS),
    ).group_by(rows.c.agent, rows.c.role)


def _add(conn: Connection, sums: Mapping[Key, float]) -> None:
    """Add `sums` to the stored totals (the caller holds the mark's lock: no other writer)."""
    if not sums:
        return
    have = {(r.name, r.agent, r.label) for r in conn.execute(select(metric_totals).where(~_MARK))}
    new = [dict(name=k[0], agent=k[1], label=k[2], value=v) for k, v in sums.items() if k not in have]
    old = [dict(k_name=k[0], k_agent=k[1], k_label=k[2], delta=v) for k, v in sums.items() if k in have]
    if new:
        conn.execute(insert(metric_totals), new)
    if old:
        t = metric_totals.c
        conn.execute(
            update(metric_totals)
            .where(t.name == bindparam("k_name"), t.agent == bindparam("k_agent"), t.label == bindparam("k_label"))
            .values(value=t.value + bindparam("delta")),
            old,
        )
