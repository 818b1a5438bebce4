"""Fixtures shared by every test layer: real Redis, a private PostgreSQL database, SQLite files,
the scripted model server, and an in-process Celery worker.

Redis and PostgreSQL must be running (`make test` starts them); a missing server fails the
run instead of skipping it, so CI cannot pass without them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import create_engine, text

from orchestrator.settings import Settings
from orchestrator.store import forget_stores
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.server import ScriptedServer

REDIS_URL = os.environ.get("RATCHET_TEST_REDIS_URL", "redis://127.0.0.1:6379/14")
PG_URL = os.environ.get("RATCHET_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
TEST_KEY = "sk-test-key-for-the-scripted-model"


@pytest.fixture(scope="session")
def redis_url() -> str:
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        pytest.fail(f"Redis is not reachable at {REDIS_URL} ({exc}); `make test` starts it")
    return REDIS_URL


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A database of this test session's own, dropped at the end."""
    name = f"ratchet_test_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:
        pytest.fail(f"PostgreSQL is not reachable at {PG_URL} ({exc}); `make test` starts it")
    yield PG_URL.rsplit("/", 1)[0] + "/" + name
    forget_stores()
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each test that takes this runs on a SQLite file and on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ratchet.db'}"
    return str(request.getfixturevalue("pg_url"))


def make_settings(db_url: str, broker_url: str, **overrides: object) -> Settings:
    """Settings for one test: its own queues, so no message of another test reaches its worker."""
    tag = uuid.uuid4().hex[:8]
    values: dict[str, object] = dict(
        database_url=db_url, broker_url=broker_url, model_queue=f"t.{tag}.model", tools_queue=f"t.{tag}.tools",
        control_queue=f"t.{tag}.control", soft_time_limit=20, hard_time_limit=25, lease_seconds=30,
        visibility_timeout=60, sweep_seconds=0.5, publish_grace_seconds=30, model_timeout=10,
    )  # fmt: skip
    values.update(overrides)
    return Settings.model_validate(values)


@pytest.fixture
def settings(db_url: str, redis_url: str) -> Settings:
    return make_settings(db_url, redis_url)


@pytest.fixture(scope="session")
def scripted_server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as server:
        yield server


@pytest.fixture
def scripted(scripted_server: ScriptedServer, monkeypatch: pytest.MonkeyPatch) -> ScriptedServer:
    """The scripted model, reset, with OPENAI_BASE_URL and OPENAI_API_KEY pointing at it."""
    scripted_server.configure(ScriptConfig())
    scripted_server.reset()
    monkeypatch.setenv("OPENAI_BASE_URL", scripted_server.url)
    monkeypatch.setenv("OPENAI_API_KEY", TEST_KEY)
    return scripted_server


@pytest.fixture
def worker(settings: Settings) -> Iterator[object]:
    """A real Celery worker (threads pool) consuming this test's queues in this process."""
    from workers.embedded import EmbeddedWorker

    with EmbeddedWorker(settings) as w:
        yield w


def settings_env(settings: Settings) -> dict[str, str]:
    """The RATCHET_* variables that reproduce these settings in another process or CLI call."""
    return {f"RATCHET_{k.upper()}": str(v) for k, v in settings.model_dump().items() if v is not None}
