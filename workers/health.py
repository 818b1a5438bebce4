"""`ratchet health`: is the deployment able to run runs? Exit 0 when every check passes, else 1
with one line per check saying what it found or what to do.

    ratchet health [--check database,broker,workers,sweeper,beat] [--destination NODE] [--queue Q]
                   [--workers N] [--timeout S] [--max-age S] [--json]

- database: a query, and the migrations at the latest revision (else: run `ratchet migrate`).
- broker: a connection and a command (Redis: PING); on Redis, how many messages wait on each
  queue, for information: the sum of its ten priority lists (`workers.celery.broker`).
- workers: Celery's `active_queues` control command, broadcast through the broker: a worker
  answers from its main process (so also while its pool is busy) with the queues it consumes.
  Without --destination: at least --workers N answer and every --queue (default: the model,
  tools and control queues) has a consumer. With --destination NODE (`%h` is this host's name,
  as in `ratchet worker -n`): that worker answers, and consumes each --queue given.
- sweeper (not in the default): a sweeper (a worker's, or beat's sweep task) took or renewed the
  fleet's sweep lease within --max-age seconds (default three sweep intervals, at least 30 s), as
  the database records it (`ratchet_leases`, `orchestrator.sweeping`): recovery is running.
- beat (not in the default): beat sent the sweep within --max-age seconds (same default), as
  recorded in Redis (`workers.celery.beat`); for a deployment that runs `ratchet beat`.

Each service of compose.yaml checks its own part: a worker `--check workers --destination
NAME@%h`, migrate `--check database` (a `ratchet beat` of your own: `--check beat`); `ratchet
health` alone checks the whole. Python: `check_health(settings, ...)` returns the same `HealthReport`.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import validation
from orchestrator.errors import ConfigurationError, InvalidInputError
from orchestrator.settings import Settings

CHECKS = ("database", "broker", "workers", "sweeper", "beat")
DEFAULT_CHECKS = ("database", "broker", "workers")
#: The least --max-age of the sweeper's and beat's checks, whatever RATCHET_SWEEP_SECONDS says.
MIN_BEAT_AGE = 30.0
#: Redis keeps a queue as ten lists, priorities 0 (the plain name) to 9 (`workers.celery.broker`).
PRIORITY_LISTS = 10


def _safe(url: str) -> str:
    """A broker URL with its password masked."""
    from kombu.utils.url import maybe_sanitize_url

    return str(maybe_sanitize_url(url))


@dataclass
class Check:
    """One check's outcome: what it found (ok) or what failed and what to do (not ok)."""

    name: str
    ok: bool
    detail: str
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class HealthReport:
    checks: list[Check]

    @property
    def healthy(self) -> bool:
        return all(c.ok for c in self.checks)


def check_health(
    settings: Settings,
    *,
    checks: Sequence[str] = DEFAULT_CHECKS,
    destinations: Sequence[str] = (),
    queues: Sequence[str] | None = None,
    workers: int = 1,
    timeout: float = 2.0,
    max_age: float | None = None,
) -> HealthReport:
    """Run the checks named (see the module docstring); each is bounded by about `timeout`."""
    from celery.utils.nodenames import host_format

    unknown = sorted(set(checks) - set(CHECKS))
    if unknown:
        raise InvalidInputError(f"unknown check(s) {', '.join(unknown)}; known: {', '.join(CHECKS)}")
    if timeout <= 0 or workers < 0:
        raise InvalidInputError(f"the timeout ({timeout}) must be positive and workers ({workers}) at least 0")
    queues = None if queues is None else [validation.queue_name(q) for q in queues]
    destinations = [validation.queue_name(d, what="destination") for d in destinations]
    default_queues = [settings.model_queue, settings.tools_queue, settings.control_queue]
    needed = list(queues) if queues is not None else ([] if destinations else default_queues)
    nodes = [host_format(d) for d in destinations]
    counted = [*default_queues, *(q for q in needed if q not in default_queues)]
    oldest = max_age if max_age is not None else max(3 * settings.sweep_seconds, MIN_BEAT_AGE)
    runs: dict[str, Callable[[], Check]] = {
        "database": lambda: _database(settings, timeout),
        "broker": lambda: _broker(settings, timeout, counted),
        "workers": lambda: _workers(settings, timeout, nodes, needed, workers),
        "sweeper": lambda: _sweeper(settings, timeout, oldest),
        "beat": lambda: _beat(settings, oldest),
    }
    done: list[Check] = []
    for name in [c for c in CHECKS if c in checks]:
        if name == "workers" and any(c.name == "broker" and not c.ok for c in done):
            done.append(Check(name, False, "not checked: the broker did not answer"))
            continue
        done.append(_bounded(name, runs[name], timeout))
    return HealthReport(done)


def _bounded(name: str, run: Callable[[], Check], timeout: float) -> Check:
    """`run()` in a thread, given up on after its own timeouts should have ended it: a check must
    answer, or a compose healthcheck that waits on it reports nothing useful."""
    out: list[Check] = []

    def target() -> None:
        try:
            out.append(run())
        except Exception as exc:
            out.append(Check(name, False, f"{type(exc).__name__}: {_line(exc)}"))

    thread = threading.Thread(target=target, name=f"ratchet-health-{name}", daemon=True)
    thread.start()
    thread.join(3 * timeout + 5)
    return out[0] if out else Check(name, False, f"no answer within {3 * timeout + 5:.0f}s (it hangs)")


def _line(exc: BaseException) -> str:
    """An error's first line (a driver's message may go on with hints and SQL)."""
    cause = getattr(exc, "orig", None) or exc
    return (str(cause).strip().splitlines() or [type(cause).__name__])[0].rstrip(".")


def _database(settings: Settings, timeout: float) -> Check:
    from orchestrator.store import database

    shown = database.shown_url(settings.database_url)
    path = database.sqlite_file(settings.database_url)
    if path is not None and not Path(path).exists():
        return Check(
            "database", False, f"no SQLite database at {path}: run `ratchet migrate`, or fix RATCHET_DATABASE_URL"
        )
    try:
        current, head = database.probe(settings.database_url, timeout=timeout)
    except ConfigurationError:
        raise  # a URL Ratchet cannot use: said as that, not as a database that is down
    except Exception as exc:
        return Check(
            "database",
            False,
            f"cannot query {shown}: {_line(exc)}; is the database up, and RATCHET_DATABASE_URL right?",
        )
    if current is None:
        return Check("database", False, f"{shown} has no Ratchet tables: run `ratchet migrate`")
    if current != head:
        return Check(
            "database",
            False,
            f"{shown} is at migration {current}, this Ratchet's latest is {head}: run "
            "`ratchet migrate` (or, if the database is the newer one, upgrade Ratchet here)",
        )
    return Check("database", True, f"{shown} at migration {head} (the latest)", {"revision": head})


def _broker(settings: Settings, timeout: float, queues: Sequence[str]) -> Check:
    from workers.celery.beat import broker_redis

    shown = _safe(settings.broker_url)
    fix = "is it up, and RATCHET_BROKER_URL right?"
    client = broker_redis(settings, timeout)
    if client is None:
        from workers.celery.app import create_app

        try:
            with create_app(settings).connection_for_write() as conn:
                conn.ensure_connection(max_retries=1, interval_start=0, timeout=timeout)
        except Exception as exc:
            return Check("broker", False, f"cannot connect to {shown}: {_line(exc)}; {fix}")
        return Check("broker", True, f"{shown} connected")
    try:
        with client:
            client.ping()
            waiting = _waiting(client, queues)
    except Exception as exc:
        return Check("broker", False, f"cannot reach Redis at {shown}: {_line(exc)}; {fix}")
    counts = ", ".join(f"{q} {n}" for q, n in waiting.items())
    return Check("broker", True, f"{shown} answers PING; waiting: {counts}", {"waiting": waiting})


def _waiting(client: Any, queues: Sequence[str]) -> dict[str, int]:
    """Messages waiting on each queue: the lengths of its ten priority lists, summed."""
    from workers.celery.broker import Channel

    pipe = client.pipeline(transaction=False)
    for queue in queues:
        pipe.llen(queue)
        for step in range(1, PRIORITY_LISTS):
            pipe.llen(f"{queue}{Channel.sep}{step}")
    lengths = pipe.execute()
    return {q: sum(lengths[i * PRIORITY_LISTS : (i + 1) * PRIORITY_LISTS]) for i, q in enumerate(queues)}


def _workers(settings: Settings, timeout: float, nodes: Sequence[str], queues: Sequence[str], least: int) -> Check:
    from workers.celery.app import create_app

    app = create_app(settings)
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, timeout=timeout)
            replies = app.control.inspect(destination=list(nodes) or None, timeout=timeout, connection=conn)
            answers: dict[str, Any] = replies.active_queues() or {}
    except Exception as exc:
        return Check("workers", False, f"cannot ask the workers through {_safe(settings.broker_url)}: {_line(exc)}")
    finally:
        app.close()
    consumers: dict[str, list[str]] = {}
    for node, consumed in sorted(answers.items()):
        for queue in consumed or ():
            consumers.setdefault(str(queue.get("name")), []).append(node)
    info = {"answered": sorted(answers), "consumers": consumers}
    missing_nodes = [n for n in nodes if n not in answers]
    if missing_nodes:
        return Check(
            "workers",
            False,
            f"worker {', '.join(missing_nodes)} did not answer within {timeout:g}s: is "
            "it running, on this RATCHET_BROKER_URL, with that node name (-n)?",
            info,
        )
    if not nodes and len(answers) < least:
        found = f"{len(answers)} answered ({', '.join(sorted(answers))})" if answers else "no worker answered"
        return Check(
            "workers",
            False,
            f"{found} within {timeout:g}s, {least} needed: start workers (`ratchet worker "
            "--app MODULE`) on this RATCHET_BROKER_URL",
            info,
        )
    idle = [q for q in queues if q not in consumers]
    if idle:
        return Check(
            "workers",
            False,
            f"no worker consumes {', '.join(idle)}: steps sent there wait; start one "
            f"with `ratchet worker --app MODULE -Q {','.join(idle)}`",
            info,
        )
    return Check("workers", True, f"{len(answers)} answered: {', '.join(sorted(answers))}", info)


def _sweeper(settings: Settings, timeout: float, max_age: float) -> Check:
    from orchestrator.store import Store, database
    from orchestrator.sweeping import SWEEP_LEASE

    path = database.sqlite_file(settings.database_url)
    if path is not None and not Path(path).exists():
        return Check("sweeper", False, f"no SQLite database at {path}: run `ratchet migrate`")
    store = Store(database.checking_engine(settings.database_url, timeout=timeout))
    try:
        lease = store.lease(SWEEP_LEASE)
        now = store.clock()
    except Exception as exc:
        return Check("sweeper", False, f"cannot read the sweep lease: {_line(exc)}; is the database migrated?")
    finally:
        store.dispose()
    start = "start a worker (`ratchet worker`, which sweeps unless RATCHET_WORKER_SWEEPS=false) or `ratchet beat`"
    if lease is None:
        return Check("sweeper", False, f"no sweeper has run on this database: {start}")
    age = max(0.0, now - lease.renewed_at)
    info = {"age": age, "owner": lease.owner, "held": lease.held(now)}
    if age > max_age:
        detail = (
            f"the sweeper last ran {age:.0f}s ago (more than {max_age:g}s; it runs every {settings.sweep_seconds:g}s, "
            f"last by {lease.owner}): {start}"
        )
        return Check("sweeper", False, detail, info)
    return Check("sweeper", True, f"swept {age:.1f}s ago by {lease.owner}", info)


def _beat(settings: Settings, max_age: float) -> Check:
    from workers.celery.beat import broker_redis, last_sweep_sent

    client = broker_redis(settings)
    if client is None:
        return Check(
            "beat",
            False,
            f"beat's sweeps are recorded on a Redis broker only, not on "
            f"{_safe(settings.broker_url)}: read beat's log instead",
        )
    try:
        with client:
            sent = last_sweep_sent(client, settings)
    except Exception as exc:
        return Check("beat", False, f"cannot read beat's record in Redis: {_line(exc)}")
    if sent is None:
        return Check(
            "beat",
            False,
            "beat has sent no sweep on this broker: start `ratchet beat` (one per "
            "deployment), and give it RATCHET_SWEEP_SECONDS to send the first",
        )
    age = max(0.0, time.time() - sent)
    if age > max_age:
        return Check(
            "beat",
            False,
            f"beat last sent the sweep {age:.0f}s ago (more than {max_age:g}s; it sends one "
            f"every {settings.sweep_seconds:g}s): is `ratchet beat` running?",
            {"age": age},
        )
    return Check("beat", True, f"sent the sweep {age:.1f}s ago", {"age": age})


def add_health_command(sub: Any) -> None:
    """Add `ratchet health` to the subcommands."""
    p = sub.add_parser("health", help="check the database, the broker and that workers answer (exit 1 if not)")
    p.add_argument(
        "--check",
        action="append",
        metavar="NAME",
        help=f"which checks ({', '.join(CHECKS)}; repeat, or comma-separated; default: {', '.join(DEFAULT_CHECKS)})",
    )
    p.add_argument(
        "--destination",
        action="append",
        default=[],
        metavar="NODE",
        help="only this worker must answer (a node name as given to -n; %%h is this host's name)",
    )
    p.add_argument(
        "--queue",
        action="append",
        metavar="QUEUE",
        help="a queue that must have a consumer (default: "
        "the model, tools and control queues, or none with --destination)",
    )
    p.add_argument("--workers", type=int, default=1, metavar="N", help="at least this many workers answer")
    p.add_argument("--timeout", type=float, default=2.0, metavar="S", help="seconds each check waits (default 2)")
    p.add_argument("--max-age", type=float, metavar="S", help="sweeper, beat: the oldest last sweep that passes")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_health)


def cmd_health(args: argparse.Namespace) -> int:
    def split(values: Sequence[str] | None) -> list[str] | None:
        return None if values is None else [v.strip() for value in values for v in value.split(",") if v.strip()]

    report = check_health(
        Settings.from_env(),
        checks=split(args.check) or DEFAULT_CHECKS,
        destinations=args.destination,
        queues=split(args.queue),
        workers=args.workers,
        timeout=args.timeout,
        max_age=args.max_age,
    )
    if args.json:
        print(json.dumps({"healthy": report.healthy, "checks": [asdict(c) for c in report.checks]}, indent=2))
    else:
        width = max(len(c.name) for c in report.checks)
        for c in report.checks:
            print(f"{c.name:<{width}}  {'ok' if c.ok else 'FAILED':<6}  {c.detail}")
    return 0 if report.healthy else 1
