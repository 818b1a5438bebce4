"""The histograms of the rate and latency metrics (`store/metrics.py` folds and reads them like
every counter): each a sum over rows that are only ever added, read by their time.

- queue wait, by agent and step kind: a step's claim minus when it was queued, from the messages
  its own commit carries (`step_started_at`, `step_queued_at`);
- model call latency and time to first token, by agent and model id: a reply's `duration` and
  `time_to_first_token` (the worker times its call; first text only on streamed runs);
- tool duration, by agent and tool: a tool result's `duration` (only a tool the agent has);
- run duration, by agent and final status: from the run's creation to each move to a final
  status, from that move's event (a run continued after ERROR counts again when it ends again).

A key is (histogram, agent, "label:part"), `part` being `count`, `sum` or `le=<bound>`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import Any

from sqlalchemy import Connection, and_, case, func, select, true

from orchestrator.store.tables import events, messages, runs

#: Upper bounds of the queue-wait buckets, in seconds (fixed: the stored totals count by them).
QUEUE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0)
#: Upper bounds of the model-call, first-token and tool buckets, in seconds.
CALL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
#: Upper bounds of the run-duration buckets, in seconds: a run takes seconds, or days in PAUSED.
RUN_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0, 14_400.0, 86_400.0, 604_800.0)
#: The events of a move to a final status, and the status each is a move to.
FINAL_EVENTS = {"completed": "COMPLETED", "error": "ERROR", "cancel": "CANCELLED", "paused": "PAUSED"}
#: Each histogram's buckets, by its name in the totals.
HISTOGRAMS = {
    "queue": QUEUE_BUCKETS,
    "model_call": CALL_BUCKETS,
    "first_token": CALL_BUCKETS,
    "tool": CALL_BUCKETS,
    "run": RUN_BUCKETS,
}

Key = tuple[str, str, str]
_AGENT = func.coalesce(runs.c.agent_name, "").label("agent")


def sums(conn: Connection, after: float, upto: float | None, run_ids: Collection[str]) -> Iterator[tuple[Key, float]]:
    """What the rows written in (after, upto] (of `run_ids` only, if given) add to each histogram."""
    for name, query in _sources(after, upto, run_ids):
        bounds = HISTOGRAMS[name]
        rows = query.subquery()
        grouped = select(
            rows.c.agent,
            rows.c.label,
            func.count(),
            func.sum(rows.c.seconds),
            *(func.sum(case((rows.c.seconds <= b, 1), else_=0)) for b in bounds),
        ).group_by(rows.c.agent, rows.c.label)
        for agent, label, count, total, *within in conn.execute(grouped):
            yield (name, agent, f"{label}:count"), float(count)
            yield (name, agent, f"{label}:sum"), float(total or 0.0)
            for bound, n in zip(bounds, within, strict=True):
                yield (name, agent, f"{label}:le={bound:g}"), float(n or 0)


def _sources(after: float, upto: float | None, run_ids: Collection[str]) -> list[tuple[str, Any]]:
    """Each histogram's rows in the window: (agent, label, seconds), seconds known."""
    m, e = messages, events
    written = [_window(m.c.created_at, after, upto)]
    logged = [_window(e.c.at, after, upto), e.c.kind.in_(list(FINAL_EVENTS))]
    if run_ids:
        written.append(m.c.run_id.in_(list(run_ids)))
        logged.append(e.c.run_id.in_(list(run_ids)))
    with_runs = m.outerjoin(runs, runs.c.run_id == m.c.run_id)
    kind = case((m.c.role == "assistant", "model"), else_="tools")

    def rows(label: Any, seconds: Any, *where: Any) -> Any:
        return (
            select(_AGENT, label.label("label"), seconds.label("seconds"))
            .select_from(with_runs)
            .where(*written, *where)
        )

    reply = m.c.role == "assistant"
    ended = case(*((e.c.kind == k, v) for k, v in FINAL_EVENTS.items()))
    # The run's row is there: a deleted run's events were counted before it went (`keep_counted`).
    run_seconds = e.c.at - runs.c.created_at
    return [
        ("queue", rows(kind, m.c.step_started_at - m.c.step_queued_at, m.c.step_queued_at.is_not(None))),
        ("model_call", rows(m.c.model, m.c.duration, reply, m.c.model.is_not(None), m.c.duration.is_not(None))),
        (
            "first_token",
            rows(
                m.c.model, m.c.time_to_first_token, reply, m.c.model.is_not(None), m.c.time_to_first_token.is_not(None)
            ),
        ),
        (
            "tool",
            rows(
                m.c.tool_name, m.c.duration, m.c.role == "tool", m.c.tool_name.is_not(None), m.c.duration.is_not(None)
            ),
        ),
        (
            "run",
            select(runs.c.agent_name.label("agent"), ended.label("label"), run_seconds.label("seconds"))
            .select_from(e.join(runs, runs.c.run_id == e.c.run_id))
            .where(*logged),
        ),
    ]


def _window(column: Any, after: float, upto: float | None) -> Any:
    return and_(column > after, column <= upto if upto is not None else true())
