"""A unit test of the agents, as you would write it: no broker, no worker, no API key.

`in_memory()` runs each step inline on a temporary SQLite file, through the same engine a worker
runs; `ScriptedModel` answers from a script instead of calling OpenAI. Run it with `pytest`."""

import pytest

from orchestrator import RunStatus
from orchestrator.testing import in_memory
from orchestrator.testing.script import Fault, ScriptConfig
from orchestrator.testing.scripted_model import ScriptedModel

from agents import team


def test_the_tools_error_reaches_the_model_and_the_run_completes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(team, "model", ScriptedModel(script=ScriptConfig(final_text="Summary: {tool_results}")))
    with in_memory():
        out = team.run("Look up the weather")

    assert out.status == RunStatus.COMPLETED
    [result] = [m for m in out.messages if m.role == "tool"]
    assert result.tool_name == "broken_tool" and result.tool_call_error
    assert out.content is not None and out.content.startswith("Summary: ")


def test_a_rate_limit_is_retried_without_waiting_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    script = ScriptConfig(faults=[Fault(status=429, retry_after=20)])
    monkeypatch.setattr(team, "model", ScriptedModel(script=script))
    with in_memory() as ratchet:
        assert team.run("Look up the weather").status == RunStatus.COMPLETED
    assert ratchet.now >= 20  # the 20 s Retry-After passed on the dispatcher's virtual clock
