"""A team member's final commit and its team's fan-in are one transaction
(`Store.commit_and_fan_in`), on both databases: no crash can come between them."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from sqlalchemy import Connection

from orchestrator.messages import Message
from orchestrator.run import RunRecord
from orchestrator.status import RunStatus as S
from orchestrator.store import Claim, Store


def _claimed(store: Store) -> Claim:
    run_id = str(uuid.uuid4())
    store.create_run(
        run_id=run_id,
        session_id=f"s-{run_id[:6]}",
        agent_name="member",
        kind="agent",
        input_messages=[Message(role="user", content="go")],
        publish_grace=30,
    )
    claim = store.claim(run_id, 0, "model", owner="test", lease_seconds=30)
    assert claim is not None
    return claim


def _commit(
    store: Store, claim: Claim, fan_in: Callable[[Connection], RunRecord | None]
) -> tuple[RunRecord, RunRecord | None]:
    return store.commit_and_fan_in(
        claim,
        [Message(role="assistant", content="done")],
        fan_in=fan_in,
        status=S.COMPLETED,
        next_step=None,
        publish_grace=30,
        content="done",
    )


def test_the_fan_in_runs_in_the_commits_transaction_and_sees_the_member_completed(db_url: str) -> None:
    store = Store.open(db_url)
    claim = _claimed(store)
    seen: list[S] = []

    def fan_in(conn: Connection) -> RunRecord | None:
        seen.append(store.get_record(claim.run_id, conn).status)
        return None

    committed, woken = _commit(store, claim, fan_in)

    assert (committed.status, woken, seen) == (S.COMPLETED, None, [S.COMPLETED])
    assert [m.content for m in store.get_messages(claim.run_id)] == ["go", "done"]


def test_a_fan_in_that_fails_leaves_the_members_step_uncommitted(db_url: str) -> None:
    store = Store.open(db_url)
    claim = _claimed(store)

    def fan_in(conn: Connection) -> RunRecord | None:
        raise RuntimeError("the team could not be moved")

    with pytest.raises(RuntimeError, match="could not be moved"):
        _commit(store, claim, fan_in)

    record = store.get_record(claim.run_id)
    assert (record.status, record.seq, record.epoch) == (S.RUNNING, 0, claim.epoch)
    assert [m.content for m in store.get_messages(claim.run_id)] == ["go"]
