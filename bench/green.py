"""`python -m bench.green worker --app bench.agents -P gevent ...`: `ratchet worker` with the pool's
monkey patches applied first, as `celery worker -P gevent` applies them (`celery.__main__`)
before it imports anything else. `ratchet worker -P gevent` does not, and its worker then takes
tasks and never runs them (bench/FINDINGS.md, "gevent"); this is how the benchmark runs Ratchet
on gevent all the same."""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from celery import maybe_patch_concurrency

    maybe_patch_concurrency(sys.argv)
    from workers.cli import main

    sys.exit(main(sys.argv[1:]))
