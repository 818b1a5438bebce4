"""Webhooks, run by the in-memory dispatcher on a real store, delivered by the sweeper to a real
HTTP receiver on this machine: one signed POST per stop, retries under the same delivery id, the
ends of a delivery (2xx, 410, attempts spent), and the addresses refused at start and at delivery."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import Agent, RunStatus, tool
from orchestrator.errors import ConfigurationError, InvalidInputError, RunConflictError, RunNotFoundError
from orchestrator.settings import Settings
from orchestrator.testing import InMemoryDispatcher, in_memory
from orchestrator.testing.script import Fault, ScriptConfig
from orchestrator.webhooks import Outcome, check_url, deliver_due, post, verify
from tests.support import Clock, CountingModel
from tests.webhook_support import SECRET, Receiver, hook_settings, receiving

S = RunStatus


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with receiving() as r:
        yield r


@pytest.fixture
def hooked(tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemoryDispatcher]:
    with in_memory(hook_settings(f"sqlite:///{tmp_path / 'runs.db'}")) as dispatcher:
        monkeypatch.setattr(dispatcher.store, "clock", clock)
        yield dispatcher


def name() -> str:
    return f"hooks-{uuid.uuid4().hex[:8]}"


@tool(requires_confirmation=True)
def pay(amount: int) -> str:
    """Pay.

    Args:
        amount: In cents.
    """
    return f"paid {amount}"


def test_each_stop_is_posted_once_signed_with_a_delivery_id_the_body_repeats(db_url: str, receiver: Receiver) -> None:
    # On SQLite and PostgreSQL: there the final commit writes the outbox row in its one statement.
    with in_memory(hook_settings(db_url)) as inline:
        done = Agent(name=name(), model=CountingModel()).start("hello", webhook=receiver.url).wait()
        failed = Agent(name=name(), model=CountingModel(script=ScriptConfig(faults=[Fault(status=400, times=None)])))
        errored = failed.start("hello", webhook=receiver.url).wait()
        paused = Agent(name=name(), model=CountingModel(), tools=[pay]).start("pay", webhook=receiver.url).wait()
        cancelled = inline.client.cancel(paused.run_id)
        quiet = Agent(name=name(), model=CountingModel()).run("no webhook")

        assert inline.sweep().webhooks == 4
        assert inline.sweep().webhooks == 0  # delivered: not sent again

        statuses = (done.status, errored.status, paused.status, cancelled.status)
        assert statuses == (S.COMPLETED, S.ERROR, S.PAUSED, S.CANCELLED)
        stops = [(b["run"]["run_id"], b["run"]["status"]) for b in receiver.bodies()]
        expected = [(done.run_id, "COMPLETED"), (errored.run_id, "ERROR")]
        expected += [(paused.run_id, "PAUSED"), (paused.run_id, "CANCELLED")]
        assert sorted(stops) == sorted(expected)
        assert quiet.run_id not in {run for run, _ in stops}
        for headers, body in receiver.requests:
            assert verify(SECRET, body, headers["Ratchet-Signature"])
            assert not verify("another secret", body, headers["Ratchet-Signature"])
            assert headers["Ratchet-Delivery"] == json.loads(body)["delivery_id"]
        assert len({h["Ratchet-Delivery"] for h, _ in receiver.requests}) == 4
        by_run = {b["run"]["run_id"]: b["run"] for b in receiver.bodies() if b["run"]["status"] != "PAUSED"}
        assert by_run[done.run_id]["content"] == done.content and by_run[done.run_id]["error"] is None
        assert by_run[errored.run_id]["error"]["type"] == errored.error.type  # type: ignore[union-attr]
        [shown] = inline.client.webhook_deliveries(done.run_id)
        assert (shown.run_status, shown.state, shown.attempts, shown.last_error) == ("COMPLETED", "delivered", 1, None)


def test_a_failing_receiver_gets_the_same_delivery_again_after_a_growing_backoff(
    hooked: InMemoryDispatcher, receiver: Receiver, clock: Clock
) -> None:
    receiver.failures = 2
    run = Agent(name=name(), model=CountingModel()).start("hello", webhook=receiver.url).wait()

    # The clock is wall time plus an offset: each backoff is bounded by the clock read before the
    # sweep (the attempt's time is no earlier) and after it (no later).
    before = clock()
    hooked.sweep()
    after = clock()
    [first] = hooked.client.webhook_deliveries(run.run_id)
    assert (first.state, first.attempts, first.last_error) == ("pending", 1, "the receiver answered HTTP 500")
    assert first.next_attempt_at is not None and before + 5.0 <= first.next_attempt_at <= after + 10.0
    assert hooked.sweep().webhooks == 0  # not before its backoff passed
    clock.advance(10.0)
    before = clock()
    hooked.sweep()
    after = clock()
    [second] = hooked.client.webhook_deliveries(run.run_id)
    assert second.attempts == 2 and second.next_attempt_at is not None
    assert before + 10.0 <= second.next_attempt_at <= after + 20.0  # doubled, with jitter
    clock.advance(20.0)
    hooked.sweep()

    assert [h["Ratchet-Delivery"] for h, _ in receiver.requests] == [first.delivery_id] * 3
    [last] = hooked.client.webhook_deliveries(run.run_id)
    assert (last.state, last.attempts, last.delivered_at is not None) == ("delivered", 3, True)


def test_a_delivery_ends_failed_after_its_attempts_or_at_once_on_410(
    hooked: InMemoryDispatcher, receiver: Receiver, clock: Clock
) -> None:
    receiver.failures = 99
    spent = Agent(name=name(), model=CountingModel()).start("hello", webhook=receiver.url).wait()
    for _ in range(4):
        hooked.sweep()
        clock.advance(100.0)
    [failed] = hooked.client.webhook_deliveries(spent.run_id)
    assert (failed.state, failed.attempts, failed.next_attempt_at) == ("failed", 3, None)
    assert len(receiver.requests) == 3

    receiver.failing, receiver.requests = 410, []
    gone = Agent(name=name(), model=CountingModel()).start("hello", webhook=receiver.url).wait()
    hooked.sweep()
    clock.advance(100.0)
    hooked.sweep()
    [ended] = hooked.client.webhook_deliveries(gone.run_id)
    assert (ended.state, ended.attempts) == ("failed", 1) and "410" in (ended.last_error or "")
    assert len(receiver.requests) == 1


def test_an_address_no_longer_allowed_at_delivery_is_not_contacted(
    hooked: InMemoryDispatcher, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = Agent(name=name(), model=CountingModel()).start("hello", webhook=receiver.url).wait()
    monkeypatch.setattr(hooked.runner, "settings", hook_settings(hooked.settings.database_url, webhook_allow=None))

    hooked.sweep()

    assert receiver.requests == []
    [refused] = hooked.client.webhook_deliveries(run.run_id)
    assert refused.state == "failed" and "127.0.0.1" in (refused.last_error or "")
    assert "RATCHET_WEBHOOK_ALLOW" in (refused.last_error or "")


def test_a_start_with_another_webhook_under_the_same_run_id_is_another_request(
    hooked: InMemoryDispatcher, receiver: Receiver
) -> None:
    agent = Agent(name=name(), model=CountingModel())
    first = agent.start("hello", run_id="hooked-1", webhook=receiver.url)
    assert agent.start("hello", run_id="hooked-1", webhook=receiver.url).run_id == first.run_id
    with pytest.raises(RunConflictError, match="webhook="):
        agent.start("hello", run_id="hooked-1", webhook=receiver.url + "&other=1")


@pytest.mark.parametrize(
    ("url", "allow", "said"),
    [
        ("http://127.0.0.1:9/h", None, "'127.0.0.1' is not a public address"),
        ("http://169.254.169.254/latest/meta-data", "127.0.0.1", "169.254.169.254"),
        ("http://[fe80::1]/h", None, "fe80::1"),
        ("http://10.1.2.3/h", "192.168.0.0/16", "10.1.2.3"),
        ("http://[::ffff:10.0.0.1]/h", None, "not a public address"),
        ("http://[2002:7f00:1::]/h", None, "not a public address"),  # 6to4 of 127.0.0.1
        ("http://[64:ff9b::7f00:1]/h", None, "not a public address"),  # NAT64 of 127.0.0.1
        ("http://[::127.0.0.1]/h", None, "not a public address"),  # IPv4-compatible
        ("http://[2001:0:4136:e378:8000:63bf:f5ff:fffe]/h", None, "not a public address"),  # Teredo of 10.0.0.1
        ("http://metadata.google.internal/computeMetadata/v1/", None, "cloud metadata"),
        ("http://metadata.google.internal./computeMetadata/v1/", None, "cloud metadata"),
        ("http://localhost:9/h", None, "not a public address"),
        ("ftp://example.com/h", None, "http:// or https://"),
        ("http:///nohost", None, "with a host"),
    ],
)
def test_a_webhook_outside_the_allow_list_is_refused_at_start_saying_what_to_set(
    url: str, allow: str | None, said: str
) -> None:
    settings = hook_settings("sqlite://", webhook_allow=allow)
    with pytest.raises(InvalidInputError, match="webhook") as refused:
        check_url(url, settings)
    assert said in str(refused.value)


def test_a_refused_host_name_is_not_told_the_address_it_resolves_to() -> None:
    with pytest.raises(InvalidInputError, match="'localhost' is not a public address") as refused:
        check_url("http://localhost:9/h", hook_settings("sqlite://", webhook_allow=None))
    assert "127.0.0.1" not in str(refused.value) and "::1" not in str(refused.value)


@pytest.mark.parametrize("entry", ["10.0.0.0/33", "fd00::/129", "10.0.0.300"])
def test_a_malformed_allow_list_network_is_refused_naming_the_setting(entry: str) -> None:
    with pytest.raises(ConfigurationError, match=f"RATCHET_WEBHOOK_ALLOW entry '{entry}'"):
        Settings.from_env({"RATCHET_WEBHOOK_ALLOW": f"example.com,{entry}"})


def test_a_host_that_does_not_resolve_at_delivery_is_tried_again_later(tmp_path: Path) -> None:
    settings = hook_settings(f"sqlite:///{tmp_path / 'runs.db'}", webhook_max_attempts=3)
    outcome = post("http://no-such-host.invalid/h", b"{}", {}, settings)
    assert outcome.status is None and outcome.error is not None
    assert "does not resolve" in outcome.error and not outcome.error.startswith("refused:")


def test_the_allow_list_admits_its_hosts_and_networks_and_a_start_needs_the_secret() -> None:
    assert check_url("http://10.1.2.3:8080/h", hook_settings("sqlite://", webhook_allow="10.0.0.0/8"))
    assert check_url("http://127.0.0.1/h", hook_settings("sqlite://", webhook_allow="127.0.0.1"))
    assert check_url("http://localhost/h", hook_settings("sqlite://", webhook_allow="localhost"))
    assert check_url("http://localhost./h", hook_settings("sqlite://", webhook_allow="localhost."))
    assert check_url("http://[2002:5db8:d70e::]/h", hook_settings("sqlite://"))  # 6to4 of a public address
    assert check_url("http://[64:ff9b::7f00:1]/h", hook_settings("sqlite://", webhook_allow="127.0.0.0/8"))
    assert check_url("http://93.184.215.14/h", hook_settings("sqlite://", webhook_allow=None))  # a public address
    with pytest.raises(InvalidInputError, match="RATCHET_WEBHOOK_SECRET"):
        check_url("http://93.184.215.14/h", hook_settings("sqlite://", webhook_secret=None))


def test_a_refused_webhook_writes_no_run(hooked: InMemoryDispatcher) -> None:
    agent = Agent(name=name(), model=CountingModel())
    with pytest.raises(InvalidInputError, match="RATCHET_WEBHOOK_ALLOW"):
        agent.start("hello", run_id="refused-1", webhook="http://169.254.169.254/")
    with pytest.raises(RunNotFoundError):
        hooked.store.get_record("refused-1")


def test_a_redirect_is_not_followed_but_tried_again_later(hooked: InMemoryDispatcher, receiver: Receiver) -> None:
    receiver.failures, receiver.failing = 1, 302
    run = Agent(name=name(), model=CountingModel()).start("hello", webhook=receiver.url).wait()
    hooked.sweep()
    [moved] = hooked.client.webhook_deliveries(run.run_id)
    assert (moved.state, moved.attempts, moved.last_error) == ("pending", 1, "the receiver answered HTTP 302")
    assert len(receiver.requests) == 1


def test_a_pass_starts_no_delivery_once_a_sweep_interval_has_passed(tmp_path: Path, receiver: Receiver) -> None:
    settings = hook_settings(f"sqlite:///{tmp_path / 'runs.db'}", sweep_seconds=0.05)
    with in_memory(settings) as inline:
        agent = Agent(name=name(), model=CountingModel())
        runs = [agent.start("hello", webhook=receiver.url).wait() for _ in range(3)]
        sent: list[str] = []

        def slow(url: str, body: bytes, headers: dict[str, str], _: Settings) -> Outcome:
            sent.append(headers["Ratchet-Delivery"])
            deadline = time.monotonic() + 0.06  # longer than the interval: the pass stops after it
            while time.monotonic() < deadline:
                pass
            return Outcome(200)

        assert deliver_due(inline.store, settings, send=slow) == 1
        assert deliver_due(inline.store, settings, send=slow) == 1
        assert len(set(sent)) == 2 and all(r.status == S.COMPLETED for r in runs)


def test_a_fork_of_a_completed_run_keeps_its_webhook(hooked: InMemoryDispatcher, receiver: Receiver) -> None:
    agent = Agent(name=name(), model=CountingModel())
    first = agent.start("hello", webhook=receiver.url).wait()
    fork = agent.continue_run(run_id=first.run_id, input="and again")
    hooked.sweep()
    assert fork.run_id != first.run_id and fork.status == S.COMPLETED
    assert sorted(b["run"]["run_id"] for b in receiver.bodies()) == sorted([first.run_id, fork.run_id])


def test_deleting_a_session_deletes_its_runs_deliveries(hooked: InMemoryDispatcher, receiver: Receiver) -> None:
    run = Agent(name=name(), model=CountingModel()).start("hello", webhook=receiver.url).wait()
    assert len(hooked.client.webhook_deliveries(run.run_id)) == 1
    hooked.client.delete_session(run.session_id)
    assert hooked.sweep().webhooks == 0 and receiver.requests == []  # nothing left to send
    with pytest.raises(RunNotFoundError):
        hooked.client.webhook_deliveries(run.run_id)


@pytest.mark.parametrize("setting", ["RATCHET_WEBHOOK_MAX_ATTEMPTS", "RATCHET_WEBHOOK_BACKOFF_SECONDS"])
def test_webhook_settings_must_be_positive_and_the_secret_is_never_shown(setting: str) -> None:
    with pytest.raises(ConfigurationError, match=setting):
        Settings.from_env({setting: "0"})
    shown = Settings.from_env({"RATCHET_WEBHOOK_SECRET": SECRET})
    assert SECRET not in repr(shown) and SECRET not in str(shown.model_dump())


def test_a_team_paused_twice_in_one_epoch_owes_two_deliveries_with_distinct_ids(db_url: str) -> None:
    """A team goes PAUSED -> WAITING without a new epoch: its second pause is the same run,
    epoch and status as its first, and must not collide with it (the move rolled back)."""
    from orchestrator.messages import Message
    from orchestrator.store import Store

    store = Store.open(db_url)
    run_id = f"team-{uuid.uuid4().hex[:8]}"
    store.create_run(
        run_id=run_id,
        session_id=f"s-{run_id}",
        agent_name="a",
        kind="team",
        input_messages=[Message(role="user", content="x")],
        publish_grace=0,
        webhook="https://example.com/h",
    )
    steps = [
        (RunStatus.QUEUED, RunStatus.RUNNING),
        (RunStatus.RUNNING, RunStatus.WAITING),
        (RunStatus.WAITING, RunStatus.PAUSED),
        (RunStatus.PAUSED, RunStatus.WAITING),
        (RunStatus.WAITING, RunStatus.PAUSED),
    ]
    try:
        for src, dst in steps:
            assert store.move(run_id, src=(src,), dst=dst) is not None
        paused = [d for d in store.webhooks.of_run(run_id) if d["run_status"] == RunStatus.PAUSED.value]
    finally:
        store.engine.dispose()
    assert len(paused) == 2 and paused[0]["delivery_id"] != paused[1]["delivery_id"]


def test_a_receiver_dripping_its_answer_is_cut_off_at_the_total_timeout(tmp_path: Path) -> None:
    """The socket's timeout bounds each read: RATCHET_WEBHOOK_TIMEOUT_SECONDS bounds the POST."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def drip() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n")
            while not done.wait(0.2):  # a byte every 0.2 s, well inside the per-read timeout
                try:
                    conn.sendall(b"x")
                except OSError:
                    return

    thread = threading.Thread(target=drip, daemon=True)
    thread.start()
    settings = hook_settings(f"sqlite:///{tmp_path / 'runs.db'}", webhook_timeout_seconds=1.0)
    try:
        began = time.monotonic()
        outcome = post(f"http://127.0.0.1:{server.getsockname()[1]}/h", b"{}", {}, settings)
        took = time.monotonic() - began
    finally:
        done.set()
        thread.join(5)
        server.close()
    assert outcome.status is None and "1 s in all" in (outcome.error or "")
    assert took < 3.0
