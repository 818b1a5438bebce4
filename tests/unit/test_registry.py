"""Agents are registered by name, and a name has one definition: two different definitions are
an error naming both, while the same definition seen again (a module imported twice) is fine."""

from __future__ import annotations

import uuid

import pytest

from orchestrator import Agent, ConfigurationError, Team
from orchestrator.agent import get_agent
from orchestrator.testing.scripted_model import ScriptedModel

HERE = __file__


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def line_of(marker: str) -> int:
    """The line of this file that holds `marker` (so the expected sites survive edits)."""
    with open(HERE) as source:
        return next(i for i, text in enumerate(source, 1) if marker in text and "line_of" not in text)


def test_a_second_definition_of_a_name_is_an_error_naming_both_places() -> None:
    name = unique("twice")
    first = Agent(name=name, model=ScriptedModel())  # first definition

    with pytest.raises(ConfigurationError) as caught:
        Agent(name=name, model=ScriptedModel(), instructions="Another agent.")  # second definition

    message = str(caught.value)
    where = "test_registry.test_a_second_definition_of_a_name_is_an_error_naming_both_places)"
    assert f"two different agents are named {name!r}" in message
    assert f"test_registry.py:{line_of('# first definition')} (" in message
    assert f"test_registry.py:{line_of('# second definition')} (" in message
    assert message.count(where) == 2  # each place says the module and function it is in
    assert "rename one, or define it once in a module and import it where it is needed" in message
    assert get_agent(name) is first  # the refused definition replaced nothing


def test_a_team_and_an_agent_cannot_share_a_name() -> None:
    name = unique("shared")
    Agent(name=name, model=ScriptedModel())

    with pytest.raises(ConfigurationError, match=f"two different agents are named '{name}'"):
        Team(name=name, model=ScriptedModel(), members=[])


def test_the_same_line_defining_a_name_again_replaces_it() -> None:
    name = unique("again")

    built = [Agent(name=name, model=ScriptedModel()) for _ in range(2)]

    assert get_agent(name) is built[1]


def test_a_module_run_under_two_names_defines_its_agents_once() -> None:
    # `python agents.py` runs the file as __main__; importing `agents` from it runs it again.
    name = unique("module")
    source = (
        "from orchestrator import Agent; from orchestrator.testing.scripted_model import ScriptedModel\n"
        "Agent(name=NAME, model=ScriptedModel())\n"
    )
    code = compile(source, "/project/agents.py", "exec")

    exec(code, {"__name__": "__main__", "NAME": name})
    exec(code, {"__name__": "agents", "NAME": name})

    assert get_agent(name).name == name
    elsewhere = r"/project/agents.py:2 \(module agents\), another at /project/tools.py:2 \(module tools\)"
    with pytest.raises(ConfigurationError, match=elsewhere):
        exec(compile(source, "/project/tools.py", "exec"), {"__name__": "tools", "NAME": name})


class Researcher(Agent):
    """A subclass with a constructor of its own: the definition is where it is built, not here."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name, model=ScriptedModel(), role="Finds facts.")


def test_a_subclass_is_defined_where_it_is_built_not_in_its_constructor() -> None:
    name = unique("sub")
    Researcher(name)  # built here

    with pytest.raises(ConfigurationError) as caught:
        Researcher(name)  # and here

    assert f"test_registry.py:{line_of('# built here')}" in str(caught.value)
    assert f"test_registry.py:{line_of('# and here')}" in str(caught.value)
