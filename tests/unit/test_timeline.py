"""A run's steps (`Client.get_steps`, `orchestrator.timeline`), derived from what real steps
stored, run by the in-memory dispatcher on a SQLite store whose clock the test moves: retries,
tool errors, failures and continues, a lease the sweeper took back, a team's delegation and
fan-in, and the worker of the step in progress. The same read on PostgreSQL, over HTTP and from
the command line: tests/integration/test_api_records.py and test_cli_ops.py."""

from __future__ import annotations

import uuid

from orchestrator import Agent, RunStatus, Team
from orchestrator.team import TO_MEMBER, member_id
from orchestrator.testing import InMemoryDispatcher
from orchestrator.testing.script import Fault, ScriptConfig
from tests.support import Clock, CountingModel

S = RunStatus


def name() -> str:
    return f"timeline-{uuid.uuid4().hex[:8]}"


def lookup(query: str) -> str:
    """Look something up."""
    return f"notes on {query}"


def fetch(url: str) -> str:
    """Fetch a page."""
    raise ConnectionError(f"{url}: refused")


def test_each_step_shows_its_task_status_attempt_tokens_tool_errors_and_error(inline: InMemoryDispatcher) -> None:
    script = ScriptConfig(
        batches=[[{"tool": "lookup", "arguments": {"query": "a"}}, {"tool": "fetch", "arguments": {"url": "b"}}]],
        faults=[Fault(turn=1, status=429, times=1, retry_after=0.1), Fault(turn=2, status=400, times=1)],
    )
    agent = Agent(name=name(), model=CountingModel(script=script), tools=[lookup, fetch], retries=2)
    out = agent.run("hi")
    assert out.status == S.ERROR

    inline.client.continue_run(out.run_id)
    steps = inline.client.get_steps(out.run_id)

    assert [(s.seq, s.task, s.status, s.attempt, s.position, s.messages) for s in steps] == [
        (0, "model", "retried", 1, 1, 0),  # the 429, retried as the next seq
        (1, "model", "done", 1, 1, 1),  # the call asking for two tools
        (2, "tools", "done", 1, 2, 2),
        (3, "model", "failed", 1, 4, 0),  # the 400: the run went to ERROR here
        (4, "model", "done", 1, 4, 1),  # after the continue
    ]
    retried, asked, tools, failed, answered = steps
    assert retried.error is not None and retried.error.type == "RateLimitError"
    assert failed.error is not None and failed.error.type == "BadRequestError"
    assert tools.tool_errors == 1 and asked.tool_errors == 0
    assert asked.metrics is not None and asked.metrics.output_tokens and tools.metrics is None
    assert all(s.duration is not None and s.duration >= 0 for s in steps)
    assert [s.ready_at for s in steps] == sorted(s.ready_at for s in steps)  # type: ignore[type-var]
    # A step that wrote messages has its claim's time (stamped by its commit); one that did not, none.
    for step in (asked, tools, answered):
        assert step.started_at is not None and step.ended_at is not None
        assert step.ready_at is not None and step.ready_at <= step.started_at <= step.ended_at
        assert step.duration == step.ended_at - step.started_at
    assert retried.started_at is None and failed.started_at is None
    log = {e.kind: e for e in inline.client.get_log(out.run_id)}
    assert answered.ready_at == log["continue"].at  # it could start once continued
    assert all(s.worker is None and s.task_id is None for s in steps)  # a past step's worker is not kept


def test_a_step_the_sweeper_took_back_counts_its_lost_attempt_and_the_one_in_progress_names_its_worker(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    agent = Agent(name=name(), model=CountingModel())
    inline.autorun = False
    run_id = agent.start("hello").run_id
    assert [(s.task, s.status, s.attempt) for s in inline.client.get_steps(run_id)] == [("model", "queued", 1)]

    # A worker takes the step, then dies: its lease says who it was while it holds the step
    claim = inline.store.claim(run_id, 0, "model", owner="host-a:4242:task-9", lease_seconds=30, max_attempts=5)
    assert claim is not None
    (running,) = inline.client.get_steps(run_id)
    assert (running.status, running.worker, running.task_id, running.attempt) == ("running", "host-a:4242", "task-9", 1)
    assert running.ended_at is None and running.duration is None

    clock.advance(31)
    assert inline.sweep().requeued == [run_id]
    inline.run_until_idle()

    (done,) = inline.client.get_steps(run_id)
    assert (done.task, done.status, done.attempt, done.worker) == ("model", "done", 2, None)
    lost = next(e for e in inline.client.get_log(run_id) if e.kind == "lease_expired")
    assert done.ready_at == lost.at  # the attempt that committed could start once the lease was taken back


def test_a_teams_steps_show_the_batch_that_delegated_and_the_fan_in_of_its_members(
    inline: InMemoryDispatcher,
) -> None:
    t = uuid.uuid4().hex[:6]
    writer = Agent(name=f"writer-{t}", model=CountingModel(script=ScriptConfig(final_text="about {user}")))
    call = {"tool": TO_MEMBER, "arguments": {"member_id": member_id(writer), "task": "otters"}}
    leader = CountingModel(script=ScriptConfig(batches=[[call]], final_text="Team: {tool_results}"))
    team = Team(name=f"team-{t}", model=leader, members=[writer])

    out = team.run("write")

    assert out.status == S.COMPLETED
    steps = inline.client.get_steps(out.run_id)
    assert [(s.task, s.status, s.messages) for s in steps] == [
        ("model", "done", 1), ("tools", "done", 0), ("fan_in", "done", 1), ("model", "done", 1),
    ]  # fmt: skip
    assert [s.task for s in inline.client.get_steps(out.member_runs[0].run_id)] == ["model"]
