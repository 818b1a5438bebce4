"""What `ratchet` prints of a model's text: nothing that drives the reader's terminal, and nothing
stdout cannot encode."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from workers.cli.render import terminal


def test_control_characters_of_a_models_text_are_shown_not_obeyed() -> None:
    assert terminal("\x1b[31mred\x1b[0m\x07 and\ttabs\nlines") == "\\x1b[31mred\\x1b[0m\\x07 and\ttabs\nlines"
    assert terminal("\x9b2J") == "\\x9b2J"  # the one-byte CSI too


def test_text_stdout_cannot_encode_is_escaped_instead_of_failing_the_command() -> None:
    code = "from workers.cli.render import terminal; print(terminal('caf\\u00e9 \\ud800'))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONIOENCODING": "ascii", "PATH": ""},
        timeout=60, cwd=str(Path(__file__).resolve().parents[2]),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "caf\\xe9 \\ud800\n"
