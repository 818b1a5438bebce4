"""Definitions know no producer: agent.py, team.py and the values they read import no client, no
run control and no producer, at any depth, whether at the top, inside a function or for the type
checker; `orchestrator.Agent` and `orchestrator.Team` are those definitions with Agno's `run()`."""

from __future__ import annotations

import ast
import inspect
import uuid
from pathlib import Path

from orchestrator import Agent, Client, Team
from orchestrator.agent import AgentDefinition, AgentOptions, find_agent
from orchestrator.budgets import BudgetOptions
from orchestrator.team import TeamDefinition
from orchestrator.testing import InMemoryDispatcher
from orchestrator.testing.scripted_model import ScriptedModel

ORCHESTRATOR = Path(__file__).resolve().parents[2] / "orchestrator"
DEFINITIONS = ("orchestrator.agent", "orchestrator.team", "orchestrator.run", "orchestrator.structured")
PRODUCERS = {"orchestrator.client", "orchestrator.control", "orchestrator.producer"}


def module_of(path: Path) -> str:
    parts = path.relative_to(ORCHESTRATOR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def every_import(path: Path, known: set[str]) -> set[str]:
    """The package's modules `path` imports anywhere in it (functions and TYPE_CHECKING too);
    the package itself left out, as importing a submodule runs it whichever module asks."""
    package = module_of(path) if path.name == "__init__.py" else module_of(path).rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if name in known and name != "orchestrator"}


def test_the_definitions_reach_no_client_control_or_producer_through_any_import() -> None:
    paths = {module_of(p): p for p in ORCHESTRATOR.rglob("*.py") if "migrations" not in p.parts}
    graph = {name: every_import(path, set(paths)) for name, path in paths.items()}
    chains: list[str] = []
    for start in DEFINITIONS:
        via: dict[str, str | None] = {start: None}
        todo = [start]
        while todo:
            here = todo.pop()
            for there in graph[here] - via.keys():
                via[there] = here
                todo.append(there)
        for bad in sorted(PRODUCERS & via.keys()):
            chain, at = [bad], via[bad]
            while at is not None:
                chain.append(at)
                at = via[at]
            chains.append(" <- ".join(chain))
    assert chains == []


def test_agent_options_name_every_argument_a_definition_takes() -> None:
    parameters = inspect.signature(AgentDefinition.__init__).parameters
    arguments = {n for n, p in parameters.items() if p.kind is not p.VAR_KEYWORD} - {"self"}
    # The budget parameters are taken as `**budgets: Unpack[BudgetOptions]`, which AgentOptions extends.
    assert [n for n, p in parameters.items() if p.kind is p.VAR_KEYWORD] == ["budgets"]

    assert set(AgentOptions.__annotations__) == arguments | set(BudgetOptions.__annotations__)


def test_the_public_agent_and_team_are_the_definitions_with_a_producer_client(inline: InMemoryDispatcher) -> None:
    client = Client(inline.settings)
    t = uuid.uuid4().hex[:6]
    member = Agent(name=f"member-{t}", model=ScriptedModel())
    team = Team(name=f"team-{t}", model=ScriptedModel(), members=[member], client=client)

    assert Team.__mro__[1:4] == (TeamDefinition, Agent, AgentDefinition)
    assert (team.kind, member.kind) == ("team", "agent")
    assert team.client is client and member.client is inline.client  # given, else `use_client`'s
    assert find_agent(team.name) is team and team.definitions() == [team, member]
    assert not hasattr(AgentDefinition, "run") and not hasattr(TeamDefinition, "client")
