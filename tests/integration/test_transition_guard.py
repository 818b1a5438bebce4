"""Every write of a run's status is checked against the transition table, and `python -O`, which
strips asserts, does not remove the check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

ILLEGAL_MOVE = """
import sys
from orchestrator.messages import Message
from orchestrator.status import RunStatus as S
from orchestrator.store import Store

if __debug__:
    sys.exit("not running under python -O")
store = Store.open(sys.argv[1])
store.create_run(
    run_id="r", session_id="s", agent_name="nobody", kind="agent",
    input_messages=[Message(role="user", content="hi")], publish_grace=60,
)
store.move("r", src=(S.QUEUED,), dst=S.CANCELLED)  # legal (an assert here would not run)
try:
    store.move("r", src=(S.CANCELLED,), dst=S.QUEUED)
except ValueError as exc:
    print(exc)
print(store.get_record("r").status.value)
"""

TABLE_WITHOUT_THE_CLAIM = """
import importlib
import sys
from orchestrator import status
from orchestrator.store import statements

if __debug__:
    sys.exit("not running under python -O")
status.TRANSITIONS[status.RunStatus.QUEUED] = frozenset()
try:
    importlib.reload(statements)  # builds the claim again, as a first import would
except ValueError as exc:
    print(exc)
else:
    print("built")
"""


def optimised(script: str, *args: str) -> list[str]:
    """The lines `script` prints, run by `python -O` on this checkout."""
    done = subprocess.run(
        [sys.executable, "-O", "-c", script, *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.splitlines()


def test_an_illegal_move_is_refused_under_python_O_and_changes_nothing(tmp_path: Path) -> None:
    assert optimised(ILLEGAL_MOVE, f"sqlite:///{tmp_path / 'o.db'}") == [
        "illegal run transition CANCELLED -> QUEUED",
        "CANCELLED",
    ]


def test_a_transition_table_without_the_claims_move_fails_the_claims_statement_under_python_O() -> None:
    assert optimised(TABLE_WITHOUT_THE_CLAIM) == ["illegal run transition QUEUED -> RUNNING"]
