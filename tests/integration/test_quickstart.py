"""The README's quick start, followed literally: its commands are read from README.md's blocks and
pasted into two terminals (a bash each, reading them on its standard input as a shell reads what
is typed), and its files are written, from the README's own text, into the folder its commands
make. So the README and this test cannot drift: a command changed in one is run changed here.
All on the defaults (a SQLite file and the filesystem broker under .ratchet/), with
`ratchet scripted-model` standing in for OpenAI, as the README says.

Stood in for, and nothing else (`VENV`, `INSTALLS`, `free_port`):
- `python3 -m venv .venv` links `.venv` to the environment these tests run in (Ratchet installed
  from this checkout), and the README's `pip install` lines are skipped: that environment holds
  what they install (pytest runs without its plugins, as a newcomer's has none). Installing
  ratchet-agents by name into a fresh environment is tests/integration/test_wheel_install.py's.
- The scripted model's port (8765 in the README) is a free one, so that tests in parallel
  processes do not collide.
The README runs its unit test in terminal 2; here a terminal of its own does the setup and runs
it, so that it runs beside the rest.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator.testing.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart"
#: A file the README shows: a line naming it ("`agents.py`:"), then its block.
FILE = re.compile(r"^`(\w+\.py)`:\n\n```python\n(.*?)^```$", re.M | re.S)
#: Commands to paste: a line that starts with **Terminal N**, then the block.
COMMANDS = re.compile(r"^\*\*Terminal (\d)\*\*[^\n]*\n\n```bash\n(.*?)^```$", re.M | re.S)
#: What `python main.py` prints, as the README shows it (RUN_ID and FORK_ID stand for run ids).
PRINTS = re.compile(r"^It prints[^\n]*:\n\n```text\n(.*?)^```$", re.M | re.S)
#: The scripted model's port in the README's commands.
PORT = "8765"
#: The README's commands that run otherwise here (a line's part before its `#` comment).
VENV = "python3 -m venv .venv"
INSTALLS = {"pip install ratchet-agents", "pip install pytest"}
#: Celery's line when a worker stops warmly (Ctrl-C once).
WARM_SHUTDOWN = "Warm shutdown"


def readme() -> str:
    return (ROOT / "README.md").read_text()


def commands(terminal: str) -> list[str]:
    """The blocks the README gives a terminal, in order."""
    return [block for n, block in COMMANDS.findall(readme()) if n == terminal]


def this_environment() -> str:
    """The command that makes `.venv` this test's own environment, where Ratchet is installed."""
    if sys.prefix != sys.base_prefix:  # a virtual environment: its activate script is the real one
        return f"ln -s '{sys.prefix}' .venv"
    return f"'{sys.executable}' -m venv --system-site-packages --without-pip .venv"


def stood_in(block: str, used: set[str], environment: str | None = None) -> str:
    """`block` with `VENV` made this environment (or the command `environment`) and `INSTALLS`
    skipped, noting which it met."""
    lines = []
    for line in block.splitlines():
        command = line.split("#", 1)[0].strip()
        if command == VENV:
            line = environment or this_environment()
        elif command in INSTALLS:
            line = ": skipped, this environment holds it"
        used.add(command)
        lines.append(line)
    return "\n".join(lines) + "\n"


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def newcomer() -> dict[str, str]:
    """A newcomer's environment: no Ratchet or OpenAI setting, no virtual environment active, no
    pytest setting of ours, and Ratchet importable from this checkout as if installed."""
    drop = ("RATCHET_", "OPENAI_", "PYTEST_", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["PYTHONPATH"] = str(ROOT)
    # A newcomer's `pip install pytest` brings no plugin; ours (schemathesis, playwright, ...)
    # would only slow its start.
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return env


class Terminal:
    """A terminal the README's commands are pasted into: one bash, in a session of its own,
    reading them on its standard input; what it prints goes to a log."""

    def __init__(self, name: str, home: Path, logs: Path) -> None:
        self.name = name
        self.log = logs / f"{name}.log"
        self.asked = 0
        self.read = 0
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                ["bash"],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=home,
                env=newcomer(),
                start_new_session=True,
            )

    def paste(self, commands: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(commands.encode())
        self.proc.stdin.flush()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def ask(self) -> str:
        """Ask for the prompt: its line appears once everything pasted before it has run."""
        self.asked += 1
        mark = f"[{self.name}: prompt {self.asked}]"
        self.paste(f'echo "{mark} $? $PWD"\n')
        return mark

    def answered(self, mark: str) -> re.Match[str] | None:
        return re.search(rf"^{re.escape(mark)} (\d+) (.*)$", self.output(), re.M)

    def prompt(self, timeout: float, mark: str | None = None) -> tuple[int, Path, str]:
        """Wait for the prompt (`mark`, or a new one): the last command's exit status, the
        working directory, and what the terminal printed since the prompt before."""
        mark = mark or self.ask()
        try:
            found = wait_until(lambda: self.answered(mark), timeout=timeout, interval=0.1, what=mark)
        except TimeoutError:
            pytest.fail(f"{mark} did not come back in {timeout:g} s:\n{self.output()[-4000:]}")
        printed, self.read = self.output()[self.read : found.start()], found.end()
        return int(found.group(1)), Path(found.group(2)), printed

    def ctrl_c(self) -> None:
        """What Ctrl-C does: SIGINT to the foreground processes (a background job ignores it)."""
        os.killpg(self.proc.pid, signal.SIGINT)

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # whatever the commands left running
        except ProcessLookupError:
            pass
        self.proc.wait()


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Callable[[str], Terminal]]:
    """Opens terminals at the user's home (a bare folder); closes them after the test."""
    home = tmp_path / "home"
    home.mkdir()
    opened: list[Terminal] = []

    def open_terminal(name: str) -> Terminal:
        opened.append(Terminal(name, home, tmp_path))
        return opened[-1]

    yield open_terminal
    for t in opened:
        t.close()


def shown_as(printed: str, shown: str) -> bool:
    """Whether `printed` is what the README shows, RUN_ID and FORK_ID standing for run ids."""
    pattern = re.escape(shown.strip())
    pattern = pattern.replace("RUN_ID", r"(?P<run>\S+)", 1).replace("RUN_ID", "(?P=run)").replace("FORK_ID", r"\S+")
    return re.fullmatch(pattern, printed.strip()) is not None


def set_up(terminal: Terminal, used: set[str], environment: str | None = None) -> Path:
    """The README's setup pasted into `terminal` (a folder, a virtual environment, Ratchet), then
    the files written into that folder as the README shows them: the folder."""
    setup = commands("1")[0]
    terminal.paste(stood_in(setup, used, environment))
    status, folder, printed = terminal.prompt(60)
    assert status == 0, printed
    for name, text in FILE.findall(readme()):
        (folder / name).write_text(text)
    return folder


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_quick_start_pasted_into_two_terminals_runs_as_the_readme_says(
    terminal: Callable[[str], Terminal],
) -> None:
    _, worker, in_process = commands("1")
    producer = commands("2")[0]
    [shown] = PRINTS.findall(readme())
    port, used = free_port(), set[str]()
    assert PORT in worker, "the README's scripted model moved off the port this test replaces"
    one, two = terminal("terminal-1"), terminal("terminal-2")

    # Terminal 1: a folder, a virtual environment, Ratchet; the files in that folder
    folder = set_up(one, used)
    assert {VENV, "pip install ratchet-agents"} <= used, f"the README's setup runs {used}"

    # Terminal 1 again: the scripted model in the background and a worker pointed at it
    one.paste(worker.replace(PORT, port))
    stopped = one.ask()  # answered only once the worker stops
    wait_until(lambda: " ready." in one.output() or one.answered(stopped), timeout=90, what="the worker")
    assert not one.answered(stopped), one.output()[-4000:]

    # Terminal 2: the producer prints what the README says it prints
    two.paste(producer)
    status, _, printed = two.prompt(180)
    assert status == 0, printed
    assert shown_as(printed, shown), f"main.py printed:\n{printed}\nthe README shows:\n{shown}"
    assert (folder / ".ratchet" / "ratchet.db").is_file() and (folder / ".ratchet" / "broker").is_dir()

    # Ctrl-C in terminal 1 stops the worker warmly; the scripted model, in the background, goes on
    one.ctrl_c()
    _, _, printed = one.prompt(60, stopped)
    assert WARM_SHUTDOWN in printed, printed

    # Terminal 1: a script runs the agents on the worker it starts in its own process
    one.paste(in_process.replace(PORT, port))
    status, _, printed = one.prompt(180)
    assert "COMPLETED Summary: this tool always fails on query=hello\n" in printed, printed
    assert status == 0, printed  # `kill %1` found the scripted model still running, and stopped it


@pytest.mark.slow
def test_the_readme_unit_test_of_the_agents_passes_where_the_quick_start_put_them(
    terminal: Callable[[str], Terminal],
) -> None:
    # The README runs it in terminal 2; the setup is pasted there too, as nothing else runs
    unit_test, used = commands("2")[1], set[str]()
    two = terminal("terminal-2")
    set_up(two, used)

    two.paste(stood_in(unit_test, used))
    status, _, printed = two.prompt(120)

    assert "pip install pytest" in used, f"the README's unit test runs {used}"
    assert status == 0 and "2 passed" in printed, printed  # no worker, no broker, no key


def test_the_readme_shows_the_quick_start_files_exactly_as_examples_holds_them() -> None:
    shown = dict(FILE.findall(readme()))

    assert sorted(shown) == sorted(p.name for p in QUICKSTART.glob("*.py"))
    for name, text in shown.items():
        assert text == (QUICKSTART / name).read_text(), f"README.md shows {name} other than examples/quickstart/ has it"
