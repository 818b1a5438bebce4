"""Flow control with real worker processes sharing one Redis (#13 point 4).

A limit of N runs in progress per key holds across three worker processes: of 10N runs of one
tenant, never more than N are in progress at once (each run's span, from its first model call
to its final commit, lies within the time it held its place), and every run completes once.
A model's request rate parks its steps instead of holding a worker: a worker with one slot
serves another model's runs while the limited model's steps wait out their window."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

import pytest

from orchestrator import RunStatus
from tests.chaos.agents import AGENT, LIMITED_AGENT, RATE_WINDOW, calls
from tests.chaos.harness import Cluster

S = RunStatus
N = 3
pytestmark = [pytest.mark.slow]


def most_at_once(spans: Iterable[tuple[float, float]]) -> int:
    """The most spans open at one instant (a span ending as another starts: not both)."""
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans], key=lambda e: (e[0], e[1]))
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def call_began(cluster: Cluster, run_id: str) -> float:
    """When the worker began the model call of the run's first step, once the limiter had let it
    through: the time of the marker the chaos agents' model writes first (tests/chaos/agents.py)."""
    (marker,) = cluster.dir.glob(f"model-{run_id}-0.*")
    return marker.stat().st_mtime


def throttled(cluster: Cluster, run_id: str) -> list[str]:
    return [str((e.detail or {}).get("reason")) for e in cluster.store.get_log(run_id) if e.kind == "throttled"]


def test_three_workers_keep_a_tenant_to_n_runs_at_once_and_every_run_completes_once(
    make_cluster: Callable[..., Cluster],
) -> None:
    # Given three worker processes of three threads each, and a limit of N runs per key; a wake
    # the sweeper would stand in for only after 20 s, so the runs go on by their releases
    cluster = make_cluster(max_runs_per_key=N, publish_grace_seconds=20.0)
    cluster.script(batches=[calls("a")], delay_s=0.05)  # model, tool, model: 3 steps a run
    cluster.start_workers(3, pool="threads", concurrency=3)
    cluster.start_sweeper()

    # When one tenant starts 10N runs at once (and another tenant one)
    run_ids = [cluster.client.start(AGENT, input=f"run {i}", user_id="tenant-a").run_id for i in range(10 * N)]
    other = cluster.client.start(AGENT, input="other", user_id="tenant-b").run_id

    # Then every run completes once: one call of the model per step, every tool effect once
    outputs = cluster.assert_invariants([*run_ids, other], extra_model_calls=0, timeout=60)
    assert {out.status for out in outputs.values()} == {S.COMPLETED}
    for run_id in run_ids:
        assert list(cluster.effects(run_id).values()) == ["a"], run_id
        assert outputs[run_id].seq == 3 and not [e for e in cluster.store.get_log(run_id) if e.kind == "retry"]
    # and never more than N of the tenant's runs were in progress at once
    spans = [
        (min(r["at"] for r in cluster.model.requests_for(run_id)), cluster.store.get_record(run_id).updated_at)
        for run_id in run_ids
    ]
    assert 2 <= most_at_once(spans) <= N, spans
    # The runs that found no place were parked and woken, not retried
    waited = [run_id for run_id in run_ids if throttled(cluster, run_id)]
    assert len(waited) >= 10 * N - 3 * N, "most runs should have waited for a place"
    assert {reason for run_id in waited for reason in throttled(cluster, run_id)} == {"concurrency"}
    assert not throttled(cluster, other)


def test_a_rate_limited_models_steps_wait_parked_while_a_one_slot_worker_serves_other_runs(
    make_cluster: Callable[..., Cluster],
) -> None:
    # Given one worker with a single slot, and a model allowed one call per window
    cluster = make_cluster()
    cluster.script(batches=[], delay_s=0.02)  # one model call a run
    cluster.start_worker(pool="threads", concurrency=1)
    cluster.start_sweeper()

    # When three runs of the limited model start, then three of an unlimited one
    limited = [cluster.client.start(LIMITED_AGENT, input=f"limited {i}").run_id for i in range(3)]
    free = [cluster.client.start(AGENT, input=f"free {i}").run_id for i in range(3)]

    # Then the unlimited runs complete while the limited ones wait: the slot was not slept in
    cluster.wait_final(free, timeout=30)
    outputs = cluster.assert_invariants([*limited, *free], extra_model_calls=0, timeout=30)
    assert {out.status for out in outputs.values()} == {S.COMPLETED}
    calls_at = sorted(min(r["at"] for r in cluster.model.requests_for(run_id)) for run_id in limited)
    free_done = max(cluster.store.get_record(run_id).updated_at for run_id in free)
    assert free_done < calls_at[-1], "the unlimited runs waited behind a throttled step"
    # The limited model was called once per window, its waiting steps parked, none retried
    # (the agent has retries=0: a park that counted as a retry would have failed the run). When
    # each call began is its marker's time, not its arrival at the model: a worker's first call
    # builds its HTTP client, which on a loaded machine took 0.3 s more than the next call did
    began = sorted(call_began(cluster, run_id) for run_id in limited)
    gaps = [b - a for a, b in itertools.pairwise(began)]
    assert all(gap >= RATE_WINDOW - 0.25 for gap in gaps), gaps  # admitted once per window; called a little later
    assert sorted(len(throttled(cluster, run_id)) > 0 for run_id in limited) == [False, True, True]
    assert {reason for run_id in limited for reason in throttled(cluster, run_id)} == {"requests"}
