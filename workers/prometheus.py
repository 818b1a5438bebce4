"""Ratchet's metrics in Prometheus's text format: `GET /metrics` of `ratchet api`, and `ratchet
metrics` (the same text on stdout, e.g. for node_exporter's textfile collector).

Steps run in worker processes on other hosts, so nothing is counted in the process that serves
the metrics: every value is read from the run store when scraped (`Client.metrics`,
`orchestrator.store.metrics`), and the queue lengths from the broker. Any API process gives the
same values, so Prometheus may scrape any one of them (or all: the series are the same, so
aggregate them with max, not sum). Labels are agent names, statuses, kinds and queue names:
never a run id or anything a user typed.

    ratchet_runs{agent,status}                      runs stored in each status now (gauge)
    ratchet_retries_total{agent}                    model calls parked to be tried again
    ratchet_sweeper_recoveries_total{agent}         steps the sweeper took back from a worker whose lease expired
    ratchet_fenced_writes_total{agent}              a worker's writes refused: its lease had been taken over
    ratchet_run_errors_total{agent}                 moves to ERROR (poison steps included)
    ratchet_poison_steps_total{agent}               steps failed after RATCHET_MAX_STEP_ATTEMPTS claims
    ratchet_pauses_total{agent}                     runs moved to PAUSED (ratchet_runs{status="PAUSED"}: paused now)
    ratchet_tokens_total{agent,kind}                tokens the providers reported: input, output, cache_read, reasoning
    ratchet_cost_total{agent}                       the replies' cost, in the currency of the models' Prices
    ratchet_step_duration_seconds{agent,kind}       claim to commit of each step that committed: model, tools
    ratchet_time_to_decision_seconds{agent,kind}    a pause to each decision of what it asked, by pause type
    ratchet_queue_length{queue}                     messages waiting in the broker's queues (gauge)
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
        "ratchet_cost", "Cost of the stored replies, in the currency of the models' Prices.", labels=["agent"]
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
