"""A start's write: the run and its first message, or the run a start sent again already wrote.

Shared by run control (`RunControl.start`, for every producer) and the schedules' ticks
(`orchestrator.schedules`, fired by the sweeper, which sits below run control and does not
import it), so a tick's run is written exactly as a producer's start would write it: the same
kind and definition hash, trace context, request digest and idempotency rule.

A run is written with its agent's kind and the hash of its definition, and its first step routed
to its agent's queue: from the agent as this process defines it, else from the agent catalog's
live definition (`orchestrator.catalog`), else as an agent, unrouted, for the worker to send on.
From the same definition come the run's deadline when the start gives none (`Agent(run_timeout=)`)
and the bound on the agent's QUEUED runs (`Agent(max_queued=)`, else RATCHET_MAX_QUEUED_PER_AGENT);
with RATCHET_MAX_QUEUED_PER_USER, its user's too. A start under a bound is written through
`Store.backlog` (`store/backlog.py`): counted with the starts racing it, refused with
QueueFullError when full, unless it is a start sent again whose run exists (then that run).
A producer that knows neither the agent nor a live definition of it writes the run without the
agent's deadline and bound (the setting's bounds still apply).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import IntegrityError

from orchestrator import agent as registry
from orchestrator import catalog, tracing
from orchestrator.errors import QueueFullError, RunConflictError, RunNotFoundError
from orchestrator.idempotency import StartRequest
from orchestrator.messages import Message
from orchestrator.ports import StepRef
from orchestrator.routing import owed, step_of
from orchestrator.run import RunRecord
from orchestrator.settings import Settings
from orchestrator.store import Store
from orchestrator.store.backlog import Bound


@dataclass(frozen=True, kw_only=True)
class Defined:
    """What a start takes from its agent's definition: its kind and definition hash, the deadline
    its runs get and the bound on its QUEUED runs (None: unknown, or none)."""

    kind: str
    definition_hash: str | None
    run_timeout: float | None = None
    max_queued: int | None = None


def write(store: Store, settings: Settings, request: StartRequest, run_id: str) -> RunRecord | None:
    """Write the run `request` asks for under `run_id` (QUEUED), and return it; None if a run of
    the same request holds that id already (a start sent again: nothing to publish), and
    RunConflictError saying what differs if one of another request does. QueueFullError if a
    bound on the QUEUED runs refuses it (a start sent again is the same start first)."""
    try:
        return _create(store, settings, request, run_id)
    except IntegrityError as exc:
        existing = _existing(store, run_id, exc)
    except QueueFullError as full:
        try:  # a start sent again whose run was written: the same start, as above
            existing = store.get_record(run_id)
        except RunNotFoundError:
            raise full from None
    conflict = request.conflict(existing, lambda: _first_input(store, run_id))
    if conflict is not None:
        raise RunConflictError(conflict) from None
    return None


def defined(store: Store, settings: Settings, name: str) -> Defined:
    """What a start of agent `name` takes from its definition: as this process defines it (no
    read), else as the catalog's live definition says (read once in a while, cached), else an
    agent of unknown definition: a producer need not import the agents, the worker that runs
    the first step knows them (and records a team's kind)."""
    agent = registry.find_agent(name)
    if agent is not None:
        return Defined(
            kind=agent.kind,
            definition_hash=catalog.describe(agent).hash,
            run_timeout=agent.run_timeout,
            max_queued=agent.max_queued,
        )
    found = live(store, settings, name)
    if found is None:
        return Defined(kind="agent", definition_hash=None)
    return Defined(
        kind=found.kind, definition_hash=found.hash, run_timeout=found.run_timeout, max_queued=found.max_queued
    )


def definition(store: Store, settings: Settings, name: str) -> tuple[str, str | None]:
    """The kind of agent `name` and the hash of its definition (`defined`)."""
    found = defined(store, settings, name)
    return found.kind, found.definition_hash


def bounds(settings: Settings, request: StartRequest, agent: Defined) -> list[Bound]:
    """The bounds on QUEUED runs a start of `request` is checked against: its agent's
    (`max_queued=`, else RATCHET_MAX_QUEUED_PER_AGENT) and its user's (RATCHET_MAX_QUEUED_PER_USER,
    for a run with a user_id)."""
    found: list[Bound] = []
    if agent.max_queued is not None:
        found.append(
            Bound(scope="agent", key=request.agent, limit=agent.max_queued, named=f"its max_queued={agent.max_queued}")
        )
    elif settings.max_queued_per_agent is not None:
        limit = settings.max_queued_per_agent
        found.append(
            Bound(scope="agent", key=request.agent, limit=limit, named=f"RATCHET_MAX_QUEUED_PER_AGENT={limit}")
        )
    if request.user_id is not None and settings.max_queued_per_user is not None:
        limit = settings.max_queued_per_user
        found.append(
            Bound(scope="user", key=request.user_id, limit=limit, named=f"RATCHET_MAX_QUEUED_PER_USER={limit}")
        )
    return found


def live(store: Store, settings: Settings, name: str) -> catalog.Definition | None:
    """The catalog's live definition of `name` (None: none is live)."""
    return catalog.cache_of(store).live(name, settings)


def first_step(store: Store, settings: Settings, record: RunRecord) -> StepRef:
    """The step a QUEUED run is due for, routed as its agent says."""
    return step_of(record, calls=owed(store, record.run_id), definitions=lambda name: live(store, settings, name))


def _create(store: Store, settings: Settings, request: StartRequest, run_id: str) -> RunRecord:
    agent = defined(store, settings, request.agent)
    limits = bounds(settings, request, agent)
    with tracing.starting(request.agent, run_id) as trace_context:
        run: dict[str, Any] = dict(
            run_id=run_id,
            session_id=request.session_id or str(uuid.uuid4()),
            agent_name=request.agent,
            kind=agent.kind,
            input_messages=[Message(role="user", content=request.input)],
            publish_grace=settings.publish_grace_seconds,
            stream=request.stream,
            user_id=request.user_id,
            session_state=request.session_state,
            priority=request.priority,
            trace_context=trace_context,
            request_digest=request.digest,
            definition_hash=agent.definition_hash,
            webhook=request.webhook,
            run_timeout=request.run_timeout if request.run_timeout is not None else agent.run_timeout,
        )
        return store.backlog.create(limits, **run) if limits else store.create_run(**run)


def _first_input(store: Store, run_id: str) -> str | None:
    """The user message a run was started with."""
    return next((m.content for m in store.get_messages(run_id) if m.role == "user"), None)


def _existing(store: Store, run_id: str, conflict: IntegrityError) -> RunRecord:
    """The run whose id made an insert fail (the insert's own error if there is none)."""
    try:
        return store.get_record(run_id)
    except RunNotFoundError:
        raise conflict from None
