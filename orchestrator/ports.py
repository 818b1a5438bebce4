"""The domain's ports: how it asks for a step to run, without knowing about Celery, where a
streamed run's live events go, how waiters hear of final moves, and where the limits every
worker shares are kept, without knowing about Redis. Protocols and the values that cross them
only: which implementation a process uses is its runtime's choice (`orchestrator.runtime`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from orchestrator.events import RunEvent
    from orchestrator.models.base import RateLimit

StepKind = Literal["model", "tools"]


@dataclass(frozen=True, kw_only=True)
class StepRef:
    """One step to run: only ids cross the broker. `countdown` delays delivery (short waits only).

    Where it goes and in which order are `orchestrator.routing`'s: `queue` names the queue its
    agent or tool asked for (None: the default queue of its kind, RATCHET_MODEL_QUEUE or
    RATCHET_TOOLS_QUEUE); `priority` is its run's, 0-9, higher first (None: none, as 0).
    `routed` is False when the publisher does not define the run's agent and so could not tell
    its queue: the step goes to the default queue, and the worker that takes it sends it on to
    its agent's queue if that names one. `definition` is set on a step a worker handed on to the
    workers of its run's definition (`orchestrator.deploys`): only a worker serving that
    definition of the run's agent may take it (on Celery, from that queue's version queue)."""

    run_id: str
    seq: int
    kind: StepKind
    countdown: float | None = None
    queue: str | None = None
    priority: int | None = None
    routed: bool = True
    #: The run's stored trace context (`RunRecord.trace_context`), for the publish's span and headers.
    trace_context: str | None = None
    definition: str | None = None


@dataclass(frozen=True, kw_only=True)
class Delivery:
    """How a step's message reached the process running it, for the step's span
    (`orchestrator.tracing`: OpenTelemetry's messaging attributes)."""

    #: `messaging.system`: the dispatcher's ("celery" from a Celery worker, "inline" in memory).
    system: str
    #: The queue it was taken from (None: not known).
    queue: str | None = None
    #: The message's id (a Celery task id).
    message_id: str | None = None
    #: The span current while the step runs is the messaging instrumentation's own for this
    #: delivery (Celery's `run/<task>`, with its instrumentation on): the step's span is its child.
    in_delivery_span: bool = False


class Dispatcher(Protocol):
    """Publishes steps to workers."""

    def publish(self, step: StepRef) -> None:
        """Send the step's task. Raise on failure; the run's outbox marker makes it safe to."""
        ...


@runtime_checkable
class QueueLengths(Protocol):
    """A dispatcher that can say how many steps wait in its queues (for `Client.metrics`)."""

    def queue_lengths(self) -> dict[str, int]:
        """Messages waiting in each queue, by queue name. Raise if the broker cannot be asked."""
        ...


class DeltaSink(Protocol):
    """Carries a streamed run's live events (RunContent deltas, StepRestarted) from the worker
    that makes them to every reader. Only runs started with stream=True write to it."""

    def write(self, event: RunEvent) -> None:
        """Append one live event of `event.run_id`; its id is higher than the step's earlier ones.
        It may be stored later, in the order written, but by the next `flush` of its run."""
        ...

    def read(self, run_id: str, cursor: str | None) -> tuple[list[RunEvent], str | None]:
        """The run's live events written after `cursor` (None: from the first kept), in the
        order written, and the cursor to pass next time."""
        ...

    def wait(self, run_id: str, cursor: str | None, timeout: float) -> tuple[list[RunEvent], str | None]:
        """Return once the run may have live events after `cursor`, or after `timeout` seconds: a
        reader's wait between polls, woken by a delta at once where the sink can block on one.
        Returns what it read on the way, as `read` does (a sink that only sleeps: none, and
        `cursor`), so a reader woken by a delta need not read the sink again."""
        ...

    def discard(self, run_ids: Sequence[str]) -> None:
        """Forget the live events of these runs (deleted from the store). A sink that cannot
        reach its server logs it and returns: what it keeps expires after RATCHET_STREAM_TTL."""
        ...

    def flush(self, run_id: str) -> None:
        """Return once every event of the run this process wrote is stored (or given up on). A
        step calls it at the end of its model call, before its commit: the reader's id rule
        (`orchestrator.reader`) needs every delta stored before a durable event sorting above it."""
        ...


class FinalChannel(Protocol):
    """Wakes waiters when a run stops, where the database cannot (SQLite): the store announces
    each final move after its commit, and `Client.wait` wakes on it between its polls. Best
    effort: a lost announcement costs a waiter its next poll's delay, nothing more."""

    def announce(self, run_ids: list[str]) -> None:
        """Say that these runs reached a final status (their moves committed)."""
        ...

    def subscribe(self, run_id: str) -> threading.Event | None:
        """An event set when the run is announced; None if announcements cannot be received now."""
        ...

    def unsubscribe(self, run_id: str, event: threading.Event) -> None:
        """Stop setting `event` for the run."""
        ...


# ---------------------------------------------------------------- flow control


@dataclass(frozen=True, kw_only=True)
class Ask:
    """What a model step asks of the limiter before its call (`orchestrator.limits`)."""

    run_id: str
    #: The run's concurrency key, and the most runs of that key in progress at once (0: none).
    key: str | None = None
    limit: int = 0
    #: The model's limits and the id they are kept under (None: not limited), and the tokens
    #: the call is estimated at.
    model: str | None = None
    rate: RateLimit | None = None
    tokens: int = 0


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """The limiter's answer: go (`reason` None), or wait about `wait` seconds, because of
    "concurrency" (the key's runs are all in progress), "requests" or "tokens" (the model's
    rates), or "blocked" (the provider said 429)."""

    wait: float = 0.0
    reason: str | None = None

    @property
    def admitted(self) -> bool:
        return self.reason is None


@dataclass(frozen=True, kw_only=True)
class Place:
    """A place a run holds among its key's runs, as the limiter lists it (`Limiter.held`)."""

    key: str
    run_id: str
    #: When it expires unless renewed, on the limiter's own clock: `Limiter.free` frees it only
    #: while it still has this stamp, so a run whose next step renewed it meanwhile keeps it.
    until: float


class Limiter(Protocol):
    """Keeps the limits every worker shares: runs in progress per key, and each model's rates.
    An implementation that cannot reach its server logs it and lets the step go (fails open)."""

    def admit(self, ask: Ask) -> Verdict:
        """All or nothing: the run's place among its key's runs, one request and the call's
        tokens, or none of them and how long to wait. A run that holds its place keeps it
        (renewed for RATCHET_RUN_SLOT_SECONDS) whatever the verdict."""
        ...

    def wait_for_room(self, key: str, limit: int, step: StepRef) -> bool:
        """Keep `step` (a run parked for want of room) to be published when a run of `key` ends,
        highest priority first, then first parked. True when there is room already: its place
        is taken for it, and the caller publishes it now."""
        ...

    def release(self, run_id: str, limit: int) -> StepRef | None:
        """The run ended or paused: free its place (or forget it among the waiting), and give
        that place to the next run waiting for one; returns that run's step, to publish."""
        ...

    def held(self) -> list[Place]:
        """Every place held now, of every key: what the sweeper checks against the store, to free
        those of runs that ended while a release could not reach the limiter (empty then too)."""
        ...

    def free(self, place: Place, limit: int) -> tuple[bool, StepRef | None]:
        """Free `place` as `release` would, if it is still held as `held` listed it (a place
        renewed since is kept); whether it was freed, and the step of the run that takes it."""
        ...

    def settle(self, model: str, rate: RateLimit, tokens: int) -> None:
        """Correct a call's token estimate by what it used besides (negative: less). It may be
        counted at this process's next `admit` of the model, in that round trip."""
        ...

    def block(self, model: str, seconds: float) -> None:
        """The provider answered 429: no call of `model` for `seconds`, on any worker."""
        ...
