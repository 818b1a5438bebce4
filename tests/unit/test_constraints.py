"""constraints.txt: one version of every package the image installs (scripts/constraints.py
writes it; the Dockerfile installs it with --no-deps and then runs pip check).

Checked against pyproject.toml: every requirement of the project, of each extra the image
installs and of its build backend is pinned, at a version inside the project's range; and, for
each pinned package installed here at its pinned version (a dev environment installed with
`-c constraints.txt` has all of them), every requirement it has on Linux and CPython 3.11 is
pinned too, inside that package's range. The image's own `pip check` is the last word."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
TEXT = (ROOT / "constraints.txt").read_text()
#: The interpreter and platform constraints.txt was resolved for (the image's: CPython 3.11 on Linux).
PYTHON = re.search(r"^#   resolved with: CPython (3\.11\.\d+) on Linux$", TEXT, re.MULTILINE)
IMAGE = {
    **default_environment(),
    "python_version": "3.11",
    "python_full_version": PYTHON[1] if PYTHON else "",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}
#: The services' needs: PostgreSQL's driver (migrate, workers, api), `ratchet api`, Flower, traces.
NEEDED_EXTRAS = {"postgres", "api", "flower", "otel"}
#: The build backend: installed in the image to build the wheel, not in a dev environment.
BUILD = PROJECT["build-system"]["requires"]


def pins() -> dict[str, Version]:
    lines = [line.strip() for line in TEXT.splitlines() if line.strip() and not line.startswith("#")]
    found: dict[str, Version] = {}
    for line in lines:
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[0-9][^\s;=<>!~]*", line), f"not a pin: {line!r}"
        name, version = line.split("==")
        assert canonicalize_name(name) not in found, f"{name} is pinned twice"
        found[canonicalize_name(name)] = Version(version)
    return found


def extras() -> set[str]:
    (line,) = [line for line in TEXT.splitlines() if line.startswith("#   extras: ")]
    return set(line.removeprefix("#   extras: ").split(","))


def holds(req: Requirement, extra: str = "") -> bool:
    return req.marker is None or req.marker.evaluate({**IMAGE, "extra": extra})


def project_requirements() -> list[Requirement]:
    """What the image asks pip for: the project with its extras, and the build backend."""
    optional = PROJECT["project"]["optional-dependencies"]
    assert extras() >= NEEDED_EXTRAS and extras() <= set(optional), extras()
    texts = [*PROJECT["project"]["dependencies"], *BUILD]
    texts += [t for extra in sorted(extras()) for t in optional[extra]]
    return [req for req in map(Requirement, texts) if holds(req)]


def test_every_line_pins_one_version_and_the_header_says_how_to_regenerate_it() -> None:
    assert len(pins()) > 20
    assert "python3.11 scripts/constraints.py" in TEXT and PYTHON, "the header says how it was made, and with what"
    assert canonicalize_name(PROJECT["project"]["name"]) not in pins()  # the image installs the project's own wheel


def test_the_project_its_extras_and_its_build_backend_are_pinned_inside_their_ranges() -> None:
    pinned = pins()
    for req in project_requirements():
        name = canonicalize_name(req.name)
        assert name in pinned, (
            f"{req} (pyproject.toml) is not in constraints.txt: run python3.11 scripts/constraints.py"
        )
        assert req.specifier.contains(pinned[name], prereleases=True), f"{name}=={pinned[name]} is outside {req}"


def test_every_requirement_of_the_pinned_packages_is_pinned_inside_its_range() -> None:
    pinned, read = pins(), set[str]()
    # (package, extra) pairs to follow: what the project asks for, then what those ask for
    todo = [(canonicalize_name(r.name), extra) for r in project_requirements() for extra in ("", *r.extras)]
    seen: set[tuple[str, str]] = set()
    while todo:
        name, extra = todo.pop()
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        if Version(dist.version) != pinned[name]:
            continue  # installed here at another version: its requirements at the pin are not known here
        read.add(name)
        for req in map(Requirement, dist.requires or []):
            if not holds(req, extra):
                continue
            dep = canonicalize_name(req.name)
            assert dep in pinned, f"{name}=={pinned[name]} needs {req}, which constraints.txt does not pin"
            assert req.specifier.contains(pinned[dep], prereleases=True), f"{dep}=={pinned[dep]}: {name} needs {req}"
            todo += [(dep, e) for e in ("", *req.extras)]
    unread = sorted(set(pinned) - read - {canonicalize_name(r.name) for r in map(Requirement, BUILD)})
    assert len(unread) <= len(pinned) // 4, f"installed here at other versions than their pins: {unread}"
    if not unread:  # the whole graph was read: nothing pinned is left over from an older resolve
        needed = {n for n, _ in seen}
        assert needed >= set(pinned), f"pinned but needed by nothing: {sorted(set(pinned) - needed)}"


def test_the_script_resolves_without_the_callers_pip_configuration(tmp_path: Path) -> None:
    # A machine's own constraints and package sources, in a configuration file and in the
    # environment: the pip the script runs reads none of them (the index URL it keeps)
    spec = importlib.util.spec_from_file_location("constraints_script", ROOT / "scripts" / "constraints.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    config = tmp_path / "pip.conf"
    config.write_text(f"[global]\nconstraint = {tmp_path / 'pins.txt'}\nextra-index-url = https://local.invalid/\n")
    local = {
        "PIP_CONFIG_FILE": str(config),
        "PIP_CONSTRAINT": str(tmp_path / "env-pins.txt"),
        "PIP_FIND_LINKS": str(tmp_path / "wheels"),
        "PIP_INDEX_URL": "https://mirror.invalid/simple",
    }
    env = script.pip_environment({**os.environ, **local})
    said = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], env=env, capture_output=True, text=True, timeout=60
    )
    assert said.returncode == 0, said.stderr
    assert "pins.txt" not in said.stdout and "local.invalid" not in said.stdout and "wheels" not in said.stdout
    assert "mirror.invalid" in said.stdout
