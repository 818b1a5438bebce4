"""What the deploy tests share: an agent's earlier version as the catalog held it, a run put on
it, and every version but this process's gone (`tests/unit/test_deploys.py`,
`tests/integration/test_deploy_api.py`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import update

from orchestrator.agent import AgentDefinition
from orchestrator.catalog import Definition, describe, live_seconds
from orchestrator.store.store import Store
from orchestrator.store.tables import agent_catalog, runs
from orchestrator.testing import InMemoryDispatcher
from tests.support import Clock


def older(agent: AgentDefinition, change: Callable[[dict[str, Any]], None]) -> Definition:
    """The definition `agent` had in an earlier version: its description with `change` made."""
    body = describe(agent).body()
    change(body)
    return Definition.from_body(body)


def served_once(inline: InMemoryDispatcher, definition: Definition) -> None:
    """A worker of `definition` served it (the catalog has it, seen now)."""
    inline.store.catalog.write([definition.served()])


def on(inline: InMemoryDispatcher, run_id: str, definition: Definition) -> None:
    """The run is on `definition`, as a producer or a worker of that version left it."""
    with inline.store.engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.run_id == run_id).values(definition_hash=definition.hash))


def gone(inline: InMemoryDispatcher, clock: Clock) -> None:
    """The workers of every definition but this process's stopped: none is live any more."""
    clock.advance(live_seconds(inline.settings) + 1)


def retired(store: Store, definition_hash: str) -> None:
    """The workers of `definition_hash` stopped long ago: its catalog rows are not live any more
    (a test that swaps an agent's definition in one process, as a deploy replaces its workers)."""
    with store.engine.begin() as conn:
        conn.execute(
            update(agent_catalog).where(agent_catalog.c.definition_hash == definition_hash).values(last_seen=0.0)
        )


def with_instructions(text: str) -> Callable[[dict[str, Any]], None]:
    """An earlier version whose instructions were other (`text`: their digest)."""
    return lambda body: body.update(instructions_digest=text)


def first_tool_takes(parameters: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    """An earlier version whose first tool took other arguments (`parameters`: their schema)."""

    def change(body: dict[str, Any]) -> None:
        body["tools"][0]["parameters"] = parameters

    return change
