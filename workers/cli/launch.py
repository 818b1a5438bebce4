"""The `ratchet` command's entry point: a worker on the gevent or eventlet pool is patched first.

Those pools need the standard library monkey-patched before anything imports it (sockets,
threading, the database and Redis drivers), as `celery worker -P gevent` does in its own entry
point. `ratchet`'s commands import the whole package, so the patch has to come before them:
without it the pool's greenlets share unpatched, blocking sockets and the worker takes no step.

`ratchet --version` names the distribution and its installed version, read from the installed
metadata: alone, before anything else is imported (the whole package takes seconds to import);
with other words, from the command's top parser (`VersionAction`), which --help lists.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

#: The name Ratchet is installed by (`pip install ratchet-agents`); `ratchet` on the public index
#: is an unrelated project.
DISTRIBUTION = "ratchet-agents"


def main(argv: Sequence[str] | None = None) -> int:
    """Patch for `ratchet worker -P gevent|eventlet`, then run the command."""
    words = list(sys.argv[1:] if argv is None else argv)
    if words == ["--version"]:  # needs nothing of the package: answered before it is imported
        print(version_line())
        return 0
    if words[:1] == ["worker"]:
        from celery import maybe_patch_concurrency

        maybe_patch_concurrency(["ratchet", *_spaced(words)])
    from workers.cli.commands import main as run

    return run(argv)


def _spaced(words: list[str]) -> list[str]:
    """`-Pgevent` as `-P gevent`: Celery finds `-P gevent`, `--pool gevent` and `--pool=gevent`,
    and argparse (the command's parser) takes `-Pgevent` too."""
    out: list[str] = []
    for word in words:
        out += ["-P", word[2:]] if word.startswith("-P") and len(word) > 2 else [word]
    return out


def version_line() -> str:
    """The distribution's name and installed version; from a source tree where it is not
    installed (its folder on PYTHONPATH), that it is not, and where it runs from."""
    try:
        return f"{DISTRIBUTION} {metadata.version(DISTRIBUTION)}"
    except metadata.PackageNotFoundError:
        source = Path(__file__).resolve().parents[2]
        return (
            f"{DISTRIBUTION}, not installed: running from the source tree at {source} "
            "(`pip install -e .` there installs it)"
        )


class VersionAction(argparse.Action):
    """`--version`: print `version_line()` and exit 0, as argparse's own version action does,
    except that the version is looked up only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        kwargs.setdefault("help", "print the distribution's name and version, then exit")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(version_line())
        parser.exit()
