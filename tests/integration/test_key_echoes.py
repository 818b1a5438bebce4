"""The API key a provider echoes back in an error, in every form it may take (as it is, without
its prefix, URL-encoded, masked but for its ends, its last ten characters), for an OpenAI-style
key and for a gateway's token without `sk-`: a real worker process (`ratchet worker`) runs a run
whose calls fail with such errors, first a 500 it retries, then a 401, and none of those forms
reaches the run's rows (its error, its log, its events), `ratchet show`, Redis, or the worker's
log file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest

from orchestrator import Client, RunStatus
from orchestrator.testing.script import Fault, ScriptConfig
from orchestrator.testing.server import ScriptedServer
from orchestrator.testing.waiting import wait_until
from tests.conftest import make_settings, settings_env
from tests.integration.test_model_faults_on_a_worker import BrokerTap, decoded, redis_texts, store_texts
from tests.integration.test_native_workers import command, worker_env
from workers.cli.commands import main as ratchet

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """The worker processes a test starts, stopped (warm shutdown, then killed) when it ends."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def echoes(key: str, bare: str) -> str:
    """What a provider says of a key it refused, in every form it may quote it."""
    masked = f"{key[:6]}{'*' * 24}{key[-4:]}"
    return (
        f"Incorrect API key provided: {masked}. You sent {key} ({bare} without its prefix), "
        f"{quote(key, safe='')} and {quote_plus(key)} URL-encoded; the key ending {key[-10:]}."
    )


@pytest.mark.parametrize("prefix", ["sk-proj-", "gw-"], ids=["openai-key", "gateway-token"])
def test_no_form_of_the_key_a_provider_echoes_reaches_a_row_an_event_ratchet_show_redis_or_a_worker_log(
    prefix: str, redis_url: str, scripted: ScriptedServer, tmp_path: Path, processes: list[subprocess.Popen[bytes]],
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    # Given a key whose every form holds one of these random pieces (its head, its tail, and
    # its last four characters after a mask), and a provider that echoes it in each form
    marker = uuid.uuid4().hex
    key = f"{prefix}{marker[:12]}/+={marker[12:]}"
    pieces = [marker[:12], marker[-10:], "*" + marker[-4:]]
    said = echoes(key, key.removeprefix(prefix))
    scripted.configure(
        ScriptConfig(faults=[Fault(status=500, message=said), Fault(status=401, message=said, times=None)])
    )
    settings = make_settings(f"sqlite:///{tmp_path / 'ratchet.db'}", redis_url)
    client = Client(settings)
    log = tmp_path / "worker.log"

    # When a run goes through a worker process, with every Redis publication tapped
    with BrokerTap(redis_url) as tap, log.open("wb") as out:
        env = worker_env(settings, scripted, RATCHET_APP="tests.integration.native_agents", OPENAI_API_KEY=key)
        processes.append(
            subprocess.Popen(
                command("ratchet"), env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )  # fmt: skip
        run = client.start("native-agent", input="hello").run_id
        ended = client.wait(run, timeout=60)
        # Celery logs the task's failure and sends task-failed after the failure handler stored it
        wait_until(lambda: "raised expected" in log.read_text(errors="replace"), timeout=20, what="the failure")
        wait_until(lambda: tap.find("task-failed", run), timeout=20, what="the task-failed event")

    # Then the run is in ERROR after one retry, its error the provider's words with the key masked
    assert ended.status == RunStatus.ERROR and ended.error is not None, log.read_text(errors="replace")[-3000:]
    assert ended.error.type == "AuthenticationError" and "Incorrect API key provided: ***" in ended.error.message
    assert [entry.kind for entry in client.get_log(run)].count("retry") == 1
    # And no piece of the key is anywhere
    for key_var, value in settings_env(settings).items():
        monkeypatch.setenv(key_var, value)
    assert ratchet(["show", run, "--log", "--steps"]) == 1
    ratchet(["show", run, "--log", "--steps", "--json"])
    texts = {
        "error": [ended.error.message],
        "log": [json.dumps(entry.detail) for entry in client.get_log(run)],
        "events": [event.model_dump_json() for event in client.stream(run, timeout=10)],
        "ratchet show": [capsys.readouterr().out],
        "store": list(store_texts(settings.database_url)),
        "broker messages": [decoded(m) for m in tap.messages],
        "redis": list(redis_texts(redis_url)),
        "worker log": [log.read_text(errors="replace")],
    }
    leaks = {where: [t for t in found for p in pieces if p in t.lower()] for where, found in texts.items()}
    assert leaks == {where: [] for where in texts}
    assert all(texts.values()) and "Incorrect API key provided: ***" in texts["worker log"][0]
