"""Prometheus metrics: known runs (stepped inline, on SQLite and PostgreSQL), then /metrics scraped
and parsed, and every value checked; counters that stay put through the fold into stored totals,
through a delete of runs, and from another process; paused runs and the time to each decision;
queue lengths read from a real Redis broker."""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr
from sqlalchemy import select
from starlette.testclient import TestClient

from orchestrator import Agent, Client, Decision, RunStatus, tool
from orchestrator import agent as agent_module
from orchestrator.messages import Message
from orchestrator.models.base import CallContext, ModelReply, ToolSpec
from orchestrator.settings import Settings
from orchestrator.store import Store
from orchestrator.store import metrics as store_metrics
from orchestrator.store.database import open_engine
from orchestrator.store.tables import metric_totals
from orchestrator.testing import InMemoryDispatcher, in_memory
from orchestrator.testing.script import Fault, ScriptConfig
from orchestrator.testing.scripted_model import ScriptedModel
from orchestrator.tools import ToolContext
from orchestrator.usage import Prices
from tests.conftest import make_settings, settings_env
from tests.support import Clock
from workers.api.routes import create_app
from workers.cli.commands import main as ratchet

S = RunStatus
#: What every reply of `FixedUsage` reports, and what it costs at `PRICES`.
USAGE = {"input_tokens": 100, "output_tokens": 10, "cached_tokens": 40, "reasoning_tokens": 3}
PRICES = Prices(input=2.0, output=8.0)
REPLY_COST = (100 * 2.0 + 10 * 8.0) / 1_000_000
TOOL_SECONDS = 0.3


class FixedUsage(ScriptedModel):
    """The scripted model, each reply reporting the same usage."""

    def invoke(self, messages: Sequence[Message], tools: Sequence[ToolSpec], *, context: CallContext) -> ModelReply:
        return replace(super().invoke(messages, tools, context=context), usage=dict(USAGE))


def name(what: str) -> str:
    return f"m-{what}-{uuid.uuid4().hex[:6]}"


def agent(what: str, **script: object) -> Agent:
    """An agent on `FixedUsage`; it has the tool `slow_lookup` if its script calls it."""
    tools = [slow_lookup] if "batches" in script else []
    return Agent(name=name(what), model=FixedUsage(script=ScriptConfig(**script), prices=PRICES), tools=tools)  # type: ignore[arg-type]


def slow_lookup(q: str) -> str:
    """Look something up, slowly."""
    time.sleep(TOOL_SECONDS)
    return f"found {q}"


class Scrape:
    """The samples of one scrape, by name and labels."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples = {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def __call__(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, frozenset(labels.items())))

    def named(self, name: str, agent: str) -> dict[frozenset[tuple[str, str]], float]:
        return {k[1]: v for k, v in self.samples.items() if k[0] == name and ("agent", agent) in k[1]}


def scrape(api: TestClient, token: str | None = None) -> Scrape:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = api.get("/metrics", headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return Scrape(response.text)


@pytest.fixture
def inline(db_url: str) -> Iterator[InMemoryDispatcher]:
    with in_memory(db_url) as dispatcher:
        yield dispatcher


def test_a_scrape_after_known_runs_counts_them_by_agent_and_status_with_their_retries_tokens_cost_and_steps(
    inline: InMemoryDispatcher,
) -> None:
    # Given: two runs that call a tool once each, one that retries once, one that fails.
    tooluser = agent("tools", batches=[[{"tool": "slow_lookup", "arguments": {"q": "otters"}}]], final_text="done")
    flaky = agent("flaky", final_text="second time lucky", faults=[Fault(status=500, times=1)])
    broken = agent("broken", faults=[Fault(status=400, times=None)])
    for run in (tooluser.run("one"), tooluser.run("two"), flaky.run("three")):
        assert run.status == S.COMPLETED, run.error
    assert broken.run("four").status == S.ERROR

    # When: Prometheus scrapes the API.
    got = scrape(TestClient(create_app(inline.settings, client=inline.client), base_url="http://localhost"))

    # Then: runs by agent and status, every status of an agent present.
    assert got("ratchet_runs", agent=tooluser.name, status="COMPLETED") == 2
    assert got("ratchet_runs", agent=flaky.name, status="COMPLETED") == 1
    assert got("ratchet_runs", agent=broken.name, status="ERROR") == 1
    assert got("ratchet_runs", agent=broken.name, status="COMPLETED") == 0
    assert len(got.named("ratchet_runs", tooluser.name)) == len(RunStatus)
    # Retries and errors, by agent; nothing was fenced, recovered or poisoned.
    assert got("ratchet_retries_total", agent=flaky.name) == 1
    assert got("ratchet_retries_total", agent=tooluser.name) is None
    assert got("ratchet_run_errors_total", agent=broken.name) == 1
    assert not [k for k in got.samples if k[0] in {"ratchet_fenced_writes_total", "ratchet_poison_steps_total"}]
    assert not [k for k in got.samples if k[0] == "ratchet_sweeper_recoveries_total"]
    # Tokens and cost of the stored replies: four for the tool user, one for the flaky agent.
    for kind, each in (("input", 100), ("output", 10), ("cache_read", 40), ("reasoning", 3)):
        assert got("ratchet_tokens_total", agent=tooluser.name, kind=kind) == 4 * each
        assert got("ratchet_tokens_total", agent=flaky.name, kind=kind) == each
    assert got.named("ratchet_tokens_total", broken.name) == {}
    assert got("ratchet_cost_usd_total", agent=tooluser.name) == pytest.approx(4 * REPLY_COST)
    assert got("ratchet_cost_usd_total", agent=flaky.name) == pytest.approx(REPLY_COST)
    # Step durations: every model step and tool step that committed, the tool steps >= 0.3 s.
    steps = "ratchet_step_duration_seconds"
    assert got(f"{steps}_count", agent=tooluser.name, kind="model") == 4
    assert got(f"{steps}_count", agent=tooluser.name, kind="tools") == 2
    assert got(f"{steps}_count", agent=flaky.name, kind="model") == 1
    assert got(f"{steps}_bucket", agent=tooluser.name, kind="tools", le="0.25") == 0
    assert got(f"{steps}_bucket", agent=tooluser.name, kind="tools", le="+Inf") == 2
    assert (got(f"{steps}_sum", agent=tooluser.name, kind="tools") or 0) >= 2 * TOOL_SECONDS
    assert got(f"{steps}_count", agent=broken.name, kind="model") is None  # a failed step never committed
    # The in-memory dispatcher has no broker: no queue lengths.
    assert "ratchet_queue_length" not in got.text


def promtool_check(text: str) -> None:
    """`promtool check metrics` on a scrape: it parses and lints the exposition (names, units,
    suffixes, help). Debian's prometheus package has it; tests/services.sh installs it."""
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool is missing: install Debian's prometheus package (tests/services.sh does)"
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert (checked.returncode, checked.stdout + checked.stderr) == (0, ""), checked.stdout + checked.stderr


def test_rates_and_latencies_pass_promtool_and_no_counter_goes_down_when_the_runs_are_pruned(
    inline: InMemoryDispatcher,
) -> None:
    # Given: a run that calls a tool (model calls of at least 0.06 s), a streamed run, a run
    # cancelled by its own tool while that runs, and a run that fails.
    call = {"tool": "slow_lookup", "arguments": {"q": "otters"}}
    tooluser = agent("lat", batches=[[call]], final_text="done", delay_s=0.06)
    streamer = agent("stream", final_text="three short words", delay_s=0.06, chunk_delay_s=0.05)
    client = inline.client

    def cancel_me(context: ToolContext) -> str:
        """Cancel the run this call belongs to."""
        client.cancel(context.run_id)
        return "cancelled myself"

    script = ScriptConfig(batches=[[{"tool": "cancel_me"}]])
    canceller = Agent(name=name("cancel"), model=ScriptedModel(script=script), tools=[cancel_me])
    broken = agent("broken", faults=[Fault(status=400, times=None)])
    assert tooluser.run("one").status == S.COMPLETED
    streamed = client.start(streamer.name, input="two", stream=True)
    cancelled = client.start(canceller.name, input="three")
    inline.run_until_idle()
    assert client.get_run(streamed.run_id).status == S.COMPLETED
    assert client.get_run(cancelled.run_id).status == S.CANCELLED
    assert broken.run("four").status == S.ERROR
    api = TestClient(create_app(inline.settings, client=client), base_url="http://localhost")

    # When: Prometheus scrapes the API.
    response = api.get("/metrics")
    got = Scrape(response.text)

    # Then: promtool finds nothing wrong, and every figure is there.
    promtool_check(response.text)
    for each in (tooluser, streamer, canceller, broken):
        assert got("ratchet_runs_started_total", agent=each.name) == 1
    assert got("ratchet_runs_finished_total", agent=tooluser.name, status="COMPLETED") == 1
    assert got("ratchet_runs_finished_total", agent=canceller.name, status="CANCELLED") == 1
    assert got("ratchet_runs_finished_total", agent=broken.name, status="ERROR") == 1
    assert got("ratchet_cancelled_steps_total", agent=canceller.name) == 1
    assert not [k for k in got.samples if k[0] == "ratchet_fenced_writes_total"]  # a cancel is no fenced write
    assert got("ratchet_cost_usd_total", agent=tooluser.name) == pytest.approx(2 * REPLY_COST)
    wait = "ratchet_queue_wait_seconds"
    assert got(f"{wait}_count", agent=tooluser.name, kind="model") == 2
    assert got(f"{wait}_count", agent=tooluser.name, kind="tools") == 1
    calls, model = "ratchet_model_call_duration_seconds", "scripted"
    assert got(f"{calls}_count", agent=tooluser.name, model=model) == 2
    assert got(f"{calls}_bucket", agent=tooluser.name, model=model, le="0.05") == 0
    assert got(f"{calls}_count", agent=broken.name, model=model) is None  # a failed call stored no reply
    first = "ratchet_model_time_to_first_token_seconds"
    assert got(f"{first}_count", agent=streamer.name, model=model) == 1
    assert got(f"{first}_count", agent=tooluser.name, model=model) is None  # not streamed: no first token seen
    # The first word comes after the call's delay; the other two 0.05 s apart after it.
    ttft, whole = (
        got(f"{first}_sum", agent=streamer.name, model=model),
        got(f"{calls}_sum", agent=streamer.name, model=model),
    )
    assert ttft is not None and whole is not None and 0.06 <= ttft <= whole - 0.1
    tools = "ratchet_tool_duration_seconds"
    assert got(f"{tools}_count", agent=tooluser.name, tool="slow_lookup") == 1
    assert got(f"{tools}_bucket", agent=tooluser.name, tool="slow_lookup", le="0.25") == 0
    runs_ = "ratchet_run_duration_seconds"
    assert got(f"{runs_}_count", agent=tooluser.name, status="COMPLETED") == 1
    assert (got(f"{runs_}_sum", agent=tooluser.name, status="COMPLETED") or 0) >= TOOL_SECONDS + 2 * 0.06
    assert got(f"{runs_}_count", agent=canceller.name, status="CANCELLED") == 1

    # And: once every run is pruned, the runs gauge drops and nothing else moves.
    assert client.prune(older_than=0).runs == 4
    after = Scrape(api.get("/metrics").text)
    assert {k: v for k, v in after.samples.items() if k[0] != "ratchet_runs"} == {
        k: v for k, v in got.samples.items() if k[0] != "ratchet_runs"
    }
    assert not [k for k in after.samples if k[0] == "ratchet_runs"]


def test_metrics_need_the_apis_token_when_it_has_tokens_and_come_as_openmetrics_when_asked(
    inline: InMemoryDispatcher,
) -> None:
    settings = inline.settings.model_copy(update={"api_tokens": SecretStr("scrape-token")})
    api = TestClient(create_app(settings, client=inline.client), base_url="http://localhost")
    ok = agent("ok", final_text="hi")
    ok.run("hello")

    assert api.get("/metrics").status_code == 401
    assert api.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert scrape(api, token="scrape-token")("ratchet_runs", agent=ok.name, status="COMPLETED") == 1
    # What Prometheus asks for first: OpenMetrics.
    asked = {"Authorization": "Bearer scrape-token", "Accept": "application/openmetrics-text;version=1.0.0"}
    response = api.get("/metrics", headers=asked)
    assert response.headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
    families = {f.name: f for f in openmetrics_families(response.text)}
    assert families["ratchet_tokens"].type == "counter"
    assert {s.labels["kind"]: s.value for s in families["ratchet_tokens"].samples} == {
        "input": 100, "output": 10, "cache_read": 40, "reasoning": 3
    }  # fmt: skip


def test_a_step_fenced_by_a_cancel_a_sweeper_recovery_and_a_poison_step_are_counted(db_url: str) -> None:
    settings = Settings(
        database_url=db_url, sqlite_synchronous="NORMAL", max_step_attempts=2,
        dispatcher="orchestrator.testing:InMemoryDispatcher",
    )  # fmt: skip
    with in_memory(settings, autorun=False) as inline:
        client = inline.client

        def cancel_me(context: ToolContext) -> str:
            """Cancel the run this call belongs to."""
            client.cancel(context.run_id)
            return "cancelled myself"

        # A tool step whose run is cancelled while it runs: its commit is refused (fenced).
        canceller = Agent(
            name=name("cancel"), model=ScriptedModel(script=ScriptConfig(batches=[[{"tool": "cancel_me"}]])),
            tools=[cancel_me],
        )  # fmt: skip
        fenced = client.start(canceller.name, input="go")
        inline.run_until_idle()
        assert client.get_run(fenced.run_id).status == S.CANCELLED

        # Two steps claimed by a worker that dies at once (its lease already expired): the one
        # claimed once is recovered and completes; the one claimed twice is a poison step.
        plain = Agent(name=name("plain"), model=ScriptedModel(script=ScriptConfig(final_text="ok")))
        recovered = client.start(plain.name, input="one")
        poisoned = client.start(plain.name, input="two")
        store = inline.store
        late = []
        for run_id, claims in ((recovered.run_id, 1), (poisoned.run_id, 2)):
            for _ in range(claims):
                claimed = store.claim(run_id, 0, "model", owner="dead", lease_seconds=-1, max_attempts=2)
                assert claimed is not None
                late.append(claimed)
        report = inline.sweep()
        assert (report.requeued, report.poisoned) == ([recovered.run_id], [poisoned.run_id])
        inline.run_until_idle()
        assert client.get_run(recovered.run_id).status == S.COMPLETED
        # The dead worker comes back after its step was taken over: what its step runner logs then.
        store.record_fenced(late[0])

        got = scrape(TestClient(create_app(settings, client=client), base_url="http://localhost"))

    # A cancel fences the step it stops, but no worker came back too late: not a fenced write.
    assert got("ratchet_fenced_writes_total", agent=canceller.name) is None
    assert got("ratchet_cancelled_steps_total", agent=canceller.name) == 1
    assert got("ratchet_runs_finished_total", agent=canceller.name, status="CANCELLED") == 1
    assert got("ratchet_fenced_writes_total", agent=plain.name) == 1
    assert got("ratchet_runs", agent=canceller.name, status="CANCELLED") == 1
    assert got("ratchet_sweeper_recoveries_total", agent=plain.name) == 1
    assert got("ratchet_poison_steps_total", agent=plain.name) == 1
    assert got("ratchet_run_errors_total", agent=plain.name) == 1
    assert got("ratchet_runs", agent=plain.name, status="ERROR") == 1
    assert got("ratchet_runs", agent=plain.name, status="COMPLETED") == 1


def counters(snapshot: store_metrics.MetricsSnapshot) -> tuple[object, ...]:
    """Everything a snapshot counts (the durations' sums rounded: floats added in another order)."""
    timed = [
        {k: (d.buckets, d.count, round(d.sum, 6)) for k, d in durations.items()}
        for durations in (
            snapshot.steps, snapshot.decisions, snapshot.queue_wait, snapshot.model_calls, snapshot.first_token,
            snapshot.tools, snapshot.run_duration,
        )
    ]  # fmt: skip
    cost = {k: round(v, 12) for k, v in snapshot.cost.items()}
    return snapshot.events, snapshot.tokens, cost, snapshot.started, snapshot.finished, *timed


@tool(requires_confirmation=True)
def refund(amount: int) -> str:
    """Refund a customer."""
    return f"refunded {amount}"


def test_a_paused_run_and_the_time_to_each_decision_are_counted_and_stay_counted_once_deleted(
    inline: InMemoryDispatcher,
) -> None:
    clock = Clock()
    inline.store.clock = clock
    calls = [{"tool": "refund", "arguments": {"amount": n}} for n in (1, 2)]
    payer = Agent(name=name("payer"), model=FixedUsage(script=ScriptConfig(batches=[calls])), tools=[refund])
    api = TestClient(create_app(inline.settings, client=inline.client), base_url="http://localhost")
    out = payer.run("refund both", session_id="refunds")

    # While it waits: one run PAUSED now, one pause counted, no decision yet.
    paused = scrape(api)
    assert paused("ratchet_runs", agent=payer.name, status="PAUSED") == 1
    assert paused("ratchet_pauses_total", agent=payer.name) == 1
    assert paused.named("ratchet_time_to_decision_seconds_count", payer.name) == {}

    # Decided 30 s and 400 s after the pause: the histogram of time to decision, by pause type.
    first, second = out.active_requirements
    clock.advance(30)
    inline.client.decide(out.run_id, first.id, Decision(kind="confirm"), by="ann")
    clock.advance(370)
    inline.client.decide(out.run_id, second.id, Decision(kind="reject"), by="bob")
    assert inline.client.get_run(out.run_id).status == S.COMPLETED
    got = scrape(api)
    decisions = "ratchet_time_to_decision_seconds"
    assert got(f"{decisions}_count", agent=payer.name, kind="confirmation") == 2
    assert got(f"{decisions}_bucket", agent=payer.name, kind="confirmation", le="10") == 0
    assert got(f"{decisions}_bucket", agent=payer.name, kind="confirmation", le="60") == 1
    assert got(f"{decisions}_bucket", agent=payer.name, kind="confirmation", le="300") == 1
    assert got(f"{decisions}_bucket", agent=payer.name, kind="confirmation", le="900") == 2
    assert 430 <= (got(f"{decisions}_sum", agent=payer.name, kind="confirmation") or 0) < 460  # 30 + 400, and wall time
    assert got("ratchet_runs", agent=payer.name, status="PAUSED") == 0
    assert got("ratchet_pauses_total", agent=payer.name) == 1

    # Folded into the stored totals, then the run deleted: the counts stay.
    live = inline.store.metrics()
    clock.advance(2 * store_metrics.SETTLE_SECONDS)
    assert counters(inline.store.metrics()) == counters(live)
    assert inline.client.delete_session("refunds") is not None
    assert counters(inline.store.metrics()) == counters(live)


def test_counters_stay_put_when_their_rows_are_folded_into_totals_read_by_another_process_pruned_or_deleted(
    inline: InMemoryDispatcher,
) -> None:
    clock = Clock()
    inline.store.clock = clock
    flaky = agent("flaky", final_text="ok", faults=[Fault(status=500, times=1)])
    tooluser = agent("tools", batches=[[{"tool": "slow_lookup", "arguments": {"q": "x"}}]], final_text="done")
    flaky.run("one")
    tooluser.run("two")
    live = inline.store.metrics()  # every row is younger than SETTLE_SECONDS: summed live
    assert totals(inline.store) == 0

    clock.advance(2 * store_metrics.SETTLE_SECONDS)
    folded = inline.store.metrics()  # now every row is behind the mark, in the stored totals
    assert totals(inline.store) > 0
    assert counters(folded) == counters(live)
    assert folded.events == {(flaky.name, "retry"): 1, (flaky.name, "completed"): 1, (tooluser.name, "completed"): 1}
    assert inline.store.metrics() == folded  # folding again adds nothing

    # Another process on the same database reads the same counters.
    other = Store(open_engine(inline.settings.database_url), clock=clock)
    try:
        assert counters(other.metrics()) == counters(folded)
    finally:
        other.dispose()

    # A run written after the mark, its session deleted at once: its counts stay.
    doomed = flaky.run("three", session_id="forget-me")
    grown = inline.store.metrics()
    assert grown.events[(flaky.name, "retry")] == 2
    assert grown.started == {flaky.name: 2, tooluser.name: 1}
    deleted = inline.client.delete_session("forget-me")
    assert deleted is not None and deleted.runs == 1
    after = inline.store.metrics()
    assert counters(after) == counters(grown)
    assert after.runs == {**folded.runs}  # the gauge does drop: the run is gone
    assert doomed.run_id not in {r.run_id for r in inline.client.list_runs(limit=10).runs}

    # The runs behind the mark pruned: their counts stay too.
    assert inline.client.prune(older_than=60).runs == 2
    pruned = inline.store.metrics()
    assert counters(pruned) == counters(grown)
    assert pruned.runs == {}


def totals(store: Store) -> int:
    """How many counters the stored totals hold (the mark aside)."""
    with store.quick_engine.connect() as conn:
        return len(conn.execute(select(metric_totals).where(metric_totals.c.name != "mark")).all())


@pytest.fixture
def forget_agents() -> Iterator[None]:
    """Forget the agents a test defines: one that names a queue would have every embedded worker
    later in the session consume that queue (`routing.named_queues`) on the shared Redis."""
    before = set(agent_module._registry)
    yield
    for added in set(agent_module._registry) - before:
        agent_module._registry.pop(added, None)
        agent_module._sites.pop(added, None)


@pytest.mark.redis
@pytest.mark.usefixtures("forget_agents")
def test_queue_lengths_count_the_steps_waiting_on_a_redis_broker_with_no_worker(tmp_path: Path, redis_url: str) -> None:
    settings = make_settings(f"sqlite:///{tmp_path}/runs.db", redis_url)
    gpu = settings.model_queue.removesuffix(".model") + ".gpu"  # cleaned up with the test's queues
    routed = Agent(name=name("routed"), model=ScriptedModel(), queue=gpu)
    client = Client(settings)
    for text in ("one", "two"):
        client.start(name("queued"), input=text)  # nobody consumes the queues
    client.start(name("urgent"), input="three", priority=9)  # on Redis, a list beside the queue's
    client.start(routed.name, input="four")

    got = scrape(TestClient(create_app(settings, client=client), base_url="http://localhost"))

    assert got("ratchet_queue_length", queue=settings.model_queue) == 3
    assert got("ratchet_queue_length", queue=gpu) == 1
    assert got("ratchet_queue_length", queue=settings.tools_queue) == 0
    assert got("ratchet_queue_length", queue=settings.control_queue) == 0
    queued = [v for (n, labels), v in got.samples.items() if n == "ratchet_runs" and ("status", "QUEUED") in labels]
    assert sum(queued) == 4


def test_a_broker_that_does_not_answer_leaves_out_the_queue_lengths_not_the_metrics(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(f"sqlite:///{tmp_path}/runs.db", "redis://127.0.0.1:9/0")  # nothing listens there
    client = Client(settings)

    snapshot = client.metrics()

    assert snapshot.queues is None
    assert "queue lengths could not be read" in caplog.text


def test_ratchet_metrics_prints_what_the_api_serves(
    inline: InMemoryDispatcher, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    flaky = agent("flaky", final_text="ok", faults=[Fault(status=500, times=1)])
    flaky.run("one")
    for key, value in settings_env(inline.settings).items():
        monkeypatch.setenv(key, value)

    assert ratchet(["metrics"]) == 0

    printed = Scrape(capsys.readouterr().out)
    assert printed("ratchet_retries_total", agent=flaky.name) == 1
    assert printed("ratchet_tokens_total", agent=flaky.name, kind="input") == 100
    served = scrape(TestClient(create_app(inline.settings, client=inline.client), base_url="http://localhost"))
    assert printed.samples == served.samples
