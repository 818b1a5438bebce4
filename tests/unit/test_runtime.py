"""The runtime: one per process and settings, its parts read off the settings (RATCHET_REDIS_URL
puts the live deltas, final wakes and limits on Redis; nothing is guessed from the broker's URL),
its adapters found by entry point, and a domain that names no `workers` module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import orchestrator
from orchestrator import Client, Settings, runtime
from orchestrator.errors import ConfigurationError
from orchestrator.limits import LocalLimiter
from orchestrator.ports import StepRef
from orchestrator.store import forget_stores
from orchestrator.table_sink import TableDeltaSink
from orchestrator.testing import in_memory
from workers.celery.dispatch import CeleryDispatcher
from workers.redis.delta_sink import RedisDeltaSink
from workers.redis.finals import RedisFinals
from workers.redis.limiter import RedisLimiter

#: No server listens here: building an adapter must not connect.
NOWHERE = "redis://127.0.0.1:1/0"
#: `Recorder` as RATCHET_DISPATCHER names it (this module's name as the test runner imported it).
RECORDER = f"{__name__}:Recorder"


class Recorder:
    """A dispatcher that keeps what it is asked to publish."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.steps: list[StepRef] = []

    def publish(self, step: StepRef) -> None:
        self.steps.append(step)


def sqlite(tmp_path: Path, **values: object) -> Settings:
    return Settings.model_validate({"database_url": f"sqlite:///{tmp_path / 'runs.db'}", **values})


def test_the_redis_url_defaults_to_a_redis_brokers_and_the_limiters_to_it() -> None:
    assert Settings(broker_url="redis://broker:6379/0").redis_url == "redis://broker:6379/0"
    assert Settings(broker_url="rediss://broker:6380/0").limiter_url == "rediss://broker:6380/0"
    assert Settings().redis_url is None and Settings().limiter_url is None  # the filesystem broker
    assert Settings(broker_url="amqp://guest@rabbit//").redis_url is None
    given = Settings(broker_url="amqp://guest@rabbit//", redis_url="redis://shared/1")
    assert (given.redis_url, given.limiter_url) == ("redis://shared/1", "redis://shared/1")
    apart = Settings(broker_url="redis://broker/0", limiter_url="redis://limits/2")
    assert (apart.redis_url, apart.limiter_url) == ("redis://broker/0", "redis://limits/2")
    none = Settings.from_env({"RATCHET_BROKER_URL": "redis://broker/0", "RATCHET_REDIS_URL": ""})
    assert (none.redis_url, none.limiter_url) == (None, None)  # "" sets none, even on a Redis broker


def test_a_redis_url_builds_the_redis_adapters_whatever_the_broker(tmp_path: Path) -> None:
    settings = sqlite(tmp_path, broker_url="filesystem://localhost/", redis_url=NOWHERE)
    built = runtime.build(settings, dispatcher=Recorder())
    assert isinstance(built.deltas, RedisDeltaSink)
    assert isinstance(built.finals, RedisFinals) and built.finals.url == NOWHERE  # SQLite cannot notify
    assert isinstance(built.limiter, RedisLimiter)


def test_without_a_redis_url_a_redis_broker_gets_the_table_no_finals_and_local_limits(tmp_path: Path) -> None:
    settings = sqlite(tmp_path, broker_url=NOWHERE, redis_url="")
    built = runtime.build(settings, dispatcher=Recorder())
    assert isinstance(built.deltas, TableDeltaSink)
    assert built.finals is None
    assert isinstance(built.limiter, LocalLimiter)


def test_the_limiter_url_alone_shares_the_limits_and_nothing_else(tmp_path: Path) -> None:
    settings = sqlite(tmp_path, broker_url="amqp://guest@rabbit//", limiter_url=NOWHERE)
    built = runtime.build(settings, dispatcher=Recorder())
    assert isinstance(built.limiter, RedisLimiter)
    assert isinstance(built.deltas, TableDeltaSink) and built.finals is None


def test_the_default_dispatcher_is_found_by_its_entry_point_name() -> None:
    assert Settings().dispatcher == "celery"
    assert runtime.adapter(runtime.DISPATCHERS, "celery", hint="") is CeleryDispatcher
    assert runtime.adapter(runtime.DISPATCHERS, RECORDER, hint="") is Recorder


def test_a_dispatcher_that_is_not_installed_says_what_to_do() -> None:
    with pytest.raises(ConfigurationError, match=r"no adapter 'kafka' is installed.*pip install -e \..*module:Class"):
        runtime.adapter(runtime.DISPATCHERS, "kafka", hint="or set RATCHET_DISPATCHER to a module:Class")
    with pytest.raises(ConfigurationError, match="'no.such.module:Thing' cannot be imported"):
        runtime.adapter(runtime.DISPATCHERS, "no.such.module:Thing", hint="")


def test_every_client_of_one_settings_shares_the_processs_runtime_until_its_stores_are_forgotten(
    tmp_path: Path,
) -> None:
    settings = sqlite(tmp_path, dispatcher=RECORDER)
    first = Client(settings).runtime
    assert Client(settings).runtime is first is runtime.current(settings)
    assert isinstance(first.dispatcher, Recorder)
    forget_stores()  # what a forked worker and the tests' fixtures do
    again = runtime.current(settings)
    assert again is not first and again.store is not first.store
    assert again.dispatcher is first.dispatcher and again.limiter is first.limiter  # built once per settings


def test_a_client_given_a_store_or_a_dispatcher_keeps_the_processs_other_parts(tmp_path: Path) -> None:
    settings = sqlite(tmp_path, dispatcher=RECORDER)
    mine = Recorder()
    own = Client(settings, dispatcher=mine).runtime
    process = runtime.current(settings)
    assert own.dispatcher is mine and own.store is process.store and own.limiter is process.limiter


def test_in_memory_installs_its_runtime_for_its_settings_and_takes_it_back_after(tmp_path: Path) -> None:
    settings = sqlite(tmp_path, dispatcher=RECORDER)
    with in_memory(settings) as inline:
        assert Client(settings).runtime is inline.runtime is inline.runner.runtime
        assert inline.runtime.dispatcher is inline and inline.runtime.limiter is inline.limiter
    assert runtime.current(settings) is not inline.runtime


def _names_workers(path: Path) -> list[str]:
    """Where a module imports `workers` or holds a string naming one of its modules (docstrings,
    which describe, and comments aside)."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "workers" for a in node.names):
            found.append(f"{path}:{node.lineno}: import")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "workers":
            found.append(f"{path}:{node.lineno}: from-import")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if "workers." in node.value:
                found.append(f"{path}:{node.lineno}: {node.value!r}")
    return found


def test_no_module_of_the_domain_names_a_workers_module_not_even_in_a_string() -> None:
    root = Path(orchestrator.__file__).parent
    found = [hit for path in sorted(root.rglob("*.py")) for hit in _names_workers(path)]
    assert found == []
