"""#25 point 9: what a person's decision costs to act on, and what a PAUSED run costs the fleet.

**A decision to the resumed step's claim.** On one database, runs of `bench-approve` (a model
step asks for one call of `approve_me`, which needs a person's confirmation) are PAUSED before
the rounds start. A Ratchet round calls `Client.decide` on one of them in this process and takes
the time from that call to the claim of the tool step it resumed (the claim time the step's commit
stamps on the tool result it writes, `step_started_at`, on the same machine's clock); then the run
completes before the next round. A floor round writes a row in one SQLAlchemy transaction, sends
a one-hop bare Celery chain (bench/floor.py) and takes the time from before that transaction to
the start of the hop (the time its hop stamps as it begins its own transaction). Interleaved on the
rig's workers; the ratio is the median of the paired ratios. What the decision does beyond the
floor's one transaction: it locks its run, stores the decision with its event, finds nothing else
pending, moves the run to QUEUED; its producer publishes the step, and the worker claims it (a
transaction the floor's hop does not have).

**A PAUSED run costs the fleet nothing.** With every prepared run PAUSED (and the workers idle),
the tasks the broker holds for the rig's queues (waiting, and delivered but not acked) and the
paused runs that hold a lease are counted: both must be 0. A paused run is a row and its
requirements, nothing else.
"""

from __future__ import annotations

import time
import uuid

import redis
from sqlalchemy import func, select

from bench.floor import chains_done, start_chain
from bench.rig import Rig
from bench.stats import Row, Section, interleave, median, paired_ratios, wait_until
from orchestrator.requirements import Decision
from orchestrator.status import RunStatus
from orchestrator.store.tables import messages

AGENT = "bench-approve"
INPUT = "batches=1"


def measure(rig: Rig, *, rounds: int, warmup: int = 2) -> Section:
    runs = _paused(rig, rounds + warmup)
    tasks, leases = _held(rig, runs)
    ready = iter(runs)
    decided: list[float] = []  # of each round: Client.decide's own time (its transaction, the publish)

    def ratchet_round() -> float:
        run_id = next(ready)
        [req] = rig.client.get_run(run_id).active_requirements
        t0 = time.time()
        rig.client.decide(run_id, req.id, Decision(kind="confirm"), by="bench")
        decided.append((time.time() - t0) * 1000)
        claimed = wait_until(lambda: _claimed_at(rig, run_id), 30, what="the resumed step's claim")
        wait_until(lambda: rig.store.get_record(run_id).status.is_final, 30, what="the resumed run")
        assert rig.store.get_record(run_id).status == RunStatus.COMPLETED
        return (claimed - t0) * 1000

    def floor_round() -> float:
        run_id = uuid.uuid4().hex
        t0 = time.time()
        start_chain(rig.floor_engine, rig.floor_app, run_id, 1, rig.floor_queue)
        ((_, hop),) = wait_until(lambda: chains_done(rig.floor_engine, [run_id]), 30, what="the floor hop")
        return (hop - t0) * 1000

    for _ in range(warmup):  # connections, compiled statements, the first decision's imports
        floor_round(), ratchet_round()
    floor, ratchet = interleave(rounds, floor_round, ratchet_round)
    return _section(rig, floor, ratchet, decided[warmup:], (tasks, leases, len(runs)))


def _paused(rig: Rig, n: int) -> list[str]:
    """Start `n` runs and wait until each PAUSED on its call that needs a confirmation."""
    ids = [rig.client.start(AGENT, input=INPUT).run_id for _ in range(n)]
    for run_id in ids:
        record = wait_until(lambda r=run_id: (x := rig.store.get_record(r)).status.is_final and x, 60, what="a pause")
        assert record.status == RunStatus.PAUSED, record
    return ids


def _held(rig: Rig, run_ids: list[str]) -> tuple[int, int]:
    """What the fleet holds for these PAUSED runs: tasks in the broker (every queue of the rig's
    Ratchet worker, and the deliveries not acked that name one of the runs), and leases."""
    queued = sum((rig.client.metrics().queues or {}).values())
    r = redis.Redis.from_url(rig.settings.broker_url)
    try:
        unacked = [body for body in r.hvals("unacked") if any(run_id.encode() in body for run_id in run_ids)]
    finally:
        r.close()
    leases = sum(1 for run_id in run_ids if rig.store.get_record(run_id).lease_owner is not None)
    return queued + len(unacked), leases


def _claimed_at(rig: Rig, run_id: str) -> float | None:
    """When the resumed tool step was claimed, once it committed (its tool result's stamp)."""
    query = select(func.min(messages.c.step_started_at)).where(messages.c.run_id == run_id, messages.c.role == "tool")
    with rig.store.engine.connect() as conn:
        return conn.execute(query).scalar()  # type: ignore[no-any-return]


def _section(
    rig: Rig, floor: list[float], ratchet: list[float], decided: list[float], held: tuple[int, int, int]
) -> Section:
    db, setup = rig.db, rig.setup
    tasks, leases, paused = held
    ratio = median(paired_ratios(ratchet, floor))
    rows = [
        Row(f"Floor: 1 SQLAlchemy tx + 1 Celery hop, to the hop's start ({db})", setup, floor, "ms", digits=2),
        Row(f"Ratchet: Client.decide -> the resumed step's claim ({db})", setup, ratchet, "ms",
            ratio=ratio, ratio_note="vs floor", target="≤ 1.3x", met=ratio <= 1.3, digits=2),
        Row(f"Ratchet: of which Client.decide returned ({db})", setup + ", its transaction and the publish",
            decided, "ms", ratio=median(paired_ratios(decided, floor)), ratio_note="vs floor", digits=2),
        Row(f"A PAUSED run: tasks in the broker, leases held ({db})", f"{setup}, {paused} runs PAUSED",
            [float(tasks + leases)], "", ratio_note=f"{tasks} task(s), {leases} lease(s)", target="0",
            met=tasks + leases == 0, digits=0),
    ]  # fmt: skip
    section = Section(f"A decision and a PAUSED run on {rig.name}", rows=rows)
    section.numbers[f"decision_ratio_{db}"] = ratio
    section.numbers[f"decision_ms_{db}"] = median(ratchet)
    section.numbers[f"decision_floor_ms_{db}"] = median(floor)
    section.numbers[f"paused_tasks_{db}"] = float(tasks)
    section.numbers[f"paused_leases_{db}"] = float(leases)
    return section
