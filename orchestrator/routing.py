"""Where a step goes and in which order: its queue, from its agent's definition, and its
priority, from its run's row. Every publisher builds its steps here, so a run's first step, the
steps a worker publishes after a commit, a continue and the sweeper's republish all go alike.

Queues. An agent's steps go to its `queue`, or the default queue of their kind
(RATCHET_MODEL_QUEUE, RATCHET_TOOLS_QUEUE). A tool batch that calls a tool naming a queue
(`@tool(queue="gpu")`) goes to that queue, whatever else it calls: the batch runs in one task,
and the tools of one agent may name one queue between them (a second is a ConfigurationError
when the agent is defined). Nothing is read for it on a step's path: the queue is a function of
the definition and, for a batch, of the calls the committed reply made.

A publisher that does not define the run's agent (a producer without its module) routes by the
agent catalog's live definition of it (`orchestrator.catalog`), which names the same queues.
Without one (no worker ever served it, or none lately) it cannot tell: it publishes to the
default queue, unrouted, and the worker that takes the step sends it on to its agent's queue when
that names one (`StepRunner.reroute`): a second broker hop.

Priority. 0-9, higher first; a run without one is as 0. It is stored with the run and carried
on the record every publisher already holds, so it costs no read either. Team members and forks
take their run's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, cast

from orchestrator.agent import find_agent, registered
from orchestrator.messages import ToolCall, unanswered_calls
from orchestrator.ports import StepKind, StepRef
from orchestrator.run import RunRecord
from orchestrator.store import Store

#: A tool batch's calls, or how to read them (only a batch of an agent with a routed tool reads).
Calls = Sequence[ToolCall] | Callable[[], Sequence[ToolCall]]


class RoutedTool(Protocol):
    """What routing reads of a tool: its name and the queue it names."""

    @property
    def name(self) -> str: ...
    @property
    def queue(self) -> str | None: ...


class Routable(Protocol):
    """What routing reads of a definition: an `Agent`, or the catalog's `Definition` of one."""

    @property
    def queue(self) -> str | None: ...
    @property
    def tool_queue(self) -> str | None: ...
    @property
    def tools(self) -> Sequence[RoutedTool]: ...


#: Where a publisher that does not define an agent finds its definition by name (the catalog).
Definitions = Callable[[str], Routable | None]


def step_of(
    record: RunRecord, *, calls: Calls = (), countdown: float | None = None, definitions: Definitions | None = None
) -> StepRef:
    """The step a QUEUED run is due for, as its row records it, routed by its agent: the one this
    process defines, else the one `definitions` finds (unrouted when neither is there).

    `calls`: for a tool step, the batch's calls (or a function that reads them): a batch that
    calls a routed tool goes to that tool's queue."""
    kind = cast(StepKind, record.next_step or "model")
    agent: Routable | None = find_agent(record.agent_name)
    if agent is None and definitions is not None:
        agent = definitions(record.agent_name)
    if agent is None:
        return StepRef(
            run_id=record.run_id,
            seq=record.seq,
            kind=kind,
            countdown=countdown,
            priority=record.priority,
            routed=False,
            trace_context=record.trace_context,
        )
    queue = queue_for(agent, kind, calls if callable(calls) else lambda: calls)
    return StepRef(
        run_id=record.run_id,
        seq=record.seq,
        kind=kind,
        countdown=countdown,
        queue=queue,
        priority=record.priority,
        trace_context=record.trace_context,
    )


def queue_for(agent: Routable, kind: str, calls: Callable[[], Sequence[ToolCall]]) -> str | None:
    """The queue of `agent`'s step of `kind` (None: the default queue of its kind). A tool batch
    that calls a tool naming a queue goes there; `calls` reads the batch, only then."""
    if kind == "tools" and agent.tool_queue is not None:
        routed = {t.name for t in agent.tools if t.queue is not None}
        if any(c.name in routed for c in calls()):
            return agent.tool_queue
    return agent.queue


def owed(store: Store, run_id: str) -> Callable[[], Sequence[ToolCall]]:
    """A function that reads the calls a run's tool step owes (for `step_of` off a step's path)."""
    return lambda: unanswered_calls(store.get_messages(run_id))


def named_queues() -> set[str]:
    """Every queue the agents and tools registered in this process name (a worker that runs
    them all consumes these besides the default queues)."""
    found: set[str] = set()
    for agent in registered():
        found.update(q for q in (agent.queue, agent.tool_queue) if q is not None)
    return found
