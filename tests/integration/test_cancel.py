"""Cancelling a team: the cascade reaches every member run, whatever the members do meanwhile."""

from __future__ import annotations

from sqlalchemy import Connection, Engine

from orchestrator import Client, RunStatus
from orchestrator.run import RunRecord
from orchestrator.settings import Settings
from orchestrator.store import Store
from tests.integration.producing import complete, start_delegation, waiting_team

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
