"""What a step object is given by the runner that runs it (`StepRunner`): the settings, the
store, and the runner's three parts of the step protocol a step uses between its claim and its
commit: a write tried again through transient errors (`durably`), the end of the step (`end`:
nothing of it left in flight) and the publishing of the next step after the commit (`publish`).

A step object (`ModelStep`, `ToolStep`) works through this and nothing else of the runner, so
what it does reads top to bottom in its own module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from orchestrator.ports import StepRef
from orchestrator.run import RunRecord
from orchestrator.settings import Settings
from orchestrator.store import Claim, Store

T = TypeVar("T")


class Durably(Protocol):
    """`StepRunner.durably`: a write of the claimed step, tried again through transient database
    errors for as long as the lease lasts; `landed` turns the run, found moved on by a write
    that committed before its connection dropped, into the result."""

    def __call__(self, claim: Claim, write: Callable[[], T], *, landed: Callable[[RunRecord], T] | None = None) -> T:
        """Run `write`, and again after a transient error, unless it landed."""
        ...


@dataclass(frozen=True, kw_only=True)
class StepContext:
    """The runner's settings, store and step protocol, as its step objects use them."""

    settings: Settings
    store: Store
    durably: Durably
    #: The step committed (or parked): nothing of it is left for a failure handler to flush.
    end: Callable[[Claim], None]
    #: Publish a step after the commit that made it due (a broker failure is logged: the
    #: sweeper publishes it from the run's outbox marker).
    publish: Callable[[StepRef], None]
    #: What ends a step at its soft time limit (never taken for a tool's or a sink's failure).
    timeouts: tuple[type[BaseException], ...] = ()
    #: Whether an exception is the worker stopping (never a tool's error).
    stopping: Callable[[BaseException], bool] = lambda exc: False
