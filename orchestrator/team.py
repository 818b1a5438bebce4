"""Teams: an agent whose leader may delegate to member agents and teams.

A team with `members=[]` is a leader agent with its own tools, run exactly like an agent but
stored with kind "team".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from orchestrator.agent import Agent
from orchestrator.errors import ConfigurationError
from orchestrator.models.base import Model
from orchestrator.tools import Tool


class Team(Agent):
    """A team of agents (and teams) led by a model. Agno's `Team`, run durably."""

    kind = "team"

    def __init__(
        self,
        *,
        name: str,
        model: Model,
        members: Sequence[Agent] = (),
        tools: Sequence[Tool | Callable[..., Any]] = (),
        instructions: str | Sequence[str] | None = None,
        **kwargs: Any,
    ) -> None:
        for member in members:
            if not isinstance(member, Agent):
                raise ConfigurationError(f"team {name}: members must be Agents or Teams, got {member!r}")
        self.members = list(members)
        super().__init__(name=name, model=model, tools=tools, instructions=instructions, **kwargs)
