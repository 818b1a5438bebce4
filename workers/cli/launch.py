"""The `ratchet` command's entry point: a worker on the gevent or eventlet pool is patched first.

Those pools need the standard library monkey-patched before anything imports it (sockets,
threading, the database and Redis drivers), as `celery worker -P gevent` does in its own entry
point. `ratchet`'s commands import the whole package, so the patch has to come before them:
without it the pool's greenlets share unpatched, blocking sockets and the worker takes no step.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Patch for `ratchet worker -P gevent|eventlet`, then run the command."""
    words = list(sys.argv[1:] if argv is None else argv)
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
