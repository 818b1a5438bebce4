"""Ratchet's metrics in Prometheus's text format: `GET /metrics` of `ratchet api`, and `ratchet
metrics` (the same text on stdout, e.g. for node_exporter's textfile collector).

Steps run in worker processes on other hosts, so nothing is counted in the process that serves
the metrics: every value is read from the run store when scraped (`Client.metrics`,
`orchestrator.store.metrics`), and the queue lengths from the broker. Any API process gives the
same values, so Prometheus may scrape any one of them (or all: the series are the same, so
aggregate them with max, not sum). Labels are agent names, statuses, kinds and queue names:
never a run id or anything a user typed. Counters and histograms are sums over rows only ever
added, kept in stored totals when runs are deleted: none goes down, not on `ratchet prune` either.

    ratchet_runs{agent,status}                      runs stored in each status now (gauge)
    ratchet_runs_started_total{agent}               runs started (created)
    ratchet_runs_finished_total{agent,status}       moves to a final status: COMPLETED, ERROR, CANCELLED, PAUSED
    ratchet_retries_total{agent}                    model calls parked to be tried again
    ratchet_sweeper_recoveries_total{agent}         steps the sweeper took back from a worker whose lease expired
    ratchet_fenced_writes_total{agent}              a worker's writes refused: its lease had been taken over
    ratchet_cancelled_steps_total{agent}            a step's writes refused: its run was cancelled while it ran
    ratchet_run_errors_total{agent}                 moves to ERROR (poison steps included)
    ratchet_poison_steps_total{agent}               steps failed after RATCHET_MAX_STEP_ATTEMPTS claims
    ratchet_pauses_total{agent}                     runs moved to PAUSED (ratchet_runs{status="PAUSED"}: paused now)
    ratchet_tokens_total{agent,kind}                tokens the providers reported: input, output, cache_read, reasoning
    ratchet_cost_usd_total{agent}                   the replies' cost in US dollars, at the models' Prices
    ratchet_step_duration_seconds{agent,kind}       claim to commit of each step that committed: model, tools
    ratchet_queue_wait_seconds{agent,kind}          queued to claimed, of each step that committed: model, tools
    ratchet_model_call_duration_seconds{agent,model}        each model call whose reply was stored
    ratchet_model_time_to_first_token_seconds{agent,model}  a streamed call to its first text
    ratchet_tool_duration_seconds{agent,tool}       each call of one of the agent's tools whose result was stored
    ratchet_run_duration_seconds{agent,status}      a run's creation to each of its moves to a final status
    ratchet_time_to_decision_seconds{agent,kind}    a pause to each decision of what it asked, by pause type
    ratchet_queue_length{queue}                     messages waiting in the broker's queues (gauge)

Labels are bounded: `model` is the model id the agent configured, `tool` a tool the agent has.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import choose_encoder

from orchestrator.client import Client
from orchestrator.status import RunStatus
from orchestrator.store.metrics import Durations, MetricsSnapshot

#: Run event kinds (`MetricsSnapshot.events`) and the counter each is served as.
EVENT_COUNTERS = {
    "retry": ("ratchet_retries", "Model calls that failed and were parked to be tried again."),
    "lease_expired": (
        "ratchet_sweeper_recoveries",
        "Steps the sweeper took back (re-queued) from a worker that stopped renewing its lease.",
    ),
    "fenced": ("ratchet_fenced_writes", "Writes of a worker refused because its lease had been taken over."),
    "cancelled_step": (
        "ratchet_cancelled_steps",
        "Steps whose writes were refused because their run was cancelled while they ran.",
    ),
    "error": ("ratchet_run_errors", "Runs moved to ERROR (poison steps included)."),
    "poison": ("ratchet_poison_steps", "Steps failed after RATCHET_MAX_STEP_ATTEMPTS claims whose workers died."),
    "paused": ("ratchet_pauses", "Runs moved to PAUSED: waiting for a person (a team: for its member's)."),
}


class RatchetCollector:
    """A Prometheus collector that reads `client.metrics()` at each scrape."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def collect(self) -> Iterator[Metric]:
        yield from families(self.client.metrics())


def families(snapshot: MetricsSnapshot) -> Iterator[Metric]:
    """The snapshot as Prometheus metric families."""
    runs = GaugeMetricFamily("ratchet_runs", "Runs stored, by agent and status, now.", labels=["agent", "status"])
    for agent in sorted({agent for agent, _ in snapshot.runs}):
        for status in RunStatus:  # every status of an agent, 0 where none: a series to alert on
            runs.add_metric([agent, status.value], snapshot.runs.get((agent, status.value), 0))
    yield runs
    started = CounterMetricFamily("ratchet_runs_started", "Runs started (created), by agent.", labels=["agent"])
    for agent, n in sorted(snapshot.started.items()):
        started.add_metric([agent], n)
    yield started
    finished = CounterMetricFamily(
        "ratchet_runs_finished",
        "Moves of runs to a final status (COMPLETED, ERROR, CANCELLED, PAUSED); a run continued counts again.",
        labels=["agent", "status"],
    )
    for (agent, final), n in sorted(snapshot.finished.items()):
        finished.add_metric([agent, final], n)
    yield finished
    for kind, (name, documentation) in EVENT_COUNTERS.items():
        counter = CounterMetricFamily(name, documentation, labels=["agent"])
        for (agent, event), value in sorted(snapshot.events.items()):
            if event == kind:
                counter.add_metric([agent], value)
        yield counter
    tokens = CounterMetricFamily(
        "ratchet_tokens", "Tokens of the stored replies, as the providers reported them.", labels=["agent", "kind"]
    )
    for (agent, kind), value in sorted(snapshot.tokens.items()):
        tokens.add_metric([agent, kind], value)
    yield tokens
    cost = CounterMetricFamily(
        "ratchet_cost_usd", "Cost of the stored replies in US dollars, at the models' Prices.", labels=["agent"]
    )
    for agent, spent in sorted(snapshot.cost.items()):
        cost.add_metric([agent], spent)
    yield cost
    steps = HistogramMetricFamily(
        "ratchet_step_duration_seconds",
        "Seconds from a step's claim to its commit, for the steps that committed, by kind (model, tools).",
        labels=["agent", "kind"],
    )
    _histogram(steps, snapshot.steps)
    yield steps
    yield from _latencies(snapshot)
    decisions = HistogramMetricFamily(
        "ratchet_time_to_decision_seconds",
        "Seconds from a pause to each decision of what it asked, by what it asked "
        "(confirmation, user_input, external_execution, budget).",
        labels=["agent", "kind"],
    )
    _histogram(decisions, snapshot.decisions)
    yield decisions
    if snapshot.queues is not None:
        queues = GaugeMetricFamily(
            "ratchet_queue_length", "Messages waiting in the broker's queues (not yet delivered).", labels=["queue"]
        )
        for queue, length in sorted(snapshot.queues.items()):
            queues.add_metric([queue], length)
        yield queues


#: The latency histograms: name, help, second label, and the snapshot's field.
LATENCIES = (
    ("ratchet_queue_wait_seconds", "Seconds from a step's move to QUEUED to its claim, for the steps that "
     "committed, by kind (model, tools); a retried call's wait includes its backoff.", "kind", "queue_wait"),
    ("ratchet_model_call_duration_seconds", "Seconds each model call took, for the replies stored, by the model "
     "id the agent configured.", "model", "model_calls"),
    ("ratchet_model_time_to_first_token_seconds", "Seconds from a streamed model call to its first text, for "
     "the replies stored, by model id.", "model", "first_token"),
    ("ratchet_tool_duration_seconds", "Seconds each call of one of the agent's tools took, for the results "
     "stored, by tool.", "tool", "tools"),
    ("ratchet_run_duration_seconds", "Seconds from a run's creation to each of its moves to a final status, by "
     "that status.", "status", "run_duration"),
)  # fmt: skip


def _latencies(snapshot: MetricsSnapshot) -> Iterator[Metric]:
    for name, documentation, label, attribute in LATENCIES:
        family = HistogramMetricFamily(name, documentation, labels=["agent", label])
        _histogram(family, getattr(snapshot, attribute))
        yield family


def _histogram(family: HistogramMetricFamily, counted: Mapping[tuple[str, str], Durations]) -> None:
    for (agent, kind), durations in sorted(counted.items()):
        buckets = [(f"{bound:g}", float(count)) for bound, count in durations.buckets]
        family.add_metric([agent, kind], [*buckets, ("+Inf", float(durations.count))], durations.sum)


def registry(client: Client) -> CollectorRegistry:
    """A registry holding only Ratchet's collector on `client`."""
    found = CollectorRegistry(auto_describe=False)
    found.register(RatchetCollector(client))
    return found


def exposition(client: Client, accept: str | None = None) -> tuple[bytes, str]:
    """The metrics, read now, and their content type: in the format the `accept` header asks for
    (OpenMetrics, for a Prometheus that asks for it), else Prometheus's text format 0.0.4."""
    encode, content_type = choose_encoder(accept or "")
    return encode(registry(client)), content_type


def add_metrics_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `ratchet metrics` to the command line's subcommands."""
    p = sub.add_parser("metrics", help="print the metrics `ratchet api` serves at /metrics (Prometheus text)")
    p.set_defaults(func=cmd_metrics)


def cmd_metrics(args: argparse.Namespace) -> int:
    text, _ = exposition(Client())
    sys.stdout.write(text.decode())
    return 0
