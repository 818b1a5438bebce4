"""The HTTP API's routes on the agent catalog: what the workers serve, and whether one still does.

    GET /agents           every agent and team a worker ever served: its latest definition, live or not
    GET /agents/{agent}   one of them, with every version workers served (most recently seen first)

A definition is live while a worker marked it seen within three RATCHET_CATALOG_SEEN_SECONDS
(`orchestrator.catalog`); an agent no live worker serves says when one last did. Read from the
store: the API need not import the agents' modules.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path
from pydantic import BaseModel, Field

from orchestrator import catalog
from orchestrator import validation as v
from orchestrator.catalog import Entry
from orchestrator.errors import AgentNotFoundError
from workers.api.contract import name, refusals, text
from workers.api.deps import ClientDep, token_router

router = token_router()

AgentName = Annotated[str, Path(description="an agent's or team's name"), text(name(v.AGENT_NAME_MAX))]


class AgentTool(BaseModel):
    """One tool of a definition, as the model is shown it, with its flags."""

    name: str
    description: str
    parameters: dict[str, Any] = Field(description="the JSON schema of its arguments")
    flags: dict[str, Any] = Field(
        description="the flags it sets (at_most_once, queue...); one at its default is left out"
    )


class AgentVersion(BaseModel):
    """One definition of an agent, as workers served it."""

    definition_hash: str = Field(description="SHA-256 of the definition as canonical JSON")
    kind: str = Field(description='"agent" or "team"')
    model: dict[str, str | None] = Field(description="the model's provider and id")
    instructions_digest: str | None = Field(description="SHA-256 of the system message a new run gets")
    tools: list[AgentTool]
    members: list[str] = Field(description="a team's members, by name")
    output_schema: dict[str, Any] | None = Field(description="the JSON schema of its final answer (null: text)")
    queue: str | None = Field(description="the queue of its steps (null: the default queues)")
    tool_queue: str | None = Field(description="the queue of its tool batches that call a routed tool")
    budgets: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description='its spending limits by scope ("run", "session", "user"), e.g. {"run": {"max_cost": 0.5}}',
    )
    fallback_models: dict[str, list[dict[str, str | None]]] = Field(
        default_factory=dict,
        description='the models it falls back on, by list ("on_error", "on_rate_limit", "on_context_overflow"), '
        "each model's provider and id in the order they are tried",
    )
    run_timeout: float | None = Field(
        default=None, description="its runs' deadline in seconds from their start (null: none)"
    )
    max_queued: int | None = Field(default=None, description="how many of its runs may be QUEUED (null: no bound)")
    first_seen: float = Field(description="when a worker first served it (UNIX seconds)")
    last_seen: float = Field(description="when a worker last said it serves it (UNIX seconds)")
    live: bool = Field(description="a worker said so within the live window")

    @classmethod
    def of(cls, entry: Entry) -> AgentVersion:
        d = entry.definition
        return cls(
            definition_hash=d.hash,
            kind=d.kind,
            model=d.model,
            instructions_digest=d.instructions_digest,
            tools=[
                AgentTool(name=t.name, description=t.description, parameters=t.parameters, flags=t.flags)
                for t in d.tools
            ],
            members=list(d.members),
            output_schema=d.output_schema,
            queue=d.queue,
            tool_queue=d.tool_queue,
            budgets=d.budgets,
            fallback_models=d.fallback_models,
            run_timeout=d.run_timeout,
            max_queued=d.max_queued,
            first_seen=entry.first_seen,
            last_seen=entry.last_seen,
            live=entry.live,
        )


class AgentSummary(BaseModel):
    """An agent or team in the catalog: its latest definition."""

    name: str
    live: bool = Field(description="a live worker serves one of its definitions")
    last_seen: float = Field(description="when a worker last said it serves it (UNIX seconds)")
    latest: AgentVersion = Field(description="the definition seen most recently")
    versions: int = Field(description="how many definitions of it workers served")


class AgentList(BaseModel):
    """The answer of `GET /agents`."""

    agents: list[AgentSummary] = Field(description="by name")


class AgentDetail(AgentSummary):
    """The answer of `GET /agents/{agent}`."""

    definitions: list[AgentVersion] = Field(description="every definition workers served, most recently seen first")


def _summaries(entries: list[Entry]) -> dict[str, AgentDetail]:
    by_name: dict[str, list[Entry]] = {}
    for entry in entries:  # by name, then most recently seen first
        by_name.setdefault(entry.definition.name, []).append(entry)
    return {
        n: AgentDetail(
            name=n,
            live=any(e.live for e in versions),
            last_seen=versions[0].last_seen,
            latest=AgentVersion.of(versions[0]),
            versions=len(versions),
            definitions=[AgentVersion.of(e) for e in versions],
        )
        for n, versions in by_name.items()
    }


@router.get(
    "/agents",
    operation_id="listAgents",
    summary="List the agents and teams",
    response_model=AgentList,
    tags=["agents"],
    responses=refusals(401),
)
def list_agents(client: ClientDep) -> AgentList:
    """Every agent and team a worker ever served, by name, with its latest definition and whether
    a live worker serves it."""
    details = _summaries(catalog.entries(client.store, client.settings))
    return AgentList(agents=[AgentSummary(**d.model_dump(exclude={"definitions"})) for d in details.values()])


@router.get(
    "/agents/{agent}",
    operation_id="getAgent",
    summary="Get an agent or team",
    response_model=AgentDetail,
    tags=["agents"],
    responses=refusals(401, 404, 422),
)
def get_agent(agent: AgentName, client: ClientDep) -> AgentDetail:
    """One agent or team, with every definition workers served. 404 if no worker ever served it."""
    details = _summaries(catalog.entries(client.store, client.settings, agent))
    if agent not in details:
        raise AgentNotFoundError(f"no worker has served an agent or team named {agent!r}: none is in the catalog")
    return details[agent]
