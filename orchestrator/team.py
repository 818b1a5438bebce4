"""Team definitions: an agent whose leader may delegate to member agents and teams.

The leader is offered Agno's two delegation tools, `delegate_task_to_member(member_id, task)`
and `delegate_task_to_members(task)`, and its system message lists the members with their ids,
roles and tools. A delegation never runs inside the leader's tool step: the step starts each
member as a durable child run and the team waits (see `orchestrator.delegation`).

A team with `members=[]` is a leader agent with its own tools, run exactly like an agent but
stored with kind "team". `orchestrator.Team` (in `orchestrator.producer`) adds Agno's `run()`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from orchestrator.agent import AgentDefinition
from orchestrator.errors import ConfigurationError
from orchestrator.models.base import Model
from orchestrator.tools import Tool, Toolkit

TO_MEMBER = "delegate_task_to_member"
TO_MEMBERS = "delegate_task_to_members"
#: The names of the tools a team with members offers its leader.
DELEGATION_TOOLS = frozenset({TO_MEMBER, TO_MEMBERS})


def member_id(agent: AgentDefinition) -> str:
    """The id the leader names a member by: its name made URL-safe, as Agno's `get_member_id`."""
    return id_of(agent.name)


def id_of(name: str) -> str:
    """The member id of a member named `name` (`member_id`)."""
    text = re.sub(r"([a-z0-9])([A-Z])", r"\1-\2", name.replace(" ", "-")).lower().replace("_", "-")
    return re.sub(r"-+", "-", re.sub(r"[^\w\-.]", "", text))


class TeamDefinition(AgentDefinition):
    """A team of agents (and teams) led by a model, as the workers run it (Agno's `Team`)."""

    kind = "team"

    def __init__(
        self,
        *,
        name: str,
        model: Model,
        members: Sequence[AgentDefinition] = (),
        tools: Sequence[Tool | Toolkit | Callable[..., Any]] = (),
        instructions: str | Sequence[str] | None = None,
        **kwargs: Any,
    ) -> None:
        for member in members:
            if not isinstance(member, AgentDefinition):
                raise ConfigurationError(f"team {name}: members must be Agents or Teams, got {member!r}")
            if member.name == name:
                raise ConfigurationError(f"team {name}: a team cannot be its own member")
        ids = [member_id(m) for m in members]
        if len(set(ids)) != len(ids):
            raise ConfigurationError(f"team {name}: two members share an id: {sorted(ids)}; give them distinct names")
        self.members = list(members)
        super().__init__(name=name, model=model, tools=tools, instructions=instructions, **kwargs)
        clash = DELEGATION_TOOLS & {t.name for t in self.tools}
        if clash and self.members:
            raise ConfigurationError(f"team {name}: {sorted(clash)} is a delegation tool's name; rename your tool")
        self._delegation_tools = _delegation_tools(self) if self.members else []

    def member(self, requested: str) -> AgentDefinition | None:
        """The member the leader named: by id, by name, or by a name that makes the same id."""
        for m in self.members:
            if requested in (member_id(m), m.name):
                return m
        wanted = re.sub(r"[^\w\-.]", "", requested.replace(" ", "-").replace("_", "-").lower())
        return next((m for m in self.members if member_id(m) == wanted), None)

    def all_tools(self) -> list[Tool]:
        """The leader's own tools and, when it has members, the two delegation tools."""
        return [*self.tools, *self._delegation_tools]

    def definitions(self) -> list[AgentDefinition]:
        """The team, then each member's definitions in order (a sub-team's members too)."""
        return [self, *(d for m in self.members for d in m.definitions())]

    def render_system_message(self) -> str | None:
        """The leader's system message: who the members are and how to delegate, then the
        team's own description and instructions."""
        own = super().render_system_message()
        if not self.members:
            return own
        lines = [
            "You are the leader of a team of AI agents and sub-teams. Coordinate them to complete the user's request.",
            "",
            "Here are the members in your team:",
            "<team_members>",
        ]
        for i, member in enumerate(self.members, 1):
            lines += _describe(member, i)
        lines += [
            "</team_members>",
            "",
            "<how_to_respond>",
            f"- To give one member a task, call {TO_MEMBER}(member_id, task) with the member's ID.",
            f"- To give every member the same task, call {TO_MEMBERS}(task).",
            "- Several delegations in one turn run in parallel; each member answers with the result of its task.",
            "- Write each task so the member can do it alone: what to achieve and the expected output.",
            "- When the members have answered, combine their answers into the final response to the user.",
            "</how_to_respond>",
        ]
        block = "\n".join(lines)
        return f"{block}\n\n{own}" if own else block


def _describe(member: AgentDefinition, index: int) -> list[str]:
    label = "Team" if isinstance(member, TeamDefinition) else "Agent"
    lines = [f"- {label} {index}:", f"    - ID: {member_id(member)}", f"    - Name: {member.name}"]
    if member.role:
        lines.append(f"    - Role: {member.role}")
    elif member.description:
        lines.append(f"    - Description: {member.description}")
    if isinstance(member, TeamDefinition) and member.members:
        lines.append("    - Members: " + ", ".join(m.name for m in member.members))
    if member.tools:
        lines.append("    - Member tools:")
        lines += [f"        - {t.name}" for t in member.tools]
    return lines


def _delegation_tools(team: TeamDefinition) -> list[Tool]:
    """The leader's delegation tools. The engine intercepts valid calls and starts member runs;
    the functions only run for a call it could not place, to tell the model why."""
    known = ", ".join(member_id(m) for m in team.members)

    def delegate_task_to_member(member_id: str, task: str) -> str:
        """Use this function to delegate a task to one member of your team and get its answer.
        Give the member's ID (from the team members list) and a clear, self-contained task that
        says what the member should achieve and what it should return."""
        raise ValueError(f"there is no member with id {member_id!r} in team {team.name}; the members are: {known}")

    def delegate_task_to_members(task: str) -> str:
        """Use this function to delegate the same task to every member of your team at once and
        get all their answers. Give a clear, self-contained task that says what to achieve and
        what to return."""
        raise ValueError(f"team {team.name} could not delegate {task!r} to its members")

    return [Tool(delegate_task_to_member, name=TO_MEMBER), Tool(delegate_task_to_members, name=TO_MEMBERS)]
