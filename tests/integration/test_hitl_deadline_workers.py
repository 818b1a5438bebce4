"""A pause's deadline fired by a real worker's sweeper, on SQLite and PostgreSQL: the run pauses
for a confirmation with a short pause_timeout, nobody decides and nobody continues it, and the
worker's sweeper (RATCHET_SWEEP_SECONDS 0.5 here) applies on_timeout within a few sweeps of the
deadline; the worker then finishes the run with the rejection as the call's result. Every policy
at the agent's and the tool's level: tests/unit/test_hitl_deadline_inline.py."""

from __future__ import annotations

import uuid

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


def test_a_workers_sweeper_rejects_a_call_nobody_decided_at_its_deadline(
    settings: Settings, scripted: ScriptedServer, worker: object
) -> None:
    paid: list[str] = []

    @tool(requires_confirmation=True, pause_timeout=PAUSE_TIMEOUT, on_timeout="reject")
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
        lambda: (run := client.get_run(run_id)).status == S.COMPLETED and run,
        timeout=PAUSE_TIMEOUT + LATE + 30,
        what="the sweeper to act on the deadline and the worker to finish the run",
    )

    assert paid == []
    [stored] = done.requirements
    assert stored.status == "decided" and stored.decided_by == DEADLINE and stored.confirmation is False
    [result] = [m for m in done.messages if m.role == "tool"]
    assert result.tool_call_error and "nobody decided before the deadline" in (result.content or "")
    log = client.store.get_events(run_id)
    [fired] = [e for e in log if e["kind"] == "deadline"]
    assert fired["detail"]["policy"] == "reject" and fired["detail"]["requirement"] == req.id
    assert req.deadline_at <= fired["at"] < req.deadline_at + LATE  # at the deadline, by a sweep
    assert "continue" not in [e["kind"] for e in log]  # nobody had to continue it
