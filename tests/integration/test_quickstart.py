"""The README's quick start, followed as a newcomer would: its files (examples/quickstart/, shown
verbatim in README.md) copied into a bare folder, `ratchet worker --app agents` started there,
then `python main.py` beside it; all on the defaults (a SQLite file and kombu's filesystem broker
under .ratchet/) with the scripted model standing in for OpenAI."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.testing.server import ScriptedServer

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart"
RATCHET = str(Path(sys.executable).parent / "ratchet")
#: A file shown in README.md: a marker naming it, then the fenced block.
SHOWN = re.compile(r"<!-- (examples/quickstart/\w+\.py) -->\n```python\n(.*?)```", re.DOTALL)

pytestmark = [pytest.mark.slow]


def test_the_readme_shows_the_quick_start_files_exactly_as_they_are() -> None:
    readme = (ROOT / "README.md").read_text()
    shown = dict(SHOWN.findall(readme))

    assert sorted(shown) == sorted(f"examples/quickstart/{p.name}" for p in QUICKSTART.glob("*.py"))
    for path, text in shown.items():
        assert text == (ROOT / path).read_text(), f"README.md shows {path} other than it is"
    assert "ratchet worker --app agents " in readme and "python main.py " in readme


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A folder of the user's own holding the quick start's files, and nothing else."""
    folder = tmp_path / "project"
    folder.mkdir()
    for path in QUICKSTART.glob("*.py"):
        shutil.copy(path, folder / path.name)
    return folder


def shell(model: ScriptedServer | None = None) -> dict[str, str]:
    """A newcomer's environment: no Ratchet setting (the defaults), Ratchet importable as if
    installed, and, where given, the model's address and key as the README says to set them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RATCHET_", "OPENAI_"))}
    env["PYTHONPATH"] = str(ROOT)
    if model is not None:
        env.update(OPENAI_BASE_URL=model.url, OPENAI_API_KEY="sk-scripted")
    return env


@pytest.fixture
def worker(project: Path, scripted: ScriptedServer, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`ratchet worker --app agents`, started in the project folder as the README says."""
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [RATCHET, "worker", "--app", "agents"], cwd=project, env=shell(scripted),
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        yield proc
        proc.terminate()  # a warm shutdown, as Ctrl-C asks for
        assert proc.wait(60) == 0, log_path.read_text(errors="replace")[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_the_producer_gets_its_runs_done_by_the_worker_the_readme_starts(
    project: Path, worker: subprocess.Popen[bytes]
) -> None:
    # The producer has no model key: the worker makes every model call.
    done = subprocess.run(
        [sys.executable, "main.py"], cwd=project, env=shell(), capture_output=True, text=True, timeout=180
    )

    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    status, run_id = lines[0].split()
    assert status == "COMPLETED"
    assert lines[1:6] == [
        "  system: Call broken_tool once, then summarize.",
        "  user: hello",
        "  assistant: broken_tool",
        "  tool: this tool always fails on query=hello",
        "  assistant: Summary: this tool always fails on query=hello",
    ]
    assert re.fullmatch(rf"COMPLETED \S+ forked from {run_id}", lines[6])
    assert lines[7:] == ["COMPLETED", "3 runs in sess-A"]
    assert worker.poll() is None
    # Everything the runs wrote is under .ratchet/ in the folder they were started in.
    assert (project / ".ratchet" / "ratchet.db").exists() and (project / ".ratchet" / "broker").is_dir()


def test_a_script_runs_its_agents_on_the_worker_it_starts_in_its_own_process(
    project: Path, scripted: ScriptedServer
) -> None:
    # No worker process anywhere: the script's EmbeddedWorker is the only one.
    done = subprocess.run(
        [sys.executable, "in_process.py"], cwd=project, env=shell(scripted),
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip

    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == "COMPLETED Summary: this tool always fails on query=hello\n"


def test_the_readme_unit_test_of_the_agents_passes_in_the_users_folder(project: Path) -> None:
    # `pytest test_agents.py` beside agents.py, as the README says: no worker, no broker, no key.
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "test_agents.py", "-q", "-p", "no:cacheprovider"],
        cwd=project, env=shell(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 passed" in done.stdout
    assert not (project / ".ratchet").exists()  # the in-memory store lived in a temporary folder
