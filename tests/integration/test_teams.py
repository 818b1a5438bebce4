"""Teams with members: delegation as durable child runs, on SQLite and on PostgreSQL, with a real
Celery worker on real Redis and the real openai client talking to the scripted model server.

The scripted server answers each model id with its own script (`ScriptConfig.by_model`): the
leader's script calls the delegation tools, each member's script calls its tools and answers.
What a worker adds nothing to (the transcripts of a delegation, a member's tool error, an
unknown member, a failed member and continue, cancels between steps) runs with the in-memory
dispatcher in tests/unit/test_teams_inline.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from orchestrator import Agent, Client, RunOutput, RunStatus, Team
from orchestrator.delegation import fan_in_now
from orchestrator.messages import Message
from orchestrator.models import OpenAIChat, OpenAIResponses
from orchestrator.run import RunRecord
from orchestrator.settings import Settings
from orchestrator.store import Store
from orchestrator.team import TO_MEMBER, TO_MEMBERS, member_id
from orchestrator.testing.script import Fault, ScriptConfig
from orchestrator.testing.server import ScriptedServer
from orchestrator.testing.waiting import wait_until
from tests.conftest import settings_env
from tests.integration.fencing import kinds, wait_for_late_commit
from tests.support import waiting_team
from workers.celery.embedded import EmbeddedWorker
from workers.cli.commands import main as ratchet

S = RunStatus


def tag() -> str:
    return uuid.uuid4().hex[:6]


class Ledger:
    """Counts tool calls in this process (the embedded worker runs tools here)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def add(self, who: str, what: str) -> None:
        with self._lock:
            self.calls.append((who, what))


def research_team(settings: Settings, ledger: Ledger, **team_kwargs: Any) -> tuple[Team, Agent, Agent]:
    """A leader (model "leader") with a researcher (one tool) and a writer (no tools)."""
    t = tag()

    def search(query: str) -> str:
        """Search the web."""
        ledger.add("researcher", query)
        return f"facts about {query}"

    researcher = Agent(
        name=f"researcher-{t}", model=OpenAIChat(id="researcher"), tools=[search], role="Finds facts on the web."
    )
    writer = Agent(name=f"writer-{t}", model=OpenAIChat(id="writer"), role="Writes short articles.")
    team = Team(
        name=f"team-{t}",
        model=OpenAIResponses(id="leader"),
        members=[researcher, writer],
        instructions="Research, then write.",
        client=Client(settings),
        **team_kwargs,
    )
    return team, researcher, writer


def script(
    scripted: ScriptedServer, leader_calls: list[dict[str, Any]], **members: ScriptConfig
) -> dict[str, ScriptConfig]:
    by_model = {
        "leader": ScriptConfig(batches=[leader_calls], final_text="Team answer: {tool_results}"),
        "researcher": ScriptConfig(
            batches=[[{"tool": "search", "arguments": {"query": "otters"}}]], final_text="Research: {tool_results}"
        ),
        "writer": ScriptConfig(final_text="Draft about {user}"),
        **members,
    }
    scripted.configure(ScriptConfig(by_model=by_model))
    return by_model


def to_member(member: Agent, task: str) -> dict[str, Any]:
    return {"tool": TO_MEMBER, "arguments": {"member_id": member_id(member), "task": task}}


def member_runs(out: RunOutput) -> dict[str, RunOutput]:
    return {m.agent_name.split("-")[0]: m for m in out.member_runs}


@pytest.fixture
def ledger() -> Ledger:
    return Ledger()


# ---------------------------------------------------------------- delegation and fan-in


@pytest.mark.usefixtures("worker")
def test_delegating_to_all_members_runs_them_in_parallel_and_returns_one_combined_result(
    settings: Settings, scripted: ScriptedServer, ledger: Ledger
) -> None:
    team, researcher, writer = research_team(settings, ledger)
    script(
        scripted,
        [{"tool": TO_MEMBERS, "arguments": {"task": "otters"}}],
        researcher=ScriptConfig(final_text="Research on {user}"),
        writer=ScriptConfig(final_text="Draft on {user}"),
    )
    scripted.holding.hold("researcher", "writer")
    handle = team.start("otters")

    # In parallel: both members' model calls are in flight at once, held at the model until both
    # have arrived. One after the other, the second call would only start once the first member's
    # step ended, which its held call never lets it do (a call the client gave up on and retries
    # would leave its run parked, not RUNNING on its first call).
    def both_calling() -> bool:
        children = Client(settings).store.children(handle.run_id)
        in_call = [c for c in children if c.status == S.RUNNING and c.retries == 0 and scripted.requests_for(c.run_id)]
        return len(children) == len(in_call) == 2

    wait_until(both_calling, timeout=30, what="both members' model calls to be in flight at once")
    scripted.holding.release()
    out = handle.wait(30)

    assert out.status == S.COMPLETED, out.error
    tool_results = [m for m in out.messages if m.role == "tool"]
    assert len(tool_results) == 1 and tool_results[0].tool_name == TO_MEMBERS
    assert tool_results[0].content == (
        f"Agent {researcher.name}: Research on otters\n\nAgent {writer.name}: Draft on otters"
    )
    members = member_runs(out)
    assert {m.status for m in members.values()} == {S.COMPLETED}
    assert {m.messages[0].content for m in members.values()} == {"otters"}
    # Each member's model call started before the other member's answer was committed.
    started = [scripted.requests_for(m.run_id)[0]["at"] for m in members.values()]
    answered = [next(x for x in m.messages if x.role == "assistant").created_at or 0.0 for m in members.values()]
    assert max(started) < min(answered), f"members ran one after the other: {started=} {answered=}"


def test_a_waiting_team_holds_no_worker_so_one_worker_thread_runs_team_and_members(
    settings: Settings, scripted: ScriptedServer, ledger: Ledger
) -> None:
    team, researcher, writer = research_team(settings, ledger)
    script(scripted, [to_member(researcher, "facts"), to_member(writer, "draft")])

    with EmbeddedWorker(settings, concurrency=1):
        out = team.run("otters", timeout=30)

    assert out.status == S.COMPLETED, out.error
    assert len(out.member_runs) == 2


@pytest.mark.usefixtures("worker")
def test_member_runs_are_stored_and_visible_while_they_run(
    settings: Settings,
    scripted: ScriptedServer,
    ledger: Ledger,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    team, researcher, writer = research_team(settings, ledger)
    script(
        scripted,
        [to_member(researcher, "facts"), to_member(writer, "draft")],
        writer=ScriptConfig(final_text="Draft"),
    )
    scripted.holding.hold("writer")  # its call stays in flight until the test has looked
    client = Client(settings)
    session_id = f"s-{tag()}"

    handle = team.start("otters", session_id=session_id)

    # While the writer works: the team waits holding no lease, and both member runs are readable.
    def researcher_done_writer_running() -> RunOutput | None:
        run = client.get_run(handle.run_id)
        members = member_runs(run)
        if run.status == S.WAITING and len(members) == 2 and members["researcher"].status == S.COMPLETED:
            writer_run = members["writer"]
            calling = writer_run.status == S.RUNNING and scripted.requests_for(writer_run.run_id)
            return run if calling else None
        return None

    mid = wait_until(researcher_done_writer_running, what="the researcher done and the writer running")
    record = client.store.get_record(handle.run_id)
    assert record.lease_owner is None and record.next_step is None
    assert member_runs(mid)["writer"].messages[0].content == "draft"
    session = client.get_session(session_id)
    assert session is not None and [r.run_id for r in session.runs] == [handle.run_id]
    assert {m.run_id for m in session.runs[0].member_runs} == {m.run_id for m in mid.member_runs}
    for name, value in settings_env(settings).items():
        monkeypatch.setenv(name, value)
    ratchet(["show", handle.run_id])
    shown = capsys.readouterr().out
    assert f"run {handle.run_id}  WAITING" in shown
    for member in mid.member_runs:
        assert f"run {member.run_id}" in shown and f"member of {handle.run_id}" in shown

    scripted.holding.release()
    assert handle.wait(30).status == S.COMPLETED


# ---------------------------------------------------------------- failure and continue


@pytest.mark.usefixtures("worker")
def test_cancelling_a_team_cancels_its_members_and_fences_their_steps_in_flight(
    settings: Settings, scripted: ScriptedServer, ledger: Ledger
) -> None:
    # Given a team whose two members are each in the middle of their first model call
    team, researcher, writer = research_team(settings, ledger)
    script(
        scripted,
        [to_member(researcher, "facts"), to_member(writer, "draft")],
        researcher=ScriptConfig(batches=[[{"tool": "search", "arguments": {"query": "otters"}}]]),
    )
    scripted.holding.hold("researcher", "writer")  # until the cancel is done
    client = Client(settings)
    handle = team.start("otters")

    def members_calling() -> list[RunRecord] | None:
        children = client.store.children(handle.run_id)
        in_flight = len(children) == 2 and all(scripted.requests_for(c.run_id) for c in children)
        return children if in_flight else None

    members = wait_until(members_calling, what="both members' model calls to be in flight")

    # When the team is cancelled, and then the members' calls return
    out = client.cancel(handle.run_id)
    assert out.status == S.CANCELLED
    scripted.holding.release()

    # Then each member is cancelled, and once its call returns, its commit is fenced: nothing lands
    for member in members:
        left = client.store.get_record(member.run_id)
        assert left.status == S.CANCELLED
        events = wait_for_late_commit(client.store, left)
        assert "fenced" in kinds(events), f"member {member.agent_name}'s cancelled step committed: {events}"
        run = client.get_run(member.run_id)
        assert run.status == S.CANCELLED and [m.role for m in run.messages] == ["user"]
    assert ledger.calls == []  # the researcher's tool call was never committed, so never run
    after = client.get_run(handle.run_id)
    assert after.status == S.CANCELLED and after.messages == out.messages


# ---------------------------------------------------------------- nested teams


@pytest.mark.usefixtures("worker")
def test_teams_nest_three_levels_deep_and_a_deep_failure_continues_from_the_top(
    settings: Settings, scripted: ScriptedServer
) -> None:
    # Given top -> mid -> sub (three teams) -> leaf, where the leaf's first call fails for good
    t = tag()
    leaf = Agent(name=f"leaf-{t}", model=OpenAIChat(id="leaf"))
    sub = Team(name=f"sub-{t}", model=OpenAIChat(id="sub"), members=[leaf])
    mid = Team(name=f"mid-{t}", model=OpenAIChat(id="mid"), members=[sub])
    top = Team(name=f"top-{t}", model=OpenAIResponses(id="top"), members=[mid], client=Client(settings))
    to_all = [{"tool": TO_MEMBERS, "arguments": {"task": "dig"}}]
    scripted.configure(
        ScriptConfig(
            by_model={
                name: ScriptConfig(batches=[to_all], final_text=f"{name}({{tool_results}})")
                for name in ("top", "mid", "sub")
            }
            | {"leaf": ScriptConfig(final_text="gold", faults=[Fault(turn=1, status=400, times=1)])}
        )
    )

    failed = top.run("go", timeout=30)

    # Then the failure climbs every level, each naming the run below it
    assert failed.status == S.ERROR
    (mid_run,) = failed.member_runs
    (sub_run,) = mid_run.member_runs
    (leaf_run,) = sub_run.member_runs
    assert [r.status for r in (mid_run, sub_run, leaf_run)] == [S.ERROR] * 3
    for upper, lower in ((failed, mid_run), (mid_run, sub_run), (sub_run, leaf_run)):
        assert upper.error is not None and lower.run_id in upper.error.message

    # When the top team is continued, every level resumes in place
    resumed = top.continue_run(failed.run_id, timeout=30)

    assert resumed.status == S.COMPLETED, resumed.error
    (mid_after,) = resumed.member_runs
    (sub_after,) = mid_after.member_runs
    (leaf_after,) = sub_after.member_runs
    assert [r.run_id for r in (mid_after, sub_after, leaf_after)] == [r.run_id for r in (mid_run, sub_run, leaf_run)]
    assert leaf_after.content == "gold"
    assert sub_after.content == f"sub(Agent {leaf.name}: gold)"
    assert mid_after.content == f"mid(Team {sub.name}: {sub_after.content})"
    assert resumed.content == f"top(Team {mid.name}: {mid_after.content})"


# ---------------------------------------------------------------- exactly once, recovery


def test_concurrent_fan_ins_append_each_members_answer_exactly_once(settings: Settings) -> None:
    # Given a team WAITING on two members that both completed, and nobody fanned in yet
    store = Store.open(settings.database_url)
    t = tag()
    a = Agent(name=f"a-{t}", model=OpenAIChat(id="a"))
    b = Agent(name=f"b-{t}", model=OpenAIChat(id="b"))
    team = Team(name=f"team-{t}", model=OpenAIChat(id="leader"), members=[a, b])
    team_id = waiting_team(store, team, [a, b])
    assert store.get_record(team_id).status == S.WAITING
    for child in store.children(team_id):
        claim = store.claim(child.run_id, child.seq, "model", owner="test", lease_seconds=30, max_attempts=5)
        assert claim is not None
        store.commit_step(
            claim, [Message(role="assistant", content=f"answer of {child.agent_name}")],
            status=S.COMPLETED, next_step=None, publish_grace=30, content=f"answer of {child.agent_name}",
        )  # fmt: skip

    # When eight fan-ins race (two workers finishing at once, the sweeper, a continue...)
    barrier = threading.Barrier(8)
    moved: list[object] = []

    def race() -> None:
        barrier.wait()
        moved.append(fan_in_now(store, team_id, publish_grace=30))

    threads = [threading.Thread(target=race) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)

    # Then exactly one moved the team, and each call got one result
    assert sum(m is not None for m in moved) == 1
    record = store.get_record(team_id)
    assert record.status == S.QUEUED and record.next_step == "model"
    results = [m for m in store.get_messages(team_id) if m.role == "tool"]
    assert sorted(m.content or "" for m in results) == [f"answer of {a.name}", f"answer of {b.name}"]


@pytest.mark.usefixtures("worker")
def test_the_sweeper_finishes_a_fan_in_that_a_crash_left_undone(
    settings: Settings, scripted: ScriptedServer, ledger: Ledger
) -> None:
    # Given a member whose failure handler wrote its ERROR row and died before the fan-in
    team, _, writer = research_team(settings, ledger)
    script(scripted, [to_member(writer, "draft")])
    scripted.holding.hold("writer")  # its step stays in flight until the team is in ERROR
    client = Client(settings)
    handle = team.start("otters")
    member = wait_until(
        lambda: next(
            (
                c
                for c in client.store.children(handle.run_id)
                if c.status == S.RUNNING and scripted.requests_for(c.run_id)
            ),
            None,
        ),
        what="the writer's model call to be in flight",
    )
    client.store.fail(member.run_id, epoch=None, error={"type": "Crash", "message": "killed mid-step"})

    failed = client.store.get_record(member.run_id)

    # Then the sweeper (every 0.5 s in the embedded worker) puts the team in ERROR naming the
    # member, while the member's step is still in flight: no fan-in of that step did it
    out = handle.wait(30)
    assert out.status == S.ERROR and out.error is not None
    assert out.error.type == "MemberRunError" and member.run_id in out.error.message
    assert "Crash: killed mid-step" in out.error.message
    # And the member's own step, once its model call returns, is fenced: the ERROR row stands
    scripted.holding.release()
    events = wait_for_late_commit(client.store, failed)
    assert "fenced" in kinds(events), f"the failed member's step committed: {events}"
    after = client.get_run(member.run_id)
    assert after.status == S.ERROR and after.error is not None and after.error.type == "Crash"
    assert [m.role for m in after.messages] == ["user"]
    assert client.get_run(handle.run_id).status == S.ERROR


# ---------------------------------------------------------------- the example


@pytest.mark.slow
def test_the_team_research_demo_runs_on_the_embedded_default(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RATCHET_", "OPENAI_"))}
    ratchet_bin = str(Path(sys.executable).parent / "ratchet")

    result = subprocess.run(
        [ratchet_bin, "demo", "team_research"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )

    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "while the members work:" in out and "member researcher" in out
    assert "team run COMPLETED: From the team: Facts: Sea otters hold hands" in out
    assert "1 top-level run(s)" in out
    assert out.count("researcher     COMPLETED") == 1 and out.count("writer         COMPLETED") == 1
