"""What the store's metrics are (`Store.metrics`, served as Prometheus metrics by `ratchet api`):
runs by agent and status now, and counters that only grow, whichever API process is asked.

Steps run in worker processes on other hosts, so the metrics come from the rows those write:
run events (retries, sweeper recoveries, fenced writes, errors, poison steps, pauses), assistant
messages (tokens and cost), the message a step's own commit carries, stamped with its claim's
time (how long the step took, by kind: a reply is a model step, a tool result a tool step), and
each decision's event, with the requirement it decided (time to decision: from the pause that
asked it to the decision, by what was asked); the runs' rows by `created_at` (runs started),
the events of moves to a final status (`completed`, `error`, `cancel`, `paused`: runs finished),
and the histograms of `store/latencies.py` (queue waits, model calls and their first text, tool
calls, run durations) from the same rows.

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

from orchestrator.store import latencies
from orchestrator.store.tables import events, messages, metric_totals, requirements, runs
from orchestrator.usage import USAGE_COLUMNS

#: Seconds a row's time may precede its commit (see above); reads sum the rows since then.
SETTLE_SECONDS = 60.0
#: Upper bounds of the step-duration buckets, in seconds. Fixed: the stored totals count by them
#: (after a change, delete every row of ratchet_metric_totals but the mark and set the mark to 0:
#: the next read counts the stored rows again, without the runs deleted meanwhile).
BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
#: Upper bounds of the time-to-decision buckets, in seconds (fixed as BUCKETS is): a person
#: answers in seconds, hours or days.
DECISION_BUCKETS = (1.0, 10.0, 60.0, 300.0, 900.0, 3600.0, 14_400.0, 86_400.0, 259_200.0, 604_800.0)
#: The run events counted, by the kind `Store.log_event` gives them. "poison" is an "error" event
#: of a poison step (counted under "error" too); "paused" a run moved to PAUSED (a team above a
#: member that paused too); "completed" and "cancel" moves to COMPLETED and CANCELLED;
#: "cancelled_step" a "fenced" event of a step whose run was cancelled while it ran (not counted
#: under "fenced": no worker came back too late).
EVENT_KINDS = ("retry", "lease_expired", "fenced", "error", "paused", "completed", "cancel")
#: The token counts of a reply, by the label they are counted under.
TOKEN_KINDS = {"input": "input_tokens", "output": "output_tokens", "cache_read": "cache_read_tokens",
               "cache_write": "cache_write_tokens", "reasoning": "reasoning_tokens"}  # fmt: skip
#: Token kinds only some providers report (Anthropic's cache writes): no sample for an agent
#: whose replies never had one, rather than a 0 that reads as measured.
_ONLY_REPORTED = frozenset({"cache_write"})
#: How a poison step's error event reads (`Store.log_event` writes its detail with json.dumps).
_POISON = "%" + json.dumps({"type": "PoisonStepError"})[1:-1] + "%"
#: How the "fenced" event of a step its run's cancel fenced reads (`Store.record_fenced`).
_BY_CANCEL = "%" + json.dumps({"cause": "cancel"})[1:-1] + "%"
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
    #: ERROR), "poison" (of those, a step the sweeper gave up on after RATCHET_MAX_STEP_ATTEMPTS),
    #: "paused" (the run moved to PAUSED: it waits for a person, or its member does).
    events: Mapping[tuple[str, str], int] = field(default_factory=dict)
    #: (agent, kind) -> tokens the providers reported: "input", "output", "cache_read", "reasoning".
    tokens: Mapping[tuple[str, str], int] = field(default_factory=dict)
    #: agent -> cost of the replies stored, in US dollars (the models' `Prices`).
    cost: Mapping[str, float] = field(default_factory=dict)
    #: agent -> runs ever started (created: a continue of a COMPLETED run forks a new one).
    started: Mapping[str, int] = field(default_factory=dict)
    #: (agent, status) -> moves to each final status: COMPLETED, ERROR, CANCELLED, PAUSED.
    finished: Mapping[tuple[str, str], int] = field(default_factory=dict)
    #: (agent, "model" | "tools") -> queue wait of the steps that committed: queued to claimed.
    queue_wait: Mapping[tuple[str, str], Durations] = field(default_factory=dict)
    #: (agent, model id) -> durations of the model calls whose replies were stored.
    model_calls: Mapping[tuple[str, str], Durations] = field(default_factory=dict)
    #: (agent, model id) -> time to first text of the streamed calls whose replies were stored.
    first_token: Mapping[tuple[str, str], Durations] = field(default_factory=dict)
    #: (agent, tool) -> durations of the calls of the agents' tools whose results were stored.
    tools: Mapping[tuple[str, str], Durations] = field(default_factory=dict)
    #: (agent, final status) -> from each run's creation to each of its moves to a final status.
    run_duration: Mapping[tuple[str, str], Durations] = field(default_factory=dict)
    #: (agent, "model" | "tools") -> durations of the steps that committed, claim to commit.
    steps: Mapping[tuple[str, str], Durations] = field(default_factory=dict)
    #: (agent, pause_type) -> time to decision: from a pause to each decision of what it asked
    #: (`DECISION_BUCKETS`); the agent is the run's that asked (a member's, in a team).
    decisions: Mapping[tuple[str, str], Durations] = field(default_factory=dict)
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
    started: dict[str, int] = {}
    bounds = {"step": BUCKETS, "decision": DECISION_BUCKETS, **latencies.HISTOGRAMS}
    timed: dict[str, dict[tuple[str, str], dict[str, float]]] = {name: defaultdict(dict) for name in bounds}
    for (name, agent, label), value in counted.items():
        if name == "event":
            events_[(agent, label)] = round(value)
        elif name == "tokens":
            tokens[(agent, label)] = round(value)
        elif name == "cost":
            cost[agent] = value
        elif name == "started":
            started[agent] = round(value)
        elif name in timed:
            key, _, part = label.rpartition(":")  # a model id may hold a colon; a part never does
            timed[name][(agent, key)][part] = value
    final = latencies.FINAL_EVENTS
    h = {name: _durations(parts, bounds[name]) for name, parts in timed.items()}
    return MetricsSnapshot(
        runs=stored,
        events=events_,
        tokens=tokens,
        cost=cost,
        started=started,
        finished={(agent, final[kind]): n for (agent, kind), n in events_.items() if kind in final},
        steps=h["step"],
        decisions=h["decision"],
        queue_wait=h["queue"],
        model_calls=h["model_call"],
        first_token=h["first_token"],
        tools=h["tool"],
        run_duration=h["run"],
    )


def _durations(
    counted: Mapping[tuple[str, str], Mapping[str, float]], bounds: tuple[float, ...]
) -> dict[tuple[str, str], Durations]:
    return {
        key: Durations(
            buckets=tuple((b, round(parts.get(f"le={b:g}", 0))) for b in bounds),
            count=round(parts.get("count", 0)),
            sum=parts.get("sum", 0.0),
        )
        for key, parts in counted.items()
    }


def _sums(conn: Connection, *, after: float, upto: float | None, run_ids: Collection[str] = ()) -> dict[Key, float]:
    """What the rows written in (after, upto] (of `run_ids` only, if given) add to each counter."""
    sums: dict[Key, float] = {}
    for row in conn.execute(_events_query(after, upto, run_ids)):
        agent, kind, count, poison, by_cancel = row
        sums[("event", agent, kind)] = count - (by_cancel or 0)
        if poison:
            sums[("event", agent, "poison")] = poison
        if by_cancel:
            sums[("event", agent, "cancelled_step")] = by_cancel
    for agent, count in conn.execute(_started_query(after, upto, run_ids)):
        sums[("started", agent, "")] = count
    sums.update(latencies.sums(conn, after, upto, run_ids))
    for row in conn.execute(_messages_query(after, upto, run_ids)):
        values = row._mapping
        agent = values["agent"]
        if values["role"] == "assistant":
            for label, column in TOKEN_KINDS.items():
                if values[column] is None and label in _ONLY_REPORTED:
                    continue
                sums[("tokens", agent, label)] = values[column] or 0
            sums[("cost", agent, "")] = values["cost"] or 0.0
        kind = "model" if values["role"] == "assistant" else "tools"
        if values["steps"]:
            sums[("step", agent, f"{kind}:count")] = values["steps"]
            sums[("step", agent, f"{kind}:sum")] = values["seconds"]
            for b in BUCKETS:
                sums[("step", agent, f"{kind}:le={b:g}")] = values[f"le={b:g}"]
    for agent, kind, seconds in _decisions(conn, after, upto, run_ids):
        for part, value in [("count", 1.0), ("sum", seconds)] + [
            (f"le={b:g}", 1.0) for b in DECISION_BUCKETS if seconds <= b
        ]:
            key = ("decision", agent, f"{kind}:{part}")
            sums[key] = sums.get(key, 0.0) + value
    return {key: value for key, value in sums.items() if value}


def _decisions(
    conn: Connection, after: float, upto: float | None, run_ids: Collection[str]
) -> list[tuple[str, str, float]]:
    """(agent, pause_type, seconds from the pause to the decision) of each decision logged in the
    window: its event (a row only ever added, read by its time) and the requirement it names."""
    e = events
    where = [e.c.kind == "decision", _window(e.c.at, after, upto)]
    if run_ids:
        where.append(e.c.run_id.in_(list(run_ids)))
    logged = conn.execute(select(_AGENT, e.c.at, e.c.detail).select_from(_with_agent(e)).where(*where)).all()
    named = [(row.agent, row.at, str(json.loads(row.detail or "{}").get("requirement"))) for row in logged]
    ids = sorted({requirement for _, _, requirement in named})
    asked: dict[str, Any] = {}
    for i in range(0, len(ids), 500):  # within every database's limit of bound parameters
        r = requirements.c
        query = select(r.id, r.pause_type, r.created_at, r.decided_at).where(r.id.in_(ids[i : i + 500]))
        asked.update((row.id, row) for row in conn.execute(query))
    found = [(agent, at, asked[requirement]) for agent, at, requirement in named if requirement in asked]
    return [(agent, row.pause_type, max((row.decided_at or at) - row.created_at, 0.0)) for agent, at, row in found]


def _window(column: Any, after: float, upto: float | None) -> Any:
    return and_(column > after, column <= upto if upto is not None else true())


def _with_agent(table: Any) -> Any:
    """`table` joined to its rows' runs, for their agent ("" once the run is gone)."""
    return table.outerjoin(runs, runs.c.run_id == table.c.run_id)


_AGENT = func.coalesce(runs.c.agent_name, "").label("agent")


def _events_query(after: float, upto: float | None, run_ids: Collection[str]) -> Any:
    e = events
    poison = case((and_(e.c.kind == "error", e.c.detail.like(_POISON)), 1), else_=0)
    by_cancel = case((and_(e.c.kind == "fenced", e.c.detail.like(_BY_CANCEL)), 1), else_=0)
    where = [e.c.kind.in_(EVENT_KINDS), _window(e.c.at, after, upto)]
    if run_ids:
        where.append(e.c.run_id.in_(list(run_ids)))
    rows = (
        select(_AGENT, e.c.kind, poison.label("poison"), by_cancel.label("by_cancel"))
        .select_from(_with_agent(e))
        .where(*where)
        .subquery()
    )
    return select(
        rows.c.agent, rows.c.kind, func.count(), func.sum(rows.c.poison), func.sum(rows.c.by_cancel)
    ).group_by(rows.c.agent, rows.c.kind)


def _started_query(after: float, upto: float | None, run_ids: Collection[str]) -> Any:
    """Runs created in the window, by agent (their rows' `created_at`, which nothing changes)."""
    r = runs.c
    where = [_window(r.created_at, after, upto)]
    if run_ids:
        where.append(r.run_id.in_(list(run_ids)))
    return select(r.agent_name, func.count()).where(*where).group_by(r.agent_name)


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
