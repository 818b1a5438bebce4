"""Helpers of the producer tests: end a run through the store, as a worker's step would, or
park a team on its members, so a test can continue or cancel a run in a known status without
running a model."""

from __future__ import annotations

import uuid

from orchestrator import Agent, RunStatus, Team
from orchestrator.delegation import Delegation, start_members
from orchestrator.messages import Message, ToolCall
from orchestrator.models import OpenAIChat
from orchestrator.run import RunRecord
from orchestrator.store import Store
from orchestrator.team import TO_MEMBER

S = RunStatus


def complete(store: Store, run_id: str, answer: str = "done") -> RunRecord:
    """Claim the run's first step and commit a final answer: the run is COMPLETED."""
    record = store.get_record(run_id)
    claim = store.claim(run_id, record.seq, record.next_step or "model", owner="test", lease_seconds=30, max_attempts=5)
    assert claim is not None, f"run {run_id} could not be claimed ({record.status})"
    return store.commit_step(
        claim, [Message(role="assistant", content=answer)], status=RunStatus.COMPLETED, next_step=None,
        publish_grace=30, content=answer,
    )  # fmt: skip


def fail(store: Store, run_id: str) -> RunRecord:
    """Claim the run's first step and fail it: the run is in ERROR, and continue resumes it."""
    record = store.get_record(run_id)
    claim = store.claim(run_id, record.seq, record.next_step or "model", owner="test", lease_seconds=30, max_attempts=5)
    assert claim is not None, f"run {run_id} could not be claimed ({record.status})"
    failed = store.fail(run_id, epoch=claim.epoch, error={"type": "Boom", "message": "the step failed"})
    assert failed is not None
    return failed


def waiting_team(store: Store, n: int) -> tuple[str, list[str]]:
    """A team run that delegated to `n` members, through the code a tool step uses: the team is
    WAITING and its members QUEUED. Returns the team's run id and the members' in order."""
    team_id = f"team-{uuid.uuid4().hex[:8]}"
    store.create_run(
        run_id=team_id, session_id=f"s-{team_id}", agent_name=team_id, kind="team",
        input_messages=[Message(role="user", content="go")], publish_grace=30,
    )  # fmt: skip
    return team_id, start_delegation(store, team_id, n)


def start_delegation(store: Store, team_id: str, n: int) -> list[str]:
    """Move a QUEUED team run through a model step that delegates to `n` new members."""
    t = uuid.uuid4().hex[:6]
    agents = [Agent(name=f"m{i}-{t}", model=OpenAIChat(id="m")) for i in range(n)]
    Team(name=f"team-{t}", model=OpenAIChat(id="leader"), members=agents)
    claim = store.claim(team_id, 0, "model", owner="test", lease_seconds=30, max_attempts=5)
    assert claim is not None
    calls = [ToolCall(id=f"call-{i}", name=TO_MEMBER, arguments="{}") for i in range(n)]
    store.commit_step(
        claim, [Message(role="assistant", tool_calls=[c.to_openai() for c in calls])],
        status=S.QUEUED, next_step="tools", publish_grace=30,
    )  # fmt: skip
    claim = store.claim(team_id, 1, "tools", owner="test", lease_seconds=30, max_attempts=5)
    assert claim is not None
    delegations = [Delegation(call=c, task="t", members=(a,)) for c, a in zip(calls, agents, strict=True)]
    steps = start_members(store, claim, [], delegations, publish_grace=30)
    assert store.get_record(team_id).status == S.WAITING
    by_call = {r.parent_tool_call_id: r.run_id for r in store.children(team_id)}
    assert len(steps) == n
    return [by_call[c.id] for c in calls]
