"""A team's leader: its delegation tools, its system message, and how it finds a member."""

from __future__ import annotations

import uuid

import pytest

from orchestrator import Agent, ConfigurationError, Team
from orchestrator.delegation import split
from orchestrator.messages import ToolCall
from orchestrator.team import TO_MEMBER, TO_MEMBERS, member_id
from orchestrator.testing.scripted_model import ScriptedModel


def agent(name: str, **kwargs: object) -> Agent:
    return Agent(name=f"{name}-{uuid.uuid4().hex[:4]}", model=ScriptedModel(), **kwargs)  # type: ignore[arg-type]


def search(query: str) -> str:
    """Search."""
    return query


def test_a_team_with_members_offers_agnos_two_delegation_tools_after_its_own() -> None:
    team = Team(name=f"t-{uuid.uuid4().hex[:4]}", model=ScriptedModel(), members=[agent("a")], tools=[search])

    specs = {s.name: s for s in team.tool_specs()}

    assert list(specs) == ["search", TO_MEMBER, TO_MEMBERS]
    assert specs[TO_MEMBER].parameters["required"] == ["member_id", "task"]
    assert specs[TO_MEMBERS].parameters["required"] == ["task"]


def test_a_team_without_members_offers_only_its_own_tools_and_its_own_instructions() -> None:
    team = Team(name=f"t-{uuid.uuid4().hex[:4]}", model=ScriptedModel(), tools=[search], instructions="Be brief.")

    assert [s.name for s in team.tool_specs()] == ["search"]
    assert team.render_system_message() == "Be brief."


def test_the_leaders_system_message_lists_each_member_with_its_id_role_and_tools() -> None:
    researcher = agent("Web Researcher", role="Finds facts.", tools=[search])
    sub = Team(name=f"Sub Team-{uuid.uuid4().hex[:4]}", model=ScriptedModel(), members=[agent("w")])
    team = Team(
        name=f"t-{uuid.uuid4().hex[:4]}", model=ScriptedModel(), members=[researcher, sub], instructions="Lead."
    )

    text = team.render_system_message() or ""

    assert "- Agent 1:" in text and f"ID: {member_id(researcher)}" in text and "Role: Finds facts." in text
    assert "Member tools:\n        - search" in text
    assert "- Team 2:" in text and f"Members: {sub.members[0].name}" in text
    assert "delegate_task_to_member(member_id, task)" in text and "delegate_task_to_members(task)" in text
    assert text.endswith("\n\nLead.")


def test_a_member_is_found_by_its_id_or_its_name() -> None:
    researcher = agent("Web_Researcher")
    team = Team(name=f"t-{uuid.uuid4().hex[:4]}", model=ScriptedModel(), members=[researcher])

    assert member_id(researcher).startswith("web-researcher-")
    assert team.member(member_id(researcher)) is researcher
    assert team.member(researcher.name) is researcher
    assert team.member("someone else") is None


def test_split_keeps_ordinary_and_misdirected_calls_inline_and_delegates_the_rest() -> None:
    a, b = agent("a"), agent("b")
    team = Team(name=f"t-{uuid.uuid4().hex[:4]}", model=ScriptedModel(), members=[a, b], tools=[search])
    calls = [
        ToolCall(id="1", name="search", arguments='{"query": "q"}'),
        ToolCall(id="2", name=TO_MEMBER, arguments=f'{{"member_id": "{member_id(a)}", "task": "x"}}'),
        ToolCall(id="3", name=TO_MEMBER, arguments='{"member_id": "nobody", "task": "x"}'),
        ToolCall(id="4", name=TO_MEMBERS, arguments='{"task": "y"}'),
        ToolCall(id="5", name=TO_MEMBERS, arguments='{"oops": 1}'),
    ]

    inline, delegated = split(team, calls)

    assert [c.id for c in inline] == ["1", "3", "5"]
    assert [(d.call.id, d.task, [m.name for m in d.members]) for d in delegated] == [
        ("2", "x", [a.name]),
        ("4", "y", [a.name, b.name]),
    ]


def test_an_agent_never_delegates() -> None:
    calls = [ToolCall(id="1", name=TO_MEMBERS, arguments='{"task": "y"}')]
    assert split(agent("solo"), calls) == (calls, [])


def test_members_need_distinct_ids_and_a_team_cannot_name_a_tool_like_a_delegation_tool() -> None:
    name = f"same-{uuid.uuid4().hex[:4]}"
    twins = [Agent(name=name, model=ScriptedModel()), Agent(name=name.replace("-", "_"), model=ScriptedModel())]
    with pytest.raises(ConfigurationError, match="two members share an id"):
        Team(name="t", model=ScriptedModel(), members=twins)

    def delegate_task_to_members(task: str) -> str:
        """Mine."""
        return task

    with pytest.raises(ConfigurationError, match="delegation tool's name"):
        Team(name="t2", model=ScriptedModel(), members=[agent("y")], tools=[delegate_task_to_members])
