"""Fixtures shared by every test layer: real Redis, a PostgreSQL database per test, SQLite files,
the scripted model server, and an in-process Celery worker.

Redis and PostgreSQL must be running (`make test` starts them); a missing server fails the
run instead of skipping it, so CI cannot pass without them.

Each test cleans up what it made: its PostgreSQL database is dropped, the Redis keys of its
queues are deleted, and the processes it starts keep their temp folders under pytest's basetemp.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from kombu import Connection

from orchestrator.settings import Settings
from orchestrator.store import forget_stores
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.server import ScriptedServer
from tests.isolation import AmqpQueues, BrokerLeftovers, PgDatabases
from tests.support import Clock

REDIS_URL = os.environ.get("RATCHET_TEST_REDIS_URL", "redis://127.0.0.1:6379/14")
PG_URL = os.environ.get("RATCHET_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
AMQP_URL = os.environ.get("RATCHET_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
TEST_KEY = "sk-test-key-for-the-scripted-model"
#: The run pages' browser: Chromium and a page per test, for tests/integration/test_ui.py and test_console.py.
pytest_plugins = ("tests.integration.browser",)

#: The queue tags `make_settings` handed out in this session, in order (see `_broker_keys`).
_tags: list[str] = []
#: The test that made each tag.
_made_by: dict[str, str] = {}


@pytest.fixture(scope="session")
def redis_url() -> str:
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        pytest.fail(f"Redis is not reachable at {REDIS_URL} ({exc}); `make test` starts it")
    return REDIS_URL


@pytest.fixture(scope="session")
def amqp_url() -> str:
    try:
        with Connection(AMQP_URL, connect_timeout=3) as conn:
            conn.connect()
    except Exception as exc:
        pytest.fail(f"RabbitMQ is not reachable at {AMQP_URL} ({exc}); `make test` starts it")
    return AMQP_URL


@pytest.fixture
def amqp_settings(db_url: str, amqp_url: str) -> Iterator[Settings]:
    """Settings on RabbitMQ with queues of the test's own, deleted (with their exchanges) after it."""
    settings = make_settings(db_url, amqp_url)
    yield settings
    AmqpQueues(amqp_url).delete([settings.model_queue, settings.tools_queue, settings.control_queue])


@pytest.fixture(scope="session")
def pg_databases() -> Iterator[PgDatabases]:
    """Makes the tests' PostgreSQL databases: copies of one template migrated once per session."""
    databases = PgDatabases(PG_URL)
    try:
        databases.template()
    except Exception as exc:
        pytest.fail(f"PostgreSQL is not reachable at {PG_URL} ({exc}); `make test` starts it")
    yield databases
    forget_stores()
    databases.close()


@pytest.fixture
def pg_url(pg_databases: PgDatabases) -> Iterator[str]:
    """A migrated database of this test's own, dropped after its workers stopped: no worker's
    sweeper meets another test's runs (and republishes them into its own queues)."""
    url, drop = pg_databases.create()
    yield url
    forget_stores()
    drop()


@pytest.fixture(params=["sqlite", "postgres"])
def old_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of an empty database, on each database, that the test migrates as far as it wants
    (`tests.support.migrate_to`)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'old.db'}"
        forget_stores()
        return
    databases: PgDatabases = request.getfixturevalue("pg_databases")
    url, drop = databases.create(migrated=False)
    yield url
    forget_stores()
    drop()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each test that takes this runs on a SQLite file and on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ratchet.db'}"
    return str(request.getfixturevalue("pg_url"))


def make_settings(db_url: str, broker_url: str, **overrides: object) -> Settings:
    """Settings for one test: its own queues, so no message of another test reaches its worker.
    Their Redis keys are deleted when the test ends (`_broker_keys`). A SQLite file syncs at
    checkpoints only (NORMAL, still safe against a killed process in WAL mode): a synced commit
    took 4 ms on this machine's disk against 0.01 ms (tests/integration/test_sqlite_synchronous.py
    covers the levels themselves)."""
    tag = uuid.uuid4().hex[:8]
    _tags.append(tag)
    values: dict[str, object] = dict(
        database_url=db_url, broker_url=broker_url, model_queue=f"t.{tag}.model", tools_queue=f"t.{tag}.tools",
        control_queue=f"t.{tag}.control", soft_time_limit=20, hard_time_limit=25, lease_seconds=30,
        visibility_timeout=60, sweep_seconds=0.5, publish_grace_seconds=30, model_timeout=10,
        sqlite_synchronous="NORMAL",
    )  # fmt: skip
    values.update(overrides)
    return Settings.model_validate(values)


@pytest.fixture(scope="session", autouse=True)
def _no_broker_keys_left() -> Iterator[None]:
    """Fails the session (an error at the last test's teardown) if a key of a queue tag of this
    session is still in Redis: something kept writing after its test had cleaned up."""
    yield
    if _tags:
        left: dict[str, list[str]] = {}
        for key in BrokerLeftovers(REDIS_URL).find(_tags):
            tag = re.search(r"t\.([0-9a-f]{8})\.", key)
            left.setdefault(_made_by.get(tag[1] if tag else "", "?"), []).append(key)
        assert not left, f"tests left Redis keys of their queues behind (a worker outlived its test?): {left}"


@pytest.fixture(autouse=True)
def _broker_keys(request: pytest.FixtureRequest) -> Iterator[None]:
    """Deletes the Redis keys of the queues this test made (queues, kombu's bindings, unacked
    entries), after its workers stopped: autouse fixtures are torn down last."""
    first = len(_tags)
    yield
    made = _tags[first:]
    if made:
        _made_by.update(dict.fromkeys(made, request.node.nodeid))
        BrokerLeftovers(REDIS_URL).delete(made)


@pytest.fixture(autouse=True)
def _process_tmpdir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Processes the test starts keep their temp folders (beat's schedule, a prefork pool's
    folders, which a killed worker never removes) under pytest's basetemp, not in /tmp."""
    monkeypatch.setenv("TMPDIR", str(tmp_path_factory.mktemp("proc-tmp")))


@pytest.fixture
def clock() -> Clock:
    """A clock a test moves by hand (a lease is a time): give it to a store as `clock=`."""
    return Clock()


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
    from workers.celery.embedded import EmbeddedWorker

    with EmbeddedWorker(settings) as w:
        yield w


def settings_env(settings: Settings) -> dict[str, str]:
    """The RATCHET_* variables that reproduce these settings in another process or CLI call."""
    return {f"RATCHET_{k.upper()}": str(v) for k, v in settings.model_dump().items() if v is not None}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A chaos test lives in tests/chaos: `make test` runs that folder as a phase of its own and
    leaves it out of the other (see the Makefile), so a test marked `chaos` elsewhere would run in
    neither."""
    chaos = Path(__file__).parent / "chaos"
    stray = [item.nodeid for item in items if item.get_closest_marker("chaos") and not item.path.is_relative_to(chaos)]
    if stray:
        raise pytest.UsageError(f"marked chaos outside tests/chaos (move them there): {stray}")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Lists the modules past the size budget's first mark (tests/unit/test_sizes.py): a signal
    to look at, not a failure."""
    from tests.unit.test_sizes import MODULE_REPORT, over

    long = over(MODULE_REPORT)
    if long:
        terminalreporter.write_sep("-", f"modules over {MODULE_REPORT} lines (do they hold two concepts?)")
        for name, n in sorted(long.items(), key=lambda item: -item[1]):
            terminalreporter.write_line(f"{name}: {n}")
