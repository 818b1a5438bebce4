"""Fixtures of the unit tests that run steps: the in-memory dispatcher on a SQLite file of the
test's own, whose store reads time from a clock the test moves (a lease is a time)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.testing import InMemoryDispatcher, in_memory
from tests.support import Clock


@pytest.fixture
def inline(tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemoryDispatcher]:
    """Every step runs inline, in this process, on `tmp_path/runs.db`; agents built without a
    client publish here for the test."""
    with in_memory(tmp_path / "runs.db") as dispatcher:
        monkeypatch.setattr(dispatcher.store, "clock", clock)
        yield dispatcher
