"""Helpers of the flow-control tests (tests/unit/test_flow_inline.py, and the integration tests
of the limiter and the HTTP API): runs stepped by hand on the in-memory dispatcher."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from orchestrator import Settings
from orchestrator.ports import Limiter
from orchestrator.testing import InMemoryDispatcher, in_memory


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def lookup(query: str) -> str:
    """Look something up."""
    return f"found {query}"


@contextmanager
def limited(tmp_path: Path, *, limiter: Limiter | None = None, **settings: Any) -> Iterator[InMemoryDispatcher]:
    """The in-memory dispatcher with these settings (and this limiter, instead of its own on the
    virtual clock); steps run when the test says (`autorun=False`)."""
    values: dict[str, Any] = dict(
        database_url=f"sqlite:///{tmp_path / 'runs.db'}", sqlite_synchronous="NORMAL", max_countdown=900.0,
        dispatcher="orchestrator.testing.inmemory:InMemoryDispatcher",
    )  # fmt: skip
    with in_memory(Settings(**{**values, **settings}), autorun=False, limiter=limiter) as dispatcher:
        yield dispatcher


def run_step_of(dispatcher: InMemoryDispatcher, run_id: str) -> None:
    """Run the queued steps, in order, up to and including the next one of `run_id`."""
    while (ran := dispatcher.run_next()) is not None and ran.run_id != run_id:
        pass
    assert ran is not None, f"no step of run {run_id} was queued"


def logged(dispatcher: InMemoryDispatcher, run_id: str, kind: str) -> list[dict[str, Any]]:
    return [e.detail for e in dispatcher.client.get_log(run_id) if e.kind == kind]
