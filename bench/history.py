"""#12 point 8: what session history costs a step.

On one database, interleaved: a run of `bench-history` in a session that already holds 20
completed runs (so its context carries all 20, 80 messages: `num_history_runs=20`), and the same
run of `bench-plain`, which has no history, in a session of its own. Both use `InstantModel`,
whose cost does not grow with the prompt, so the figure is Ratchet's: choosing and storing the
history at the run's first step, reading those runs' messages, and putting them in every model
step's prompt. Each run is model, tools, model (3 steps); time per step is taken from the
database's own timestamps, as for the per-step overhead. Ratio: median of the paired ratios.
"""

from __future__ import annotations

import json
import uuid

from bench.rig import Rig
from bench.stats import Row, Section, interleave, median, paired_ratios, wait_until
from orchestrator.status import RunStatus

HISTORY_RUNS = 20
INPUT = "batches=1"


def measure(rig: Rig, *, rounds: int) -> Section:
    session = f"bench-history-{uuid.uuid4().hex[:8]}"

    def one(agent: str, session_id: str) -> float:
        handle = rig.client.start(agent, input=INPUT, session_id=session_id)
        record = wait_until(
            lambda: (r := rig.store.get_record(handle.run_id)).status.is_final and r, 60, what=f"a {agent} run"
        )
        assert record.status == RunStatus.COMPLETED and record.seq == 3, record
        return (record.updated_at - record.created_at) / record.seq * 1000

    for _ in range(HISTORY_RUNS):  # the session's earlier runs; also warms both agents' paths
        one("bench-history", session)
        one("bench-plain", uuid.uuid4().hex)
    with_history, plain = interleave(
        rounds, lambda: one("bench-history", session), lambda: one("bench-plain", uuid.uuid4().hex)
    )
    check = rig.store.get_record(rig.client.start("bench-history", input=INPUT, session_id=session).wait(30).run_id)
    assert check.history is not None and len(json.loads(check.history)) == HISTORY_RUNS, check.history
    ratios = paired_ratios(with_history, plain)
    db, setup = rig.db, rig.setup
    rows = [
        Row(f"Step without history ({db})", setup + ", model-tools-model runs", plain, "ms", digits=3),
        Row(
            f"Step with {HISTORY_RUNS} runs of history ({db})", setup + f", {HISTORY_RUNS * 4} history messages",
            with_history, "ms", ratio=median(ratios), ratio_note="vs without", target="≤ 1.2x",
            met=median(ratios) <= 1.2, digits=3,
        ),
    ]  # fmt: skip
    section = Section(f"Session history on {rig.name}", rows=rows)
    section.numbers[f"history_step_ratio_{db}"] = median(ratios)
    section.numbers[f"history_step_ms_{db}"] = median(with_history)
    return section
