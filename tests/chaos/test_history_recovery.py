"""Session history across a worker's death: a run recovered on another attempt after other runs
of its session finished builds exactly the prompt its first attempt built."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import pytest

from orchestrator import RunStatus
from tests.chaos.agents import HISTORY_AGENT
from tests.chaos.harness import Cluster

pytestmark = pytest.mark.chaos
S = RunStatus
CHAT = {"tool_batches": 0, "final_text": "seen: {users}", "chat": True}


def test_a_run_recovered_after_a_crash_keeps_the_history_its_first_attempt_chose(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster()
    cluster.script(**CHAT)
    cluster.start_worker()

    def start(text: str) -> str:
        return cluster.client.start(HISTORY_AGENT, input=text, session_id="chat-1").run_id

    first = start("first")
    assert cluster.wait_final([first])[first].content == "seen: first"
    # Given a run whose first model call hangs: its history (the first run) is fixed at its claim
    cluster.script(**CHAT, delay_s=30)
    second = start("second")
    pid = cluster.wait_model_call(second, seq=0)

    # When its pool process is killed, and another run of the session completes meanwhile
    cluster.script(**CHAT)
    os.kill(pid, signal.SIGKILL)
    between = start("between")
    assert cluster.wait_final([between])[between].content == "seen: first | between"
    cluster.start_sweeper()

    # Then the recovered attempt sends the same conversation as the first one did
    out = cluster.assert_invariants([second], extra_model_calls={0: 1})[second]
    assert out.content == "seen: first | second"
    attempts = cluster.model.requests_for(second)
    assert len(attempts) == 2 and attempts[0]["users"] == attempts[1]["users"] == ["first", "second"]
    # And a later run sees all three, oldest first
    last = start("last")
    assert cluster.wait_final([last])[last].content == "seen: first | second | between | last"
