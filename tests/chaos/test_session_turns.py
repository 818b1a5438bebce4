"""A serialized session's turn across a worker's death: the process that completed the run ahead
dies before it gives the run waiting behind it its turn; the sweeper gives it, and that run's
history holds the first run's answer."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from orchestrator import RunStatus
from orchestrator.testing.waiting import wait_until
from tests.chaos.agents import SERIAL_AGENT
from tests.chaos.harness import Cluster, pid_alive

pytestmark = pytest.mark.chaos
S = RunStatus
CHAT = {"tool_batches": 0, "final_text": "seen: {users}", "chat": True}


def test_a_turn_its_waker_died_before_giving_is_given_by_the_sweeper(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster()
    cluster.script(**CHAT)
    cluster.start_worker()

    # Given a run under way (its model call held) and a second run of its session waiting behind it
    cluster.model.holding.hold()
    first = cluster.client.start(SERIAL_AGENT, input="first", session_id="chat-1").run_id
    cluster.flag(f"crash-before-turn-{first}")
    cluster.wait_model_call(first, seq=0)
    second = cluster.client.start(SERIAL_AGENT, input="second", session_id="chat-1").run_id
    wait_until(lambda: "session_wait" in cluster.events(second), timeout=20, what="the second run to wait its turn")

    # When the first completes, and the process that completed it dies before it gives the turn
    cluster.model.holding.release()
    wait_until(
        lambda: (cluster.dir / f"crash-before-turn-{first}.taken").exists(), timeout=20, what="the crash after the stop"
    )
    [marker] = cluster.dir.glob(f"model-{first}-0.*")
    wait_until(lambda: not pid_alive(int(marker.suffix[1:])), timeout=20, what="the process to die")
    assert cluster.store.get_record(first).status == S.COMPLETED
    waiting = cluster.store.get_record(second)
    assert (waiting.status, waiting.publish_after) == (S.QUEUED, None)  # nobody will publish it but the sweeper
    assert cluster.store.get_record(first).wakes_session is True

    # Then the sweeper gives the second run its turn, and it sees the first run's answer
    cluster.start_sweeper()
    out = cluster.wait_final([second])[second]
    assert out.status == S.COMPLETED and out.content == "seen: first | second"
    assert "session_turn" in cluster.events(second)
    assert cluster.store.get_record(first).wakes_session is None
