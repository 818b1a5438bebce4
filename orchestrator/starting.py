"""A start's write: the run and its first message, or the run a start sent again already wrote.

Shared by run control (`RunControl.start`, for every producer) and the schedules' ticks
(`orchestrator.schedules`, fired by the sweeper, which sits below run control and does not
import it), so a tick's run is written exactly as a producer's start would write it: the same
kind and definition hash, trace context, request digest and idempotency rule.

A run is written with its agent's kind and the hash of its definition, and its first step routed
to its agent's queue: from the agent as this process defines it, else from the agent catalog's
live definition (`orchestrator.catalog`), else as an agent, unrouted, for the worker to send on.
"""

from __future__ import annotations

import uuid

from sqlalchemy.exc import IntegrityError

from orchestrator import agent as registry
from orchestrator import catalog, tracing
from orchestrator.errors import RunConflictError, RunNotFoundError
from orchestrator.idempotency import StartRequest
from orchestrator.messages import Message
from orchestrator.ports import StepRef
from orchestrator.routing import owed, step_of
from orchestrator.run import RunRecord
from orchestrator.settings import Settings
from orchestrator.store import Store


def write(store: Store, settings: Settings, request: StartRequest, run_id: str) -> RunRecord | None:
    """Write the run `request` asks for under `run_id` (QUEUED), and return it; None if a run of
    the same request holds that id already (a start sent again: nothing to publish), and
    RunConflictError saying what differs if one of another request does."""
    try:
        return _create(store, settings, request, run_id)
    except IntegrityError as exc:
        existing = _existing(store, run_id, exc)
        conflict = request.conflict(existing, lambda: _first_input(store, run_id))
        if conflict is not None:
            raise RunConflictError(conflict) from None
        return None


def definition(store: Store, settings: Settings, name: str) -> tuple[str, str | None]:
    """The kind of agent `name` and the hash of its definition: as this process defines it
    (no read), else as the catalog's live definition says (read once in a while, cached),
    else an agent of unknown definition: a producer need not import the agents, the worker
    that runs the first step knows them (and records a team's kind)."""
    agent = registry.find_agent(name)
    if agent is not None:
        return agent.kind, catalog.describe(agent).hash
    found = live(store, settings, name)
    return (found.kind, found.hash) if found is not None else ("agent", None)


def live(store: Store, settings: Settings, name: str) -> catalog.Definition | None:
    """The catalog's live definition of `name` (None: none is live)."""
    return catalog.cache_of(store).live(name, settings)


def first_step(store: Store, settings: Settings, record: RunRecord) -> StepRef:
    """The step a QUEUED run is due for, routed as its agent says."""
    return step_of(record, calls=owed(store, record.run_id), definitions=lambda name: live(store, settings, name))


def _create(store: Store, settings: Settings, request: StartRequest, run_id: str) -> RunRecord:
    kind, definition_hash = definition(store, settings, request.agent)
    with tracing.starting(request.agent, run_id) as trace_context:
        return store.create_run(
            run_id=run_id,
            session_id=request.session_id or str(uuid.uuid4()),
            agent_name=request.agent,
            kind=kind,
            input_messages=[Message(role="user", content=request.input)],
            publish_grace=settings.publish_grace_seconds,
            stream=request.stream,
            user_id=request.user_id,
            session_state=request.session_state,
            priority=request.priority,
            trace_context=trace_context,
            request_digest=request.digest,
            definition_hash=definition_hash,
            webhook=request.webhook,
        )


def _first_input(store: Store, run_id: str) -> str | None:
    """The user message a run was started with."""
    return next((m.content for m in store.get_messages(run_id) if m.role == "user"), None)


def _existing(store: Store, run_id: str, conflict: IntegrityError) -> RunRecord:
    """The run whose id made an insert fail (the insert's own error if there is none)."""
    try:
        return store.get_record(run_id)
    except RunNotFoundError:
        raise conflict from None
