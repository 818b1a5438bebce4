"""The failure handler's write is fenced like every other write of a step: by the claim's epoch
and its owner. On PostgreSQL a claim lost in a database crash (it commits without waiting for
its WAL flush) can have its epoch number taken by the next claim; the owner still tells them apart.
"""

from __future__ import annotations

from orchestrator.messages import Message
from orchestrator.settings import Settings
from orchestrator.status import RunStatus
from orchestrator.store import Store
from tests.support import new_run


def test_a_failure_handler_whose_claim_was_lost_cannot_fail_the_new_holders_run(settings: Settings) -> None:
    # Given a run claimed by w2 at the epoch number w1's lost claim had
    store = Store.open(settings.database_url)
    run_id = new_run(store, text="hi")
    claim = store.claim(run_id, 0, "model", owner="w2", lease_seconds=30, max_attempts=5)
    assert claim is not None

    # When w1's failure handler writes its ERROR row at that epoch
    failed = store.fail(
        run_id, epoch=claim.epoch, owner="w1", error={"type": "X", "message": "w1's error"},
        inflight=[Message(role="assistant", content="w1's reply")],
    )  # fmt: skip

    # Then nothing changes: w2 still holds the run, and no message of w1's was appended
    assert failed is None
    record = store.get_record(run_id)
    assert record.status == RunStatus.RUNNING and record.lease_owner == "w2"
    assert [m.content for m in store.get_messages(run_id)] == ["hi"]
    # And w2's own failure handler can
    assert store.fail(run_id, epoch=claim.epoch, owner="w2", error={"type": "X", "message": "m"}) is not None


def test_arguments_nested_deeper_than_the_stack_allows_still_store(settings: Settings) -> None:
    deep: dict[str, object] = {}
    node = deep
    for _ in range(5000):
        node["a"] = {}
        node = node["a"]  # type: ignore[assignment]
    row = Message(role="tool", tool_call_id="c", tool_name="t", content="x", tool_args=deep).to_row()
    assert "nested too deeply" in row["tool_args"]
