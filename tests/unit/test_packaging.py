"""pyproject.toml lists its packages (one, `ratchet demo`'s examples, is not a folder of its own):
every package folder must be on the list, or the wheel goes without it.
tests/integration/test_wheel_install.py builds the wheel and looks inside."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def package_folders() -> set[str]:
    """Every folder of orchestrator/ and workers/ holding a module or a file the package ships."""
    return {
        ".".join(folder.relative_to(ROOT).parts)
        for top in ("orchestrator", "workers")
        for folder in [ROOT / top, *(ROOT / top).rglob("*")]
        if folder.is_dir() and folder.name != "__pycache__" and any(p.is_file() for p in folder.iterdir())
    }


def test_every_package_folder_is_listed_in_pyproject() -> None:
    assert package_folders() - set(SETUPTOOLS["packages"]) == set()


def test_every_listed_package_is_a_folder_or_mapped_to_one() -> None:
    for package in SETUPTOOLS["packages"]:
        folder = SETUPTOOLS.get("package-dir", {}).get(package, package.replace(".", "/"))
        assert (ROOT / folder).is_dir(), package
