"""Write constraints.txt: the version of every package the image installs, resolved afresh.

    python3.11 scripts/constraints.py

Run it with the Python the image has (the Dockerfile's FROM: 3.11, on Linux) after a change to
pyproject.toml's dependencies or extras, and commit the result: the image installs exactly
these versions (`pip install --no-deps -r constraints.txt`, then `pip check`), so two builds of
one commit install the same packages. pip resolves ratchet-agents with the extras the image's
services need and the build backend, as in a fresh environment (`--dry-run --ignore-installed`:
nothing is installed); tests/unit/test_constraints.py checks the result against pyproject.toml.

pip runs without the caller's pip configuration, so the pins are the package index's, not this
machine's: no configuration file is read (PIP_CONFIG_FILE is the null device), and the
environment's constraints and extra package sources are dropped (PIP_CONSTRAINT,
PIP_BUILD_CONSTRAINT, PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS, PIP_NO_INDEX). PIP_INDEX_URL is
kept: set it to reach the index through a mirror (a mirror in a configuration file is not read).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The extras the image's services need: PostgreSQL's driver, `ratchet api`, traces, Flower, and
#: the model providers and MCP the workers' agents may call.
EXTRAS = ("postgres", "api", "otel", "flower", "anthropic", "gemini", "mcp")
#: The caller's pip settings that would pin or add packages of its own machine.
LOCAL_PIP = ("PIP_CONSTRAINT", "PIP_BUILD_CONSTRAINT", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX")
HEADER = """\
# Every package the image installs, at one version each (the Dockerfile installs these with
# --no-deps, then runs pip check): ratchet-agents[{extras}] and its build backend, resolved
# for CPython 3.11 on Linux. Regenerate after changing pyproject.toml's dependencies:
#   python3.11 scripts/constraints.py
# A project built FROM the image installs its own requirements with `-c /app/constraints.txt`.
#   extras: {extras}
#   resolved with: CPython {python} on Linux
"""


def pip_environment(environ: dict[str, str]) -> dict[str, str]:
    """`environ` for a pip that reads no configuration file and none of LOCAL_PIP."""
    return {k: v for k, v in environ.items() if k not in LOCAL_PIP} | {"PIP_CONFIG_FILE": os.devnull}


def resolve() -> dict[str, str]:
    """What pip would install for the project with EXTRAS and its build backend: name -> version."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    name = project["project"]["name"]
    wanted = [f"{ROOT}[{','.join(EXTRAS)}]", *project["build-system"]["requires"]]
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--dry-run",
                "--ignore-installed",
                "--quiet",
                "--report",
                str(report),
                *wanted,
            ],
            check=True,
            env=pip_environment(dict(os.environ)),
        )
        installs = json.loads(report.read_text())["install"]
    pins = {i["metadata"]["name"]: i["metadata"]["version"] for i in installs}
    pins.pop(name)
    return pins


def main() -> int:
    if sys.version_info[:2] != (3, 11) or sys.platform != "linux":
        sys.exit("run this with Python 3.11 on Linux, as the image has (e.g. python3.11 scripts/constraints.py)")
    pins = resolve()
    lines = [f"{name}=={pins[name]}" for name in sorted(pins, key=str.lower)]
    python = ".".join(map(str, sys.version_info[:3]))
    text = HEADER.format(extras=",".join(EXTRAS), python=python) + "\n".join(lines) + "\n"
    (ROOT / "constraints.txt").write_text(text)
    print(f"constraints.txt: {len(lines)} packages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
