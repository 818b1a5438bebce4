"""A pause's deadline fired by a real worker's sweeper, on SQLite and PostgreSQL: the run pauses
for a confirmation with a short pause_timeout, nobody decides and nobody continues it, and the
worker's sweeper (RATCHET_SWEEP_SECONDS 0.5 here) applies on_timeout within a few sweeps of the
deadline: reject and approve (the worker then finishes the run with the call rejected, or run),
cancel and error. Every policy at the agent's and the tool's level, stepped inline:
tests/unit/test_hitl_deadline_inline.py."""

from __future__ import annotations

import uuid

import pytest

from orchestrator import Agent, Client, RunStatus, tool
from orchestrator.models import OpenAIChat
from orchestrator.requirements import DEADLINE
from orchestrator.settings import Settings
from orchestrator.testing.server import ScriptedServer
from orchestrator.testing.waiting import wait_until

S = RunStatus
PAUSE_TIMEOUT = 1.0
#: How long after its deadline the sweeper may act on a loaded machine: a few sweep intervals.
LATE = 15.0


#: Each policy: the status the run ends in, whether the call ran, and the deadline's decision.
POLICIES = {
    "reject": (S.COMPLETED, False, False),
    "approve": (S.COMPLETED, True, True),
    "cancel": (S.CANCELLED, False, None),
    "error": (S.ERROR, False, None),
}


@pytest.mark.parametrize("policy", list(POLICIES))
def test_a_workers_sweeper_applies_the_policy_of_a_call_nobody_decided_at_its_deadline(
    settings: Settings, scripted: ScriptedServer, worker: object, policy: str
) -> None:
    paid: list[str] = []
    ends, runs_the_call, confirmed = POLICIES[policy]

    @tool(requires_confirmation=True, pause_timeout=PAUSE_TIMEOUT, on_timeout=policy)
    def pay(to: str) -> str:
        """Pay someone."""
        paid.append(to)
        return f"paid {to}"

    client = Client(settings)
    agent = Agent(
        name=f"deadline-{uuid.uuid4().hex[:8]}", model=OpenAIChat(id="gpt-4o-mini"), tools=[pay], client=client
    )
    run_id = client.start(agent.name, input="pay bob").run_id
    out = client.wait(run_id, timeout=30)  # wait() returns on PAUSED
    assert out.status == S.PAUSED
    [req] = out.active_requirements
    assert req.deadline_at is not None

    done = wait_until(
        lambda: (run := client.get_run(run_id)).status == ends and run,
        timeout=PAUSE_TIMEOUT + LATE + 30,
        what=f"the sweeper to act on the deadline ({policy}) and the run to end {ends}",
    )

    assert paid == (["pay bob"] if runs_the_call else [])
    [stored] = done.requirements
    log = client.store.get_events(run_id)
    [fired] = [e for e in log if e["kind"] == "deadline"]
    assert fired["detail"]["policy"] == policy and fired["detail"]["requirement"] == req.id
    assert req.deadline_at <= fired["at"] < req.deadline_at + LATE  # at the deadline, by a sweep
    assert "continue" not in [e["kind"] for e in log]  # nobody had to continue it
    if confirmed is None:  # the run ended without the call
        assert stored.status in ("expired", "void") and stored.decision is None
        if policy == "error":
            assert done.error is not None and done.error.type == "PauseTimeoutError"
        return
    assert stored.status == "decided" and stored.decided_by == DEADLINE and stored.confirmation is confirmed
    [result] = [m for m in done.messages if m.role == "tool"]
    if confirmed:
        assert result.content == "paid pay bob" and not result.tool_call_error
    else:
        assert result.tool_call_error and "nobody decided before the deadline" in (result.content or "")
