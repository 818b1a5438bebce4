"""Budgets that pause, run by the in-memory dispatcher on a real SQLite store: `max_tokens=` and
`max_cost=` per run (a team's counting its members), per session and per user_id, checked before
each model call against the committed usage; a spent budget pauses the run before its call with a
"budget" requirement, and a raised budget resumes it in place until it is spent again. A real
worker on SQLite and PostgreSQL runs the same in tests/integration/test_budget_workers.py."""

from __future__ import annotations

import uuid

import pytest

from orchestrator import Agent, Decision, DecisionKindError, Metrics, Prices, RunOutput, RunStatus, Team
from orchestrator.budgets import Budgets
from orchestrator.catalog import describe
from orchestrator.errors import ConfigurationError
from orchestrator.team import TO_MEMBER, member_id
from orchestrator.testing import InMemoryDispatcher
from orchestrator.testing.script import ScriptConfig
from tests.support import CountingModel

S = RunStatus
#: A cost of 1 per token: a run's cost reads as its token count.
PER_TOKEN = Prices(input=1_000_000, output=1_000_000)


def name(what: str = "budget") -> str:
    return f"{what}-{uuid.uuid4().hex[:8]}"


def lookup(query: str) -> str:
    """Look something up."""
    return f"found {query}"


def tokens(out: RunOutput) -> int:
    """What the run's stored replies (its members' too) used: input plus output tokens."""
    total = out.metrics.total_tokens
    assert total is not None
    return total


def own_tokens(out: RunOutput) -> int:
    total = Metrics.total(m.metrics for m in out.messages if m.role == "assistant").total_tokens
    assert total is not None
    return total


# ---------------------------------------------------------------- a run's budget


def test_a_run_whose_tokens_are_spent_pauses_before_its_next_call_holding_nothing(
    inline: InMemoryDispatcher,
) -> None:
    model = CountingModel(script=ScriptConfig(tool_batches=1))
    agent = Agent(name=name(), model=model, tools=[lookup], max_tokens=1)

    out = agent.run("find otters")

    # The first call had the whole budget; the tool batch it asked for ran to its end; the next
    # call was not made.
    assert out.status == S.PAUSED and out.is_paused
    assert model.calls_for(out.run_id) == [0]
    assert [m.content for m in out.messages if m.role == "tool"] == ["found find otters"]
    [req] = out.active_requirements
    assert req.pause_type == "budget" and req.tool_execution is None
    assert req.budget == {"limit": "max_tokens", "scope": "run", "spent": tokens(out), "allowed": 1}
    record = inline.store.get_record(out.run_id)
    assert record.next_step == "model" and record.lease_owner is None and record.lease_expires_at is None
    assert record.attempts == 0  # a pause is not a failed attempt of the step
    assert [e["kind"] for e in inline.store.get_events(out.run_id)][-1] == "paused"

    req.raise_budget(max_tokens=tokens(out) + 10_000)
    done = agent.continue_run(run_id=out.run_id, requirements=[req])

    assert done.run_id == out.run_id and done.status == S.COMPLETED, done.error
    assert model.calls_for(out.run_id) == [0, 2] and done.content == "Summary: found find otters"
    assert done.active_requirements == [] and done.requirements[0].decision == Decision(
        kind="budget", values={"max_tokens": tokens(out) + 10_000}
    )


def test_a_raised_budget_is_the_runs_limit_and_spending_past_it_pauses_the_run_again(
    inline: InMemoryDispatcher,
) -> None:
    model = CountingModel(script=ScriptConfig(tool_batches=3), prices=PER_TOKEN)
    agent = Agent(name=name(), model=model, tools=[lookup], max_cost=0.5)
    client = agent.client

    first = agent.run("find otters")
    [req] = first.active_requirements
    spent = first.metrics.cost
    assert req.budget == {"limit": "max_cost", "scope": "run", "spent": spent, "allowed": 0.5}
    client.decide(first.run_id, req.id, Decision(kind="budget", values={"max_cost": spent + 1}), by="ann")
    second = client.wait(first.run_id)

    # One more call on the raised limit, then paused again: the raise holds for this run's checks.
    assert second.status == S.PAUSED and model.calls_for(first.run_id) == [0, 2]
    [again] = second.active_requirements
    assert again.id != req.id and again.budget is not None
    assert again.budget == {"limit": "max_cost", "scope": "run", "spent": second.metrics.cost, "allowed": spent + 1}

    again.raise_budget(max_cost=1_000_000)
    done = agent.continue_run(second, by="bob")

    assert done.status == S.COMPLETED, done.error
    assert model.calls_for(first.run_id) == [0, 2, 4, 6]
    assert [r.decided_by for r in done.requirements] == ["ann", "bob"]
    kinds = [e["kind"] for e in inline.store.get_events(first.run_id)]
    assert kinds.count("paused") == 2 and kinds.count("resume") == 2


def test_a_budget_decision_must_raise_the_limit_that_was_spent_past_what_was_spent(
    inline: InMemoryDispatcher,
) -> None:
    agent = Agent(
        name=name(), model=CountingModel(prices=PER_TOKEN), tools=[lookup], max_cost=0.5, max_tokens=1_000_000
    )
    out = agent.run("find otters")
    [req] = out.active_requirements
    assert req.budget is not None and req.budget["limit"] == "max_cost"

    with pytest.raises(DecisionKindError, match="raise max_cost"):
        req.raise_budget(max_tokens=5_000_000)
    with pytest.raises(DecisionKindError, match="not above what the run spent"):
        req.raise_budget(max_cost=req.budget["spent"])
    with pytest.raises(DecisionKindError, match="budget"):
        req.confirm()
    with pytest.raises(DecisionKindError, match="raise max_cost"):
        agent.client.decide(out.run_id, req.id, Decision(kind="budget", values={"max_tokens": 5_000_000}))
    assert agent.client.get_run(out.run_id).status == S.PAUSED


def test_an_agent_without_a_budget_reads_no_spend(inline: InMemoryDispatcher, monkeypatch: pytest.MonkeyPatch) -> None:
    requirements = inline.store.requirements
    reads: list[str] = []
    read = requirements.spending
    monkeypatch.setattr(
        requirements, "spending", lambda record, scopes: reads.append(record.run_id) or read(record, scopes)
    )

    free = Agent(name=name(), model=CountingModel(), tools=[lookup]).run("find otters")
    limited = Agent(name=name(), model=CountingModel(), tools=[lookup], max_tokens=1_000_000).run("find otters")

    assert free.status == limited.status == S.COMPLETED
    assert reads == [limited.run_id, limited.run_id]  # one read before each of its two calls, none for the other


# ---------------------------------------------------------------- a session's and a user's budget


def test_a_session_budget_counts_every_run_of_the_session_and_pauses_the_next_one_before_any_call(
    inline: InMemoryDispatcher,
) -> None:
    model = CountingModel()
    agent = Agent(name=name(), model=model, session_max_tokens=1)
    session = name("s")

    first = agent.run("hello", session_id=session)
    second = agent.run("hello again", session_id=session)
    elsewhere = agent.run("hello", session_id=name("s"))

    assert first.status == S.COMPLETED and elsewhere.status == S.COMPLETED
    assert second.status == S.PAUSED and model.calls_for(second.run_id) == []
    [req] = second.active_requirements
    assert req.budget == {"limit": "max_tokens", "scope": "session", "spent": tokens(first), "allowed": 1}

    req.raise_budget(max_tokens=tokens(first) + 1)
    done = agent.continue_run(second)

    assert done.status == S.COMPLETED and model.calls_for(second.run_id) == [0]
    # The raise is that run's: the session's next run is held by the agent's limit again.
    assert agent.run("and again", session_id=session).status == S.PAUSED


def test_a_user_budget_counts_the_users_runs_across_sessions_and_no_one_elses(inline: InMemoryDispatcher) -> None:
    model = CountingModel(prices=PER_TOKEN)
    agent = Agent(name=name(), model=model, user_max_cost=1)

    ann_first = agent.run("hello", session_id=name("s"), user_id="ann")
    ann_second = agent.run("hello", session_id=name("s"), user_id="ann")
    bob = agent.run("hello", session_id=name("s"), user_id="bob")
    nobody = [agent.run("hello", session_id=name("s")) for _ in range(2)]

    assert ann_first.status == S.COMPLETED and bob.status == S.COMPLETED
    assert [out.status for out in nobody] == [S.COMPLETED, S.COMPLETED]  # no user: no user budget to spend
    assert ann_second.status == S.PAUSED and model.calls_for(ann_second.run_id) == []
    [req] = ann_second.active_requirements
    assert req.budget == {"limit": "max_cost", "scope": "user", "spent": ann_first.metrics.cost, "allowed": 1.0}


# ---------------------------------------------------------------- teams


def crew(*, team_budget: dict[str, float] | None = None, member_budget: dict[str, float] | None = None) -> Team:
    """A leader that delegates once to a researcher, which calls `lookup` once, all priced."""
    t = uuid.uuid4().hex[:6]
    researcher = Agent(
        name=f"researcher-{t}", model=CountingModel(prices=PER_TOKEN), tools=[lookup], role="Finds facts.",
        **(member_budget or {}),  # type: ignore[arg-type]
    )  # fmt: skip
    call = {"tool": TO_MEMBER, "arguments": {"member_id": member_id(researcher), "task": "otters"}}
    leader = CountingModel(script=ScriptConfig(batches=[[call]], final_text="Team: {tool_results}"), prices=PER_TOKEN)
    return Team(name=f"team-{t}", model=leader, members=[researcher], **(team_budget or {}))  # type: ignore[arg-type]


def test_a_teams_budget_counts_its_members_and_pauses_its_leader_once_the_delegation_ran(
    inline: InMemoryDispatcher,
) -> None:
    team = crew(team_budget={"max_tokens": 1})

    out = team.run("otters")

    assert out.status == S.PAUSED
    [member] = out.member_runs
    assert member.status == S.COMPLETED  # the delegation in flight ran to its end
    [req] = out.active_requirements
    assert req.member_run_id is None and req.budget is not None
    assert req.budget["scope"] == "run" and req.budget["spent"] == tokens(out) == own_tokens(out) + tokens(member)

    req.raise_budget(max_tokens=tokens(out) + 100_000)
    done = team.continue_run(out)

    assert done.status == S.COMPLETED, done.error
    assert done.content is not None and done.content.startswith("Team: Summary: found otters")


def test_a_members_own_budget_pauses_it_and_its_team_and_raising_it_resumes_both_in_place(
    inline: InMemoryDispatcher,
) -> None:
    team = crew(member_budget={"max_cost": 0.5})

    out = team.run("otters")

    assert out.status == S.PAUSED
    [member] = out.member_runs
    assert member.status == S.PAUSED
    [req] = out.active_requirements
    assert req.run_id == member.run_id and req.member_run_id == member.run_id and req.pause_type == "budget"
    assert req.budget == {"limit": "max_cost", "scope": "run", "spent": member.metrics.cost, "allowed": 0.5}

    req.raise_budget(max_cost=1_000_000)
    done = team.continue_run(out)

    assert done.status == S.COMPLETED, done.error
    [finished] = done.member_runs
    assert finished.run_id == member.run_id and finished.status == S.COMPLETED


# ---------------------------------------------------------------- definitions


def test_budgets_are_checked_when_the_agent_is_defined_and_recorded_in_the_catalog() -> None:
    for bad, match in [
        ({"max_tokens": 0}, "max_tokens is a whole number of tokens"),
        ({"max_tokens": 2.5}, "max_tokens is a whole number of tokens"),
        ({"session_max_tokens": True}, "session_max_tokens is a whole number"),
        ({"user_max_cost": -1}, "user_max_cost is a finite cost above 0"),
        ({"max_cost": "1"}, "max_cost is a finite cost above 0"),
        ({"max_cost": float("nan")}, "max_cost is a finite cost above 0"),
        ({"max_cost": float("inf")}, "max_cost is a finite cost above 0"),
    ]:
        with pytest.raises(ConfigurationError, match=match):
            Agent(name=name(), model=CountingModel(prices=PER_TOKEN), **bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="unexpected keyword argument.* max_token"):
        Agent(name=name(), model=CountingModel(), max_token=10)  # type: ignore[call-arg]
    with pytest.raises(ConfigurationError, match="has no prices"):
        Agent(name=name(), model=CountingModel(), session_max_cost=1.0)
    unpriced = Agent(name=name(), model=CountingModel())
    with pytest.raises(ConfigurationError, match=f"its member {unpriced.name}'s model .* has no prices"):
        Team(name=name(), model=CountingModel(prices=PER_TOKEN), members=[unpriced], max_cost=1.0)
    # Tokens need no prices.
    assert Team(name=name(), model=CountingModel(), members=[unpriced], max_tokens=10).budgets

    agent = Agent(name=name(), model=CountingModel(prices=PER_TOKEN), max_cost=2, session_max_tokens=10_000)
    assert agent.budgets.to_json() == {"run": {"max_cost": 2.0}, "session": {"max_tokens": 10_000}}
    assert describe(agent).body()["budgets"] == {"run": {"max_cost": 2.0}, "session": {"max_tokens": 10_000}}
    assert not Budgets() and "budgets" not in describe(unpriced).body()  # no budget: the hash is as before
