"""A budget that pauses a team on a real Celery worker, on SQLite and PostgreSQL, with the real
openai client talking to the scripted model server: the team's max_cost counts its members' cost,
the run pauses before its leader's next call holding nothing, a second producer raises it, the
same run goes on in place and pauses again past the raised limit. The scopes, the decision checks
and the definitions run with the in-memory dispatcher in tests/unit/test_budget_inline.py."""

from __future__ import annotations

import uuid

import pytest

from orchestrator import Agent, Client, Decision, Metrics, Prices, RunOutput, RunStatus, Team
from orchestrator.models import OpenAIChat
from orchestrator.settings import Settings
from orchestrator.team import TO_MEMBER, member_id
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.server import ScriptedServer

S = RunStatus
PRICES = Prices(input=2.0, output=8.0)


def lookup(query: str) -> str:
    """Look something up."""
    return f"found {query}"


def own_cost(out: RunOutput) -> float:
    cost = Metrics.total(m.metrics for m in out.messages if m.role == "assistant").cost
    assert cost is not None
    return cost


@pytest.mark.usefixtures("worker")
def test_a_teams_budget_pauses_it_on_a_worker_and_a_second_producer_raises_it_twice(
    settings: Settings, scripted: ScriptedServer
) -> None:
    # Given a team whose leader delegates twice, then answers, with a cost budget below one turn
    t = uuid.uuid4().hex[:6]
    researcher = Agent(name=f"researcher-{t}", model=OpenAIChat(id="researcher", prices=PRICES), tools=[lookup])
    call = {"tool": TO_MEMBER, "arguments": {"member_id": member_id(researcher), "task": "otters"}}
    scripted.configure(ScriptConfig(by_model={"leader": ScriptConfig(batches=[[call], [call]])}))
    team = Team(
        name=f"team-{t}", model=OpenAIChat(id="leader", prices=PRICES), members=[researcher],
        max_cost=1e-9, client=Client(settings),
    )  # fmt: skip
    decider = Client(settings)  # another producer

    # When it runs
    first = team.run("otters", timeout=30)

    # Then it paused before its leader's second call, the delegation it made having run to its end,
    # on a requirement that counts the member's cost, holding no lease
    assert first.status == S.PAUSED, first.error
    assert len(scripted.requests_for(first.run_id)) == 1
    [member] = first.member_runs
    assert member.status == S.COMPLETED and member.metrics.cost
    [req] = first.active_requirements
    spent = own_cost(first) + member.metrics.cost
    assert req.budget == {"limit": "max_cost", "scope": "run", "spent": pytest.approx(spent), "allowed": 1e-9}
    record = decider.get_run(first.run_id)
    assert record.status == S.PAUSED and decider.store.get_record(first.run_id).lease_owner is None

    # When another producer raises it just past what was spent
    raised = req.budget["spent"] * 1.01
    decider.decide(first.run_id, req.id, Decision(kind="budget", values={"max_cost": raised}), by="ops")
    second = decider.wait(first.run_id, timeout=30)

    # Then the same run made its second call, delegated again and paused on the raised limit
    assert second.run_id == first.run_id and second.status == S.PAUSED, second.error
    assert len(scripted.requests_for(first.run_id)) == 2 and len(second.member_runs) == 2
    [again] = second.active_requirements
    assert again.budget is not None and again.budget["allowed"] == raised and again.budget["spent"] > raised

    # When it is raised for good, it completes in place
    again.raise_budget(max_cost=1_000.0)
    done = team.continue_run(run_id=first.run_id, requirements=[again], timeout=30)

    assert done.run_id == first.run_id and done.status == S.COMPLETED, done.error
    assert len(scripted.requests_for(first.run_id)) == 3
    assert [r.decided_by for r in done.requirements] == ["ops", None]
