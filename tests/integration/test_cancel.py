"""Cancelling a team: the cascade reaches every member run, whatever the members do meanwhile."""

from __future__ import annotations

import uuid

from sqlalchemy import Connection, Engine

from orchestrator import Agent, Client, RunStatus, Team
from orchestrator.delegation import Delegation, start_members
from orchestrator.messages import Message, ToolCall
from orchestrator.models import OpenAIChat
from orchestrator.run import RunRecord
from orchestrator.settings import Settings
from orchestrator.store import Store
from orchestrator.team import TO_MEMBER
from tests.integration.producing import complete

S = RunStatus


class MemberFinishesDuringTheCancel(Store):
    """The real store; but when the cancel lists a team's members, one of them commits its final
    answer right after the list was read, as its worker would at that moment. The cascade then
    works from a list in which that member is still QUEUED."""

    def __init__(self, engine: Engine, *, team_id: str, member_id: str) -> None:
        super().__init__(engine)
        self.team_id, self.member_id = team_id, member_id
        self.finished = False

    def children(self, run_id: str, conn: Connection | None = None) -> list[RunRecord]:
        members = super().children(run_id, conn)
        if conn is None and run_id == self.team_id and not self.finished:
            self.finished = True
            complete(self, self.member_id, "finished just in time")
        return members


def test_a_member_that_completes_while_its_team_is_cancelled_does_not_stop_the_cascade(settings: Settings) -> None:
    # Given a team WAITING on three members, all QUEUED
    store = Store.open(settings.database_url)
    team_id, members = waiting_team(store, 3)
    first, second, third = members
    racing = MemberFinishesDuringTheCancel(store.engine, team_id=team_id, member_id=second)

    # When the team is cancelled and the second member completes as the cascade starts
    out = Client(settings, store=racing).cancel(team_id)

    # Then the team and every other member are cancelled; the member that finished keeps its answer
    assert racing.finished
    assert out.status == S.CANCELLED
    status = {m.run_id: m.status for m in out.member_runs}
    assert status == {first: S.CANCELLED, second: S.COMPLETED, third: S.CANCELLED}
    assert store.get_record(second).content == "finished just in time"


def test_cancelling_a_team_skips_members_that_ended_and_reaches_members_of_members(settings: Settings) -> None:
    # Given a team whose first member completed, and whose second member is a team waiting itself
    store = Store.open(settings.database_url)
    team_id, (done, sub_team) = waiting_team(store, 2)
    complete(store, done)
    sub_members = start_delegation(store, sub_team, 1)

    out = Client(settings, store=store).cancel(team_id)

    assert out.status == S.CANCELLED
    assert [store.get_record(r).status for r in (done, sub_team, *sub_members)] == [
        S.COMPLETED,
        S.CANCELLED,
        S.CANCELLED,
    ]
    assert Client(settings).cancel(team_id).status == S.CANCELLED  # a second cancel is a no-op


def waiting_team(store: Store, n: int) -> tuple[str, list[str]]:
    """A team run that delegated to `n` members, through the code a tool step uses: the team is
    WAITING and its members QUEUED. Returns the team's run id and the members' in order."""
    team_id = f"team-{uuid.uuid4().hex[:8]}"
    store.create_run(
        run_id=team_id, session_id=f"s-{team_id}", agent_name=team_id, kind="team",
        input_messages=[Message(role="user", content="go")], publish_grace=30,
    )  # fmt: skip
    return team_id, start_delegation(store, team_id, n)


def start_delegation(store: Store, team_id: str, n: int) -> list[str]:
    """Move a QUEUED team run through a model step that delegates to `n` new members."""
    t = uuid.uuid4().hex[:6]
    agents = [Agent(name=f"m{i}-{t}", model=OpenAIChat(id="m")) for i in range(n)]
    Team(name=f"team-{t}", model=OpenAIChat(id="leader"), members=agents)
    claim = store.claim(team_id, 0, "model", owner="test", lease_seconds=30)
    assert claim is not None
    calls = [ToolCall(id=f"call-{i}", name=TO_MEMBER, arguments="{}") for i in range(n)]
    store.commit_step(
        claim, [Message(role="assistant", tool_calls=[c.to_openai() for c in calls])],
        status=S.QUEUED, next_step="tools", publish_grace=30,
    )  # fmt: skip
    claim = store.claim(team_id, 1, "tools", owner="test", lease_seconds=30)
    assert claim is not None
    delegations = [Delegation(call=c, task="t", members=(a,)) for c, a in zip(calls, agents, strict=True)]
    steps = start_members(store, claim, [], delegations, publish_grace=30)
    assert store.get_record(team_id).status == S.WAITING
    by_call = {r.parent_tool_call_id: r.run_id for r in store.children(team_id)}
    assert len(steps) == n
    return [by_call[c.id] for c in calls]
