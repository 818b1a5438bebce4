"""What a Prometheus scrape of `ratchet api` costs on a large store: `python -m bench.metrics_scrape
[--runs N] [--db pg,sqlite]` prints the figures (absolute milliseconds on this machine).

A private database (PostgreSQL, and a SQLite file), migrated, is filled by set-based INSERT ...
SELECT statements, not through Ratchet, with N runs (300,000) of 20 agents over 30 days, each
with four messages (the user's, a reply with a tool call, its result, the final reply; the
replies carry usage and cost, the step commits their claim time), and a retry or an error event
for one run in ten: 1.2 million messages. The last 200 runs are written after the first scrape,
stamped within the last minute: the rows each later scrape sums live. Then, on a warm cache:

- *first scrape*: the first `Store.metrics()` after the migration, which folds every stored row
  into the totals once (what upgrading a large store costs, on its first scrape only);
- *scrape*: `Store.metrics()` from then on (fold the rows settled since, sum the last minute
  live, count runs by agent and status), median of the rounds; *exposition*: the same plus
  formatting it as Prometheus text (`workers.prometheus.exposition`), which /metrics serves;
- *runs by agent and status*: the GROUP BY over every run alone (part of each scrape);
- *naive sums*: the counters summed over every row at each scrape, as they would be without the
  stored totals: what the totals save.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, func, select, text

from bench.env import bench_env
from orchestrator.client import Client
from orchestrator.ports import StepRef
from orchestrator.store import Store
from orchestrator.store import metrics as store_metrics
from orchestrator.store.tables import runs
from workers.prometheus import exposition

AGENTS, DAYS, RECENT = 20, 30, 200

_SERIES = {
    "postgresql": "SELECT g FROM generate_series(:first, :last) g",
    "sqlite": "WITH RECURSIVE s(g) AS (SELECT :first UNION ALL SELECT g + 1 FROM s WHERE g < :last) SELECT g FROM s",
}
# A run's times: the newest RECENT runs in the last minute, the others spread over DAYS days.
_AT = "CASE WHEN g > :n - :recent THEN :now - 50 + (g % 40) ELSE :start + g * :step END"
_SESSIONS = "INSERT INTO ratchet_sessions (session_id, created_at) SELECT 's-' || g, :start FROM ({series}) AS x"
_RUNS = f"""
INSERT INTO ratchet_runs (run_id, session_id, agent_name, kind, status, epoch, seq, n_messages, attempts, retries,
    created_at, updated_at, stream)
SELECT 'r-' || g, 's-' || g, 'agent-' || (g % {AGENTS}), 'agent',
    CASE WHEN g % 100 < 90 THEN 'COMPLETED' WHEN g % 100 < 97 THEN 'ERROR' ELSE 'CANCELLED' END,
    1, 3, 4, 0, 0, {_AT}, {_AT} + 3, false
FROM ({{series}}) AS x
"""
_MESSAGES = f"""
INSERT INTO ratchet_messages (run_id, idx, role, content, tool_call_error, created_at, seq, epoch, input_tokens,
    output_tokens, cache_read_tokens, reasoning_tokens, cost, step_started_at)
SELECT 'r-' || g, i, CASE i WHEN 0 THEN 'user' WHEN 2 THEN 'tool' ELSE 'assistant' END,
    'some text of a message', false, {_AT} + i, i, 1,
    CASE WHEN i IN (1, 3) THEN 1200 + g % 50 END, CASE WHEN i IN (1, 3) THEN 80 END,
    CASE WHEN i IN (1, 3) THEN 600 END, CASE WHEN i IN (1, 3) THEN 20 END,
    CASE WHEN i IN (1, 3) THEN 0.0031 END, CASE WHEN i > 0 THEN {_AT} + i - 0.4 - (g % 7) * 0.1 END
FROM ({{series}}) AS x CROSS JOIN (SELECT 0 AS i UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3) AS m
"""
_EVENTS = f"""
INSERT INTO ratchet_events (run_id, at, kind, seq, detail)
SELECT 'r-' || g, {_AT} + 1, CASE WHEN g % 100 < 90 THEN 'retry' ELSE 'error' END, 1,
    '{{{{"type": "ModelCallError", "message": "the provider answered 500"}}}}'
FROM ({{series}}) AS x WHERE g % 10 = 0
"""


def fill(engine: Engine, n: int, first: int, last: int) -> float:
    """Write runs `first` to `last` of `n` with their messages and events; the seconds it took."""
    began = time.monotonic()
    now = time.time()
    params = {"n": n, "now": now, "start": now - DAYS * 86400, "step": (DAYS * 86400 - 120) / n, "recent": RECENT}
    params.update(first=first, last=last)
    series = _SERIES[engine.dialect.name]
    with engine.begin() as conn:
        for statement in (_SESSIONS, _RUNS, _MESSAGES, _EVENTS):
            conn.execute(text(statement.format(series=series)), params)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE" if engine.dialect.name == "postgresql" else "ANALYZE"))
    return time.monotonic() - began


class _NoBroker:
    """A dispatcher with no queues to count: the figures are the store's."""

    def publish(self, step: StepRef) -> None:
        raise AssertionError("nothing is published")


def timed(call: Callable[[], Any], rounds: int) -> float:
    """The median milliseconds of `rounds` calls, after one to warm up."""
    call()
    samples = []
    for _ in range(rounds):
        began = time.perf_counter()
        call()
        samples.append((time.perf_counter() - began) * 1000)
    return statistics.median(samples)


def measure(url: str, settings: Any, n: int, rounds: int) -> dict[str, float]:
    store = Store.open(url)
    fill_s = fill(store.engine, n, 1, n - RECENT)
    began = time.perf_counter()
    store.metrics()
    first_ms = (time.perf_counter() - began) * 1000
    fill(store.engine, n, n - RECENT + 1, n)  # the last minute's runs, summed live by each scrape
    client = Client(settings, store=store, dispatcher=_NoBroker())
    grouped = select(runs.c.agent_name, runs.c.status, func.count()).group_by(runs.c.agent_name, runs.c.status)

    def group() -> None:
        with store.quick_engine.connect() as conn:
            conn.execute(grouped).all()

    def naive() -> None:
        with store.quick_engine.connect() as conn:
            store_metrics._sums(conn, after=0.0, upto=None)

    figures = {
        "fill_s": fill_s,
        "first_scrape_ms": first_ms,
        "scrape_ms": timed(store.metrics, rounds),
        "exposition_ms": timed(lambda: exposition(client), rounds),
        "runs_by_agent_status_ms": timed(group, rounds),
        "naive_sums_ms": timed(naive, max(3, rounds // 5)),
    }
    snapshot = store.metrics()
    assert snapshot.events[("agent-0", "retry")] > 0 and sum(snapshot.runs.values()) == n
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.metrics_scrape", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300_000)
    parser.add_argument("--db", default="pg,sqlite")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args(argv)
    with bench_env() as env:
        for db in args.db.split(","):
            url = env.fresh_url(db, "metrics")
            figures = measure(url, env.settings(url, "metrics"), args.runs, args.rounds)
            rows = ", ".join(f"{k} {v:.1f}" for k, v in figures.items())
            print(f"{db}: {args.runs} runs, {4 * args.runs} messages, {args.runs // 10} events: {rows}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
