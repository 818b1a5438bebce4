"""`ratchet demo` (what `make demo` runs) on the embedded default, on a bare working directory:
SQLite, the filesystem broker, an in-process worker and the scripted model."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

RATCHET = str(Path(sys.executable).parent / "ratchet")
pytestmark = [pytest.mark.slow]


def run_demo(tmp_path: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RATCHET_", "OPENAI_"))}
    result = subprocess.run(
        [RATCHET, "demo", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_the_seed_demo_prints_the_three_scenarios_as_the_seed_does(tmp_path: Path) -> None:
    out = run_demo(tmp_path)

    a, rest = out.split("SCENARIO B", 1)
    b, c = rest.split("SCENARIO C", 1)
    assert "team.arun returned. status=COMPLETED" in a
    assert "DB run: status=COMPLETED, msgs=5, tools=1" in a
    assert "[3] tool: this tool always fails on query=hello [tool_call_error]" in a

    assert "team.arun returned. status=ERROR" in b
    assert "DB run: status=ERROR, msgs=2" in b and "[ok] messages preserved" in b
    assert "[0] system: You are a helpful assistant. Answer concisely." in b and "[1] user: say hi" in b

    assert "acontinue_run returned. status=COMPLETED" in c
    assert "same as failed run? True" in c
    assert "Session has 1 run(s):" in c and "[COMPLETED] msgs=3" in c

    # Everything lives under .ratchet/ in the working directory, nothing elsewhere.
    assert sorted(p.name for p in tmp_path.iterdir()) == [".ratchet"]
    assert (tmp_path / ".ratchet" / "ratchet.db").exists()
    assert "sk-" not in out.replace("sk-invalid", "")  # no key printed


def test_the_streaming_demo_prints_a_runs_events_as_they_happen_and_a_reader_that_resumes_gets_the_rest(
    tmp_path: Path,
) -> None:
    out = run_demo(tmp_path, "streaming")

    assert "RunStarted" in out.splitlines()[2]
    assert "ToolCallStarted: weather({'city': 'Lisbon'})" in out
    assert "ToolCallCompleted: weather -> sunny and 21 degrees in Lisbon" in out
    assert "RunCompleted: Good news from the weather desk: it is sunny and 21 degrees in Lisbon" in out
    assert "the same as the first reader's: True" in out


def test_an_unknown_example_is_a_clear_error(tmp_path: Path) -> None:
    result = subprocess.run([RATCHET, "demo", "nope"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "no example 'nope' in examples/ (known:" in result.stderr


def test_the_chat_demo_shows_each_run_seeing_the_earlier_runs_of_its_session(tmp_path: Path) -> None:
    out = run_demo(tmp_path, "chat")

    shown = re.findall(r"shown: (.*)\)  \[COMPLETED\]", out)
    assert len(shown) == 3
    assert shown[2].split(" | ") == [
        "Hi! My name is Ada and I am learning Celery.",
        "What should I read first?",
        "What is my name, and what am I learning?",
    ]
    assert shown[0] == "Hi! My name is Ada and I am learning Celery."
    assert out.count("[COMPLETED] ['system', 'user', 'assistant']") == 3  # history is context, not copied


def test_the_extraction_demo_returns_the_schemas_object_after_retrying_a_reply_that_left_a_field_out(
    tmp_path: Path,
) -> None:
    out = run_demo(tmp_path, "extraction")

    assert "status: COMPLETED" in out
    assert "content is a SupportTicket: SupportTicket(customer='Grace Hopper'" in out and "urgent=True" in out
    assert "retried after OutputValidationError: the reply does not follow the output schema SupportTicket" in out
    assert "urgent" in out.split("retried after", 1)[1].splitlines()[0]  # the missing field is named
    assert "read back: True" in out


def test_the_approval_demo_pauses_a_payment_until_another_process_approves_it_then_pays_once(tmp_path: Path) -> None:
    out = run_demo(tmp_path, "approval")

    paused, rest = out.split("[approver, another process]", 1)
    assert ": PAUSED, nothing paid yet: True" in paused
    assert "waiting for a person: confirmation of send_payment({'amount_eur': 120, 'to': 'Ada Lovelace'})" in paused
    assert "held while PAUSED: lease=None" in paused
    assert "decided: confirm by finance@example.com" in rest
    run_id = re.search(r"run (\S+): PAUSED", paused)
    assert run_id is not None and f"run {run_id[1]}: COMPLETED (the same run), paid once: ['Ada Lovelace']" in rest
    assert "answer: Done: sent 120 EUR to Ada Lovelace." in rest
    assert "a later rejection is refused" in rest and "by finance@example.com at" in rest
    events = re.findall(r"\] (Run\w+)", rest)
    assert events == ["RunPaused", "RunRequirementDecided", "RunContinued", "RunCompleted"]
    assert "RunRequirementDecided by finance@example.com: confirm" in rest


def test_the_mcp_demo_lists_a_local_mcp_servers_tools_into_the_catalog_and_calls_them_with_their_keys(
    tmp_path: Path,
) -> None:
    out = run_demo(tmp_path, "mcp_agent")

    assert "  add: Add two integers. ['a', 'b']\n  echo: Echo the text" in out  # from the server, via the catalog
    run_id = re.search(r"run (\S+): COMPLETED", out)
    assert run_id is not None
    assert "  add -> 42\n" in out
    assert re.search(rf"  echo -> hello \(key {run_id[1]}:\S+\)", out)  # the key reached the server in _meta


def test_the_claude_demo_runs_a_parallel_batch_on_the_scripted_messages_api(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    out = run_demo(tmp_path, "claude_agent")

    assert "scripted Messages API at http://127.0.0.1:" in out and "status=COMPLETED" in out
    assert "[2] assistant: None calls=['exchange_rate', 'exchange_rate']" in out
    assert "[3] tool: 1 EUR = 1.08 USD" in out and "[4] tool: 1 EUR = 0.85 GBP" in out
    assert "[5] assistant: Today 1 EUR = 1.08 USD; 1 EUR = 0.85 GBP." in out
    assert re.search(r"tokens in=\d+ \(cached \d+\) out=\d+", out) and "cost=0.0" in out
