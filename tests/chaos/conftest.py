"""Fixtures of the chaos tests: a fresh database per test (PostgreSQL, and SQLite where the case
applies), a private scripted model server, and a `Cluster` with its own Redis."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.testing.server import ScriptedServer
from tests.chaos.harness import Cluster


@pytest.fixture(params=["postgres", "sqlite"])
def chaos_db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database of this test's own: a leftover run of another test must not meet its sweeper."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ratchet.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def model() -> Iterator[ScriptedServer]:
    """A scripted model server of this test's own (a killed call's handler may still be sleeping)."""
    with ScriptedServer() as server:
        yield server


@pytest.fixture
def make_cluster(tmp_path: Path, chaos_db: str, model: ScriptedServer) -> Iterator[Callable[..., Cluster]]:
    """Build the test's cluster, with settings overridden as the test needs; closed at the end."""
    built: list[Cluster] = []

    def make(**overrides: Any) -> Cluster:
        cluster = Cluster(tmp_path, chaos_db, model, **overrides)
        built.append(cluster)
        return cluster

    yield make
    for cluster in built:
        cluster.close()


@pytest.fixture
def cluster(make_cluster: Callable[..., Cluster]) -> Cluster:
    """A cluster with the chaos settings (short limits, a fast sweeper)."""
    return make_cluster()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test in this folder is a chaos test, marked or not: `make test` runs them in a phase
    of their own (see the Makefile)."""
    here = Path(__file__).parent
    for item in items:
        if item.path.is_relative_to(here):
            item.add_marker(pytest.mark.chaos)
