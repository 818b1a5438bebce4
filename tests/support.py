"""Small helpers several test files share: a clock the test moves, and a run written straight
into the store (no producer, no broker) for tests of the store's own moves."""

from __future__ import annotations

import time
import uuid

from orchestrator.messages import Message
from orchestrator.store import Store


class Clock:
    """Wall time plus an offset the test moves forward (a lease is a time the store reads)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


def new_run(store: Store, agent: str = "nobody", kind: str = "agent", text: str = "hello") -> str:
    """A QUEUED run with one user message, written directly; returns its id."""
    run_id = str(uuid.uuid4())
    store.create_run(
        run_id=run_id, session_id=f"s-{run_id[:8]}", agent_name=agent, kind=kind,
        input_messages=[Message(role="user", content=text)], publish_grace=60,
    )  # fmt: skip
    return run_id
