"""Deploys, stepped inline: each step stamped with the definition its worker ran it on; a run on
an older definition that no live worker serves taken over where nothing its next step depends on
changed, stopped with DefinitionChangedError where something did, and continued past it with
`accept_definition`; a step handed on while a worker of the run's definition lives; teams whose
members changed. The rules themselves (`deploys.changes`) are checked on definitions alone.
Worker processes of two versions run the same in tests/integration/test_deploy_workers.py."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import select, update

from orchestrator import Agent, InvalidInputError, RunBusyError, RunStatus, Team, tool
from orchestrator.catalog import contested, describe
from orchestrator.deploys import changes, decide
from orchestrator.messages import ToolCall
from orchestrator.requirements import Decision, RunRequirement
from orchestrator.store.tables import messages, runs
from orchestrator.team import TO_MEMBER, member_id
from orchestrator.testing import InMemoryDispatcher
from orchestrator.testing.script import ScriptConfig
from tests.deploy_support import first_tool_takes, gone, older, on, served_once, with_instructions
from tests.support import Clock, CountingModel
from workers.cli.render import show
from workers.cli.run_commands import accepted

S = RunStatus


def name() -> str:
    return f"deploy-{uuid.uuid4().hex[:8]}"


def looker(looked: list[str] | None = None) -> Agent:
    """An agent that calls `lookup` once, then answers with its result."""

    def lookup(query: str) -> str:
        """Look something up."""
        if looked is not None:
            looked.append(query)
        return f"found {query}"

    script = ScriptConfig(batches=[[{"tool": "lookup", "arguments": {"query": "otters"}}]], final_text="{tool_results}")
    return Agent(name=name(), model=CountingModel(script=script), tools=[lookup], instructions="Look it up.")


def stamps(inline: InMemoryDispatcher, run_id: str) -> list[tuple[str, str | None]]:
    query = select(messages.c.role, messages.c.definition_hash).where(messages.c.run_id == run_id)
    with inline.store.engine.connect() as conn:
        return [(r.role, r.definition_hash) for r in conn.execute(query.order_by(messages.c.idx))]


# ---------------------------------------------------------------- the worker's own definition


def test_a_step_on_its_workers_own_definition_reads_no_catalog_and_stamps_what_it_writes(
    inline: InMemoryDispatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = looker()

    def no_read(name: str | None = None) -> None:
        raise AssertionError("the catalog was read on a step's path")

    monkeypatch.setattr(inline.store.catalog, "read", no_read)
    out = agent.run("find otters")

    own = describe(agent).hash
    assert out.status == S.COMPLETED and out.definition_hash == own
    # The input no step wrote; the reply, the tool result and the answer each step wrote
    assert stamps(inline, out.run_id) == [("user", None), ("assistant", own), ("tool", own), ("assistant", own)]
    assert [(s.task, s.definition_hash) for s in agent.client.get_steps(out.run_id)] == [
        ("model", own),
        ("tools", own),
        ("model", own),
    ]


# ---------------------------------------------------------------- no live worker of the run's


def test_a_run_whose_definition_no_live_worker_serves_goes_on_under_the_new_one_when_its_calls_are_unchanged(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    looked: list[str] = []
    agent = looker(looked)
    inline.autorun = False
    run_id = agent.start("find otters").run_id
    inline.run_next()  # the model's call of `lookup`, committed
    # Given a run on an older version, whose instructions were other, and whose workers stopped
    old = older(agent, with_instructions("0" * 64))
    served_once(inline, old)
    on(inline, run_id, old)
    gone(inline, clock)

    inline.run_until_idle()

    out = agent.client.get_run(run_id)
    new = describe(agent).hash
    assert out.status == S.COMPLETED and looked == ["otters"] and out.definition_hash == new
    [moved] = [e for e in agent.client.get_log(run_id) if e.kind == "definition"]
    assert moved.detail is not None and (moved.detail["from"], moved.detail["to"], moved.detail["why"]) == (
        old.hash,
        new,
        "unchanged",
    )
    assert [s.definition_hash for s in agent.client.get_steps(run_id)] == [new, new, new]


def test_a_changed_argument_schema_of_an_owed_call_stops_the_run_until_a_continue_accepts_the_new_definition(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    looked: list[str] = []
    agent = looker(looked)
    inline.autorun = False
    run_id = agent.start("find otters").run_id
    inline.run_next()
    old = older(agent, first_tool_takes({"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}))
    served_once(inline, old)
    on(inline, run_id, old)
    gone(inline, clock)

    inline.run_until_idle()

    new = describe(agent).hash
    stopped = agent.client.get_run(run_id)
    assert stopped.status == S.ERROR and stopped.error is not None and looked == []
    assert stopped.error.type == "DefinitionChangedError"
    said = stopped.error.message
    assert "tool 'lookup' (call " in said and "its arguments' schema changed" in said
    assert old.hash[:12] in said and f"accept_definition={new!r}" in said
    assert f"ratchet continue {run_id} --accept-definition {new}" in said
    failed = agent.client.get_steps(run_id)[-1]
    assert (failed.task, failed.status, failed.definition_hash) == ("tools", "failed", new)

    inline.autorun = True
    batch = agent.client.continue_runs([run_id])  # done, and it stops again the same way
    assert batch.done == [run_id]
    again = agent.client.wait(run_id)
    assert again.error is not None and again.error.type == "DefinitionChangedError" and looked == []
    done = agent.continue_run(run_id=run_id, accept_definition=new)

    assert done.status == S.COMPLETED and looked == ["otters"] and done.definition_hash == new
    assert agent.client.store.get_record(run_id).accepted_definition is None
    assert [e.detail["why"] for e in agent.client.get_log(run_id) if e.kind == "definition" and e.detail] == [
        "accepted"
    ]


def test_a_continue_accepts_only_a_definition_a_worker_served(inline: InMemoryDispatcher) -> None:
    agent = looker()
    inline.autorun = False
    run_id = agent.start("find otters").run_id

    with pytest.raises(InvalidInputError, match="no worker ever served definition 000000000000"):
        agent.client.continue_run(run_id, accept_definition="0" * 64)
    with pytest.raises(InvalidInputError, match="not a definition hash"):
        agent.client.continue_run(run_id, accept_definition="abc123")
    with pytest.raises(InvalidInputError, match="mapping of agent names"):
        agent.client.continue_run(run_id, accept_definition=["0" * 64])  # type: ignore[arg-type]


def test_a_continue_refuses_an_acceptance_for_a_run_it_leaves_as_it_is(inline: InMemoryDispatcher) -> None:
    @tool(requires_confirmation=True)
    def pay(amount: int) -> str:
        """Pay."""
        return "paid"

    agent = Agent(name=name(), model=CountingModel(), tools=[pay])
    paused = agent.run("pay")
    assert paused.status == RunStatus.PAUSED
    [req] = paused.active_requirements
    own = describe(agent).hash

    # Neither a PAUSED run nor one its decisions queued takes it: it would be dropped unwritten
    with pytest.raises(RunBusyError, match="nothing was accepted"):
        agent.client.continue_run(paused.run_id, accept_definition=own)
    req.confirm()
    inline.autorun = False
    with pytest.raises(RunBusyError, match="nothing was accepted"):
        agent.continue_run(run_id=paused.run_id, requirements=[req], accept_definition=own)
    assert inline.store.get_record(paused.run_id).accepted_definition is None


def test_a_run_that_recorded_no_definition_takes_its_workers(inline: InMemoryDispatcher) -> None:
    agent = looker()
    inline.autorun = False
    run_id = agent.start("find otters").run_id
    with inline.store.engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.run_id == run_id).values(definition_hash=None))

    inline.run_until_idle()

    assert agent.client.get_run(run_id).definition_hash == describe(agent).hash
    assert [e.detail["why"] for e in agent.client.get_log(run_id) if e.kind == "definition" and e.detail] == [
        "unrecorded"
    ]


# ---------------------------------------------------------------- a live worker of the run's


def test_a_step_is_handed_on_while_a_worker_of_its_runs_definition_lives_and_taken_over_once_none_does(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    agent = looker()
    inline.autorun = False
    run_id = agent.start("find otters").run_id
    old = older(agent, with_instructions("0" * 64))
    served_once(inline, old)  # seen now: live
    on(inline, run_id, old)

    inline.run_next()
    inline.run_until_idle()  # this process serves the new definition only: it does not run the step

    [handed] = inline.unserved
    assert (handed.run_id, handed.seq, handed.kind, handed.definition) == (run_id, 0, "model", old.hash)
    record = agent.client.store.get_record(run_id)
    assert record.status == S.QUEUED and record.attempts == 0 and record.definition_hash == old.hash
    assert [e.kind for e in agent.client.get_log(run_id)] == ["handed_on"]

    # When its workers stopped, the sweeper publishes the step again and this worker takes it over
    gone(inline, clock)
    clock.advance(inline.settings.publish_grace_seconds)
    assert run_id in inline.sweep().republished
    inline.run_until_idle()
    assert agent.client.get_run(run_id).status == S.COMPLETED


def test_a_worker_sees_its_agents_contested_while_another_definition_of_one_is_live(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    agent, other = looker(), looker()
    own = [describe(agent), describe(other)]
    served_once(inline, own[0])
    served_once(inline, own[1])
    assert contested(inline.store, inline.settings, own) == []

    rival = older(agent, with_instructions("0" * 64))
    served_once(inline, rival)
    assert contested(inline.store, inline.settings, own) == [own[0]]
    gone(inline, clock)  # the rival's workers stopped (and so, as far as the catalog says, these)
    assert contested(inline.store, inline.settings, own) == []


# ---------------------------------------------------------------- the rules


def call(name: str = "lookup", id: str = "c1", **arguments: Any) -> ToolCall:
    return ToolCall(id=id, name=name, arguments=json.dumps(arguments))


def decided(kind: str) -> dict[str, RunRequirement]:
    requirement = RunRequirement(
        id="r1", run_id="x", tool_execution=None, pause_type="confirmation", created_at=0.0, status="decided"
    )
    return {"c1": replace(requirement, decision=Decision(kind=kind))}  # type: ignore[arg-type]


def test_instructions_the_model_and_other_tools_may_change_under_a_run() -> None:
    agent = looker()
    new = describe(agent)

    def other(body: dict[str, Any]) -> None:
        body.update(instructions_digest="1" * 64, model={"provider": "openai", "id": "another"})
        body["tools"].append({"name": "extra", "description": "", "parameters": {}, "flags": {}})

    assert changes(older(agent, other), new, [call(query="x")], {}) == []
    # A tool no owed call names may go, too
    assert changes(new, older(agent, lambda b: b.update(tools=[])), [], {}) == []


def test_what_an_owed_call_depends_on_is_its_tool_its_argument_schema_and_the_flags_that_decide_how_it_runs() -> None:
    agent = looker()
    new = describe(agent)

    def flagged(body: dict[str, Any]) -> None:
        body["tools"][0]["flags"] = {"requires_confirmation": True, "at_most_once": True}

    removed = changes(older(agent, lambda b: b.update(tools=[])), new, [call(query="x")], {})
    assert removed == ["tool 'lookup' (call c1) is new: the call would run, where it was answered as an unknown tool"]
    assert changes(new, older(agent, lambda b: b.update(tools=[])), [call(query="x")], {}) == [
        "tool 'lookup' (call c1) was removed"
    ]
    assert changes(older(agent, flagged), new, [call(query="x")], {}) == [
        "tool 'lookup' (call c1): its flag requires_confirmation changed from true to unset",
        "tool 'lookup' (call c1): its flag at_most_once changed from true to unset",
    ]
    # A call a person decided: a rejection answers it (nothing of its tool matters), a
    # confirmation runs it (at_most_once matters here; its arguments and what it asks are the
    # decision's own check, `orchestrator.paused_tools`)
    assert changes(new, older(agent, lambda b: b.update(tools=[])), [call(query="x")], decided("reject")) == []
    assert changes(older(agent, flagged), new, [call(query="x")], decided("confirm")) == [
        "tool 'lookup' (call c1): its flag at_most_once changed from true to unset"
    ]


def test_the_output_schema_and_the_kind_are_what_every_step_depends_on() -> None:
    class Answer(BaseModel):
        text: str

    agent = looker()
    new = describe(agent)
    typed = older(agent, lambda b: b.update(output_schema=Answer.model_json_schema(), kind="team"))

    assert changes(typed, new, [], {}) == ["it is an agent now, not a team", "its output schema changed"]


def test_a_verdict_takes_an_acceptance_first_then_a_live_worker_of_the_runs_definition(
    inline: InMemoryDispatcher,
) -> None:
    agent = looker()
    new = describe(agent)
    old = older(agent, first_tool_takes({"type": "object"}))
    inline.autorun = False
    record = replace(agent.client.store.get_record(agent.start("x").run_id), definition_hash=old.hash)

    assert decide(record, new, old, live=True, calls=[call(query="x")]).action == "hand_on"
    refused = decide(record, new, old, live=False, calls=[call(query="x")])
    assert refused.action == "refuse" and refused.changes == ("tool 'lookup' (call c1): its arguments' schema changed",)
    assert decide(replace(record, accepted_definition=new.hash), new, old, live=True).why == "accepted"
    assert decide(record, new, None, live=False).why == "unknown"
    assert decide(replace(record, definition_hash=None), new, old, live=True).why == "unrecorded"


def test_ratchet_show_says_the_runs_definition_and_each_steps(
    inline: InMemoryDispatcher, capsys: pytest.CaptureFixture[str]
) -> None:
    agent = looker()
    out = agent.run("find otters")

    show(out, steps=agent.client.get_steps)

    printed = capsys.readouterr().out
    own = describe(agent).hash[:12]
    assert f"  definition {own}\n" in printed
    assert printed.count(f"definition {own}") == 4  # the run's, and each of its three steps'


def test_the_command_line_reads_one_hash_or_a_hash_for_each_agent() -> None:
    assert accepted([]) is None
    assert accepted(["a" * 64]) == "a" * 64
    assert accepted([f"writer={'a' * 64}", f"team=x={'b' * 64}"]) == {"writer": "a" * 64, "team=x": "b" * 64}
    with pytest.raises(InvalidInputError, match="AGENT=HASH"):
        accepted(["a" * 64, "b" * 64])


# ---------------------------------------------------------------- teams


class Pair:
    """A team of a researcher (one tool) and a writer, the leader delegating to both."""

    def __init__(self, only_researcher: bool = False) -> None:
        t = uuid.uuid4().hex[:6]
        self.searched: list[str] = []

        @tool
        def search(query: str) -> str:
            """Search the web."""
            self.searched.append(query)
            return f"facts about {query}"

        research = ScriptConfig(batches=[[{"tool": "search", "arguments": {"query": "otters"}}]], final_text="R")
        self.researcher_model = CountingModel(script=research)
        self.writer_model = CountingModel(script=ScriptConfig(final_text="W"))
        self.researcher = Agent(name=f"researcher-{t}", model=self.researcher_model, tools=[search], role="Finds.")
        self.writer = Agent(name=f"writer-{t}", model=self.writer_model, role="Writes.")
        members = [self.researcher] if only_researcher else [self.researcher, self.writer]
        calls = [{"tool": TO_MEMBER, "arguments": {"member_id": member_id(m), "task": "go"}} for m in members]
        self.team = Team(
            name=f"team-{t}",
            model=CountingModel(script=ScriptConfig(batches=[calls], final_text="Team: {tool_results}")),
            members=[self.researcher, self.writer],
        )


def step_until(inline: InMemoryDispatcher, done: Callable[[], bool]) -> None:
    for _ in range(50):
        if done():
            return
        assert inline.run_next() is not None, "no step left"
    raise AssertionError("never got there")


def test_a_team_whose_members_changed_never_runs_a_finished_member_again(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    pair = Pair()
    inline.autorun = False
    team_id = pair.team.start("write about otters").run_id
    client = pair.team.client

    def member(agent: Agent) -> str:
        return next(m.run_id for m in client.get_run(team_id).member_runs if m.agent_name == agent.name)

    def written() -> bool:
        runs_ = client.get_run(team_id).member_runs
        return any(m.agent_name == pair.writer.name and m.status == S.COMPLETED for m in runs_)

    step_until(inline, written)
    researcher_id = member(pair.researcher)
    assert client.get_run(researcher_id).status == S.QUEUED
    # Given a deploy while the researcher is in flight: the team had one member fewer, the
    # researcher other instructions, the writer too; the workers of the old versions stopped
    old_team = older(pair.team, lambda b: b.update(members=[pair.researcher.name]))
    old_researcher = older(pair.researcher, with_instructions("0" * 64))
    old_writer = older(pair.writer, with_instructions("0" * 64))
    for definition, run_id in ((old_team, team_id), (old_researcher, researcher_id), (old_writer, member(pair.writer))):
        served_once(inline, definition)
        on(inline, run_id, definition)
    gone(inline, clock)
    written_by = list(pair.writer_model.calls)

    inline.run_until_idle()

    out = client.get_run(team_id)
    assert out.status == S.COMPLETED and out.definition_hash == describe(pair.team).hash
    assert pair.writer_model.calls == written_by and pair.searched == ["otters"]
    assert client.get_run(researcher_id).definition_hash == describe(pair.researcher).hash
    # The finished writer is as it finished: still on its old definition, nothing run again
    assert client.get_run(member(pair.writer)).definition_hash == old_writer.hash


def test_a_member_stopped_by_a_changed_tool_goes_on_when_its_team_is_continued_with_a_mapping(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    pair = Pair(only_researcher=True)
    inline.autorun = False
    team_id = pair.team.start("research otters").run_id
    client = pair.team.client

    def searching() -> bool:
        runs_ = client.get_run(team_id).member_runs
        return (
            bool(runs_)
            and runs_[0].status == S.QUEUED
            and client.store.get_record(runs_[0].run_id).next_step == "tools"
        )

    step_until(inline, searching)
    researcher_id = client.get_run(team_id).member_runs[0].run_id
    old = older(pair.researcher, first_tool_takes({"type": "object", "properties": {}}))
    served_once(inline, old)
    on(inline, researcher_id, old)
    gone(inline, clock)

    inline.run_until_idle()

    team = client.get_run(team_id)
    assert team.status == S.ERROR and team.error is not None and team.error.type == "MemberRunError"
    stopped = client.get_run(researcher_id)
    assert stopped.error is not None and stopped.error.type == "DefinitionChangedError"
    new = describe(pair.researcher).hash
    assert f"continue its team, run {team_id}, with accept_definition={{{pair.researcher.name!r}: {new!r}}}" in (
        stopped.error.message
    )
    inline.autorun = True
    done = pair.team.continue_run(run_id=team_id, accept_definition={pair.researcher.name: new})

    assert done.status == S.COMPLETED and pair.searched == ["otters"]
    assert client.get_run(researcher_id).definition_hash == new
