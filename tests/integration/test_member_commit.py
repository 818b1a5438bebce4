"""A team member's final commit and its team's fan-in are one transaction
(`delegation.commit_and_fan_in`, `Store.teams`), on both databases: no crash can come between."""

from __future__ import annotations

import uuid

import pytest

from orchestrator import Agent, Team
from orchestrator.delegation import commit_and_fan_in
from orchestrator.messages import Message
from orchestrator.models import OpenAIChat
from orchestrator.run import RunRecord
from orchestrator.status import RunStatus as S
from orchestrator.store import Claim, Store
from orchestrator.store.teams import FanIn
from tests.support import waiting_team


def _member_claimed(store: Store) -> tuple[str, Claim]:
    """A team waiting on its one member, and that member's first step claimed."""
    t = uuid.uuid4().hex[:6]
    member = Agent(name=f"member-{t}", model=OpenAIChat(id="m"))
    team_id = waiting_team(store, Team(name=f"team-{t}", model=OpenAIChat(id="leader"), members=[member]), [member])
    (child,) = store.children(team_id)
    claim = store.claim(child.run_id, child.seq, "model", owner="test", lease_seconds=30, max_attempts=5)
    assert claim is not None
    return team_id, claim


def test_the_members_answer_and_the_teams_wake_land_together(db_url: str) -> None:
    store = Store.open(db_url)
    team_id, claim = _member_claimed(store)

    committed, woken = commit_and_fan_in(
        store, claim, [Message(role="assistant", content="done")], status=S.COMPLETED, publish_grace=30, content="done"
    )

    assert committed.status == S.COMPLETED
    assert woken is not None and (woken.run_id, woken.status) == (team_id, S.QUEUED)
    assert [m.content for m in store.get_messages(team_id) if m.role == "tool"] == ["done"]


def test_a_fan_in_that_fails_leaves_the_members_step_uncommitted(db_url: str) -> None:
    store = Store.open(db_url)
    team_id, claim = _member_claimed(store)
    seen: list[S] = []

    def decide(team: RunRecord, messages: list[Message], members: list[RunRecord]) -> FanIn | None:
        seen.extend(m.status for m in members)  # the member's commit is visible to its fan-in
        raise RuntimeError("the team could not be moved")

    with pytest.raises(RuntimeError, match="could not be moved"):
        store.teams.commit_step_and_fan_in(
            claim,
            [Message(role="assistant", content="done")],
            decide,
            status=S.COMPLETED,
            next_step=None,
            publish_grace=30,
            content="done",
        )

    assert seen == [S.COMPLETED]
    record = store.get_record(claim.run_id)
    assert (record.status, record.seq, record.epoch) == (S.RUNNING, 0, claim.epoch)
    assert [m.role for m in store.get_messages(claim.run_id)] == ["user"]
    assert store.get_record(team_id).status == S.WAITING
