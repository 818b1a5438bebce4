"""Ratchet installed by name, as a user installs it: the wheel built from a copy of this checkout,
installed with no extra into a fresh virtual environment beside its dependencies alone, where
`ratchet --version`, `ratchet demo` and the README's quick start (pasted into two terminals, as
tests/integration/test_quickstart.py does on this checkout) work, and what needs an extra (a
PostgreSQL URL's driver, `ratchet api`) names it.

Built from a copy: a build writes build/ and an egg-info folder beside the sources, and tests never
change the checkout. The environment is made without a pip of its own: the tests' pip installs into
it (`pip --python`), which saves the seconds ensurepip takes. Its dependencies are not fetched from
the index (20 s or more of pip asking it about each): the distributions the wheel's metadata
requires, and theirs, are linked in from the tests' own environment, and nothing else of it (no
extra, no test tool, not this checkout); the wheel is installed beside them with `--no-deps`, and
`pip check` shows each requirement it declares met at a version it accepts."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from orchestrator.testing.waiting import wait_until
from tests.integration.test_quickstart import (
    PORT,
    PRINTS,
    WARM_SHUTDOWN,
    Terminal,
    commands,
    free_port,
    newcomer,
    readme,
    set_up,
    shown_as,
)

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
#: A warning class a build backend prints (`SetuptoolsDeprecationWarning: ...`), not pip's own `WARNING:`.
BACKEND_WARNING = re.compile(r"\b[A-Z][a-z]\w*Warning\b")


def run(
    argv: list[str | Path], *, cwd: Path = ROOT, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{argv}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def installed_only() -> dict[str, str]:
    """A newcomer's environment (no Ratchet setting, no model key) with nothing on PYTHONPATH:
    Ratchet is only what the wheel installed."""
    env = newcomer()
    del env["PYTHONPATH"]
    return env


def source_copy(folder: Path) -> Path:
    """The files git knows of (tracked, or new and not ignored), as they are in the work tree."""
    listed = run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT).stdout
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, folder / name)
    return folder


def build_wheel(tmp_path: Path) -> Path:
    source = source_copy(tmp_path / "source")
    built = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", tmp_path / "dist", source])
    assert not BACKEND_WARNING.search(built.stdout + built.stderr), built.stdout + built.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    return wheel


def assert_the_wheel_holds_ratchet_and_nothing_else(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    info = f"ratchet_agents-{PROJECT['version']}.dist-info"
    modules = {p.relative_to(ROOT).as_posix() for d in ("orchestrator", "workers") for p in (ROOT / d).rglob("*.py")}
    shipped = {
        p.relative_to(ROOT).as_posix()
        for d in ("orchestrator/store/migrations", "workers/api/static")
        for p in (ROOT / d).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    demos = {f"workers/examples/{p.name}" for p in (ROOT / "examples").glob("*.py")}

    assert modules - names == set(), "modules missing from the wheel: a package not listed in pyproject.toml"
    assert shipped - names == set(), "migrations or run pages missing from the wheel"
    assert demos - names == set(), "`ratchet demo`'s scenarios missing from the wheel"
    assert {n.split("/")[0] for n in names} == {"orchestrator", "workers", info}  # no tests/, bench/, examples/
    metadata = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
    assert "Name: ratchet-agents\n" in metadata and "License-Expression: Apache-2.0\n" in metadata


def fresh_venv(folder: Path, wheel: Path) -> Path:
    """A new virtual environment holding the wheel and what it requires (`linked_dependencies`),
    as `pip install ratchet-agents` would leave it."""
    run([sys.executable, "-m", "venv", "--without-pip", folder])
    python = folder / "bin" / "python"
    site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip())
    (site / "ratchet-dependencies.pth").write_text(f"{linked_dependencies(wheel, folder / 'dependencies')}\n")
    run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-compile", "--no-deps", wheel])
    run([sys.executable, "-m", "pip", "--python", python, "check"])  # every requirement met, at a version it accepts
    return folder


def linked_dependencies(wheel: Path, into: Path) -> Path:
    """A folder of links to the files of each distribution the wheel requires (no extra of its
    own; its requirements' extras, such as celery[redis], followed), and of theirs, as this
    environment installed them: the dependencies alone, found as installed."""
    into.mkdir()
    info = next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".dist-info/METADATA"))
    wanted = applying(Parser().parsestr(zipfile.ZipFile(wheel).read(info).decode()).get_all("Requires-Dist"), "")
    seen: set[tuple[str, str]] = set()
    while wanted:
        requirement = wanted.pop()
        dist = metadata.distribution(name := canonicalize_name(requirement.name))
        for extra in {"", *requirement.extras} - {e for n, e in seen if n == name}:
            seen.add((name, extra))
            wanted += applying(dist.requires, extra)
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] not in ("..", "__pycache__")}:
            if not (into / top).exists():
                (into / top).symlink_to(Path(str(dist.locate_file(top))))
    return into


def applying(requirements: list[str] | None, extra: str) -> list[Requirement]:
    """The requirements that apply on this platform with `extra` asked for ("" for none)."""
    parsed = [Requirement(r) for r in requirements or []]
    return [r for r in parsed if r.marker is None or r.marker.evaluate({"extra": extra})]


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_the_wheel_installs_by_name_into_a_fresh_environment_where_the_demo_and_the_quick_start_work(
    tmp_path: Path,
) -> None:
    # Given the wheel, installed with no extra into an environment of its own
    wheel = build_wheel(tmp_path)
    assert_the_wheel_holds_ratchet_and_nothing_else(wheel)
    venv = fresh_venv(tmp_path / "venv", wheel)
    ratchet = str(venv / "bin" / "ratchet")

    # Then the command names the distribution
    assert run([ratchet, "--version"], env=installed_only()).stdout == f"ratchet-agents {PROJECT['version']}\n"

    # And `ratchet demo`, in an empty folder, runs the seed scenarios on the embedded default
    (tmp_path / "empty").mkdir()
    demo = run([ratchet, "demo"], cwd=tmp_path / "empty", env=installed_only()).stdout
    assert "DB run: status=COMPLETED, msgs=5, tools=1" in demo and "[ok] messages preserved" in demo
    assert "acontinue_run returned. status=COMPLETED" in demo

    # And what needs an extra says which: PostgreSQL's driver (SQLite needs none), the HTTP API
    pg = installed_only() | {"RATCHET_DATABASE_URL": "postgresql://ratchet@127.0.0.1:5432/test"}
    migrate = subprocess.run([ratchet, "migrate"], env=pg, capture_output=True, text=True, timeout=60)
    assert migrate.returncode != 0
    assert migrate.stderr == (
        "ratchet: error: RATCHET_DATABASE_URL is a PostgreSQL URL, and its driver psycopg is not installed: "
        "pip install 'ratchet-agents[postgres]'\n"
    )
    agents = "workers.examples.team_research"  # the demo's team, as the wheel carries it
    api = subprocess.run(
        [ratchet, "api", "--app", agents], env=installed_only(), capture_output=True, text=True, timeout=60
    )
    assert api.returncode != 0 and "needs the api extra (pip install 'ratchet-agents[api]')" in api.stderr, api.stderr
    # the providers' and MCP's SDKs, each named by its extra when an agent is built without it
    extras = (
        "from orchestrator.errors import ConfigurationError\n"
        "from orchestrator.models import Claude, Gemini\n"
        "from orchestrator.tools.mcp import MCPTools\n"
        "for build in (lambda: Claude(id='c'), lambda: Gemini(id='g'), lambda: MCPTools(command='server')):\n"
        "    try:\n"
        "        build()\n"
        "    except ConfigurationError as exc:\n"
        "        print(exc)\n"
    )
    said = run([venv / "bin" / "python", "-c", extras], cwd=tmp_path / "empty", env=installed_only()).stdout
    for extra in ("anthropic", "gemini", "mcp"):
        assert f"pip install 'ratchet-agents[{extra}]'" in said, said

    # And the README's quick start, pasted into two terminals, runs on that environment
    assert_the_quick_start_runs_on(venv, tmp_path)


def assert_the_quick_start_runs_on(venv: Path, tmp_path: Path) -> None:
    """tests/integration/test_quickstart.py's terminals, with the README's `python3 -m venv .venv`
    made the wheel's environment (its `pip install ratchet-agents` skipped: that is what the
    environment holds) and the checkout taken off PYTHONPATH: the setup, the scripted model and
    a worker in terminal 1, the producer in terminal 2, Ctrl-C."""
    (home := tmp_path / "home").mkdir()
    one, two = Terminal("terminal-1", home, tmp_path), Terminal("terminal-2", home, tmp_path)
    try:
        for terminal in (one, two):
            terminal.paste("unset PYTHONPATH\n")
        folder = set_up(one, set(), environment=f"ln -s '{venv}' .venv")
        one.paste(commands("1")[1].replace(PORT, free_port()))
        stopped = one.ask()  # answered only once the worker stops
        wait_until(lambda: " ready." in one.output() or one.answered(stopped), timeout=90, what="the worker")
        assert not one.answered(stopped), one.output()[-4000:]

        two.paste(commands("2")[0])
        status, _, printed = two.prompt(180)
        assert status == 0 and shown_as(printed, PRINTS.findall(readme())[0]), printed
        assert (folder / ".ratchet" / "ratchet.db").is_file()

        one.ctrl_c()
        assert WARM_SHUTDOWN in one.prompt(60, stopped)[2]
    finally:
        one.close()
        two.close()


def test_from_a_source_tree_that_is_not_installed_the_version_says_so(tmp_path: Path) -> None:
    # Given the sources alone on PYTHONPATH, and a Python that sees no site-packages (`-S`), so
    # no installed distribution's metadata: `workers.cli.launch` needs only the standard library.
    shutil.copytree(ROOT / "workers", tmp_path / "workers", ignore=shutil.ignore_patterns("__pycache__"))
    env = installed_only() | {"PYTHONPATH": str(tmp_path)}

    code = "from workers.cli.launch import version_line; print(version_line())"
    done = run([sys.executable, "-S", "-c", code], cwd=tmp_path, env=env)

    assert done.stdout == (
        f"ratchet-agents, not installed: running from the source tree at {tmp_path} "
        "(`pip install -e .` there installs it)\n"
    )
