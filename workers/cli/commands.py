"""The `ratchet` command line.

    ratchet demo                                   the seed scenarios on the embedded default
    ratchet migrate                                apply the store's migrations
    ratchet worker --app MODULE [-Q q,..] [-c N] [-P pool] [-B] [any `celery worker` flag]
    ratchet beat [--app MODULE]                    the sweep sent from Celery beat (workers sweep anyway)
    ratchet run AGENT INPUT [--session S] [--run-id ID] ... [--wait | --stream] [--json]
    ratchet continue RUN_ID [--input TEXT] [--fork-key KEY] [--wait] [--json]
    ratchet cancel RUN_ID [--json]
    ratchet show RUN_ID [--log] [--steps] [--json]   a run; --log: what happened to it; --steps: its steps
                                                   (these four and `stream`: workers/cli/run_commands.py)
    ratchet session SESSION_ID [--user-id U] [--json]   a session: its user, state and runs
    ratchet runs [--status S] [--agent A] [--since T] ... [--json]; prune --older-than 30d [--status S];
    delete-session SESSION_ID: list runs, delete old stopped runs, delete a session (workers/cli/stored.py)
    ratchet stream RUN_ID [--after ID] [--json]    follow a run's events (with --stream, `run` does)
    ratchet agents [NAME] [--json]                 the agent catalog: what the workers serve (agent_commands.py)
    ratchet pending [--agent A] [--user-id U] [--json]   what paused runs wait for; approve RUN REQ [--by B],
    reject RUN REQ [--note T], answer RUN REQ (--field K=V | --result T): decide one (decide_commands.py)
    ratchet schedule add AGENT --cron EXPR --input TEXT [--timezone TZ] ... | list | rm ID   agents run on a
                                                   cron schedule (schedule_commands.py)
    ratchet sweep                                  one sweeper pass
    ratchet health [--check C] [--destination NODE] ...   database, broker, workers (workers/health.py)
    ratchet scripted-model [--port N]              the scripted OpenAI-compatible server
    ratchet api --app MODULE [--host H] [--port N] the HTTP API (workers/api/serve.py)
                [--workers N] [--root-path PATH]

Settings come from RATCHET_* variables (see orchestrator/settings.py). An error prints one line
saying what to do (with --json, the HTTP API's error body) and the status says which kind it is:
1 a runtime failure, 2 a usage error (`workers.cli.exits`, and the end of `ratchet --help`).
"""

from __future__ import annotations

import argparse
import logging
import os
import runpy
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from orchestrator import tracing
from orchestrator.errors import ConfigurationError
from orchestrator.settings import Settings
from workers.api.serve import add_api_command
from workers.cli import exits
from workers.cli.agent_commands import add_agents_command
from workers.cli.decide_commands import add_decide_commands
from workers.cli.exits import SIGPIPE_EXIT
from workers.cli.launch import VersionAction
from workers.cli.run_commands import add_run_commands
from workers.cli.schedule_commands import add_schedule_commands
from workers.cli.stored import add_ops_commands
from workers.health import add_health_command
from workers.prometheus import add_metrics_command

if TYPE_CHECKING:
    from _typeshed import SupportsWrite
    from celery import Celery

#: The seed scenarios `ratchet demo` runs: installed from the wheel, the copy it carries as
#: workers/examples/ (pyproject.toml's package-dir); in a source checkout, the repository's examples/.
_PACKAGED = Path(__file__).resolve().parents[1] / "examples"
EXAMPLES = _PACKAGED if _PACKAGED.is_dir() else Path(__file__).resolve().parents[2] / "examples"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `ratchet` command; its exit status (`workers.cli.exits`)."""
    words = list(sys.argv[1:] if argv is None else argv)
    as_json = exits.wants_json(words)
    try:
        args = _parse(words)
    except exits.UsageError as exc:  # printed as text or JSON, and 2
        raise SystemExit(_flushed(exits.report(exc, as_json=as_json) or exits.USAGE)) from None
    except SystemExit as done:  # --help
        raise SystemExit(_flushed(done.code if isinstance(done.code, int) else exits.USAGE)) from None
    except BrokenPipeError:  # --help into a reader that went away
        _discard_stdout()
        return SIGPIPE_EXIT
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    tracing.stamp_log_records()  # a format naming `%(trace_id)s` works from the first line on
    try:
        code = int(args.func(args) or 0)
    except BrokenPipeError:
        _discard_stdout()
        code = SIGPIPE_EXIT
    except KeyboardInterrupt:
        return exits.INTERRUPTED
    except Exception as exc:
        status = exits.report(exc, as_json=as_json)
        if status is None:  # a fault: its traceback
            raise
        code = status
    return _flushed(code)


def _flushed(code: int) -> int:
    """Flush stdout here rather than in the interpreter's flush at exit, which reports a reader
    that went away with a traceback. An error's status says more than the pipe's."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _discard_stdout()
        return code or SIGPIPE_EXIT
    return code


def _discard_stdout() -> None:
    """The reader of stdout went away (`ratchet show RUN_ID | head -1`): nothing to report.
    Point stdout at /dev/null, so that what is still buffered, and any later print, goes
    nowhere instead of failing again."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


class _Parser(argparse.ArgumentParser):
    """argparse's parser, except that a usage error is raised (`exits.UsageError`) for `main` to
    report, as text or JSON, and that help written into a closed pipe raises BrokenPipeError like
    any other output here (argparse drops the error and exits 0)."""

    def error(self, message: str) -> NoReturn:
        raise exits.UsageError(message, prog=self.prog, usage=self.format_usage().rstrip())

    def print_help(self, file: SupportsWrite[str] | None = None) -> None:
        (file or sys.stdout).write(self.format_help())


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The arguments; `ratchet worker` keeps the flags it does not know for `celery worker`."""
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if rest and args.command != "worker":
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.celery_args = rest
    return args


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ratchet", description="Durable LLM agents and teams on Celery.")
    parser.add_argument("--version", action=VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_process_commands(sub)
    add_run_commands(sub)
    add_decide_commands(sub)
    add_ops_commands(sub)
    add_agents_command(sub)
    add_schedule_commands(sub)
    add_health_command(sub)
    parser.epilog, parser.formatter_class = exits.EPILOG, argparse.RawDescriptionHelpFormatter
    return parser


def _add_process_commands(sub: Any) -> None:
    """The commands that start something: the demo, migrations, a worker, beat, a sweep, the scripted model."""
    p = sub.add_parser("demo", help="run the seed scenarios on the embedded default")
    p.add_argument("example", nargs="?", default="tool_error_persistence", help="an example in examples/")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("migrate", help="apply the store's migrations to RATCHET_DATABASE_URL")
    p.set_defaults(func=cmd_migrate)

    about = "Any flag not listed here goes to `celery worker`: --autoscale 10,2, --max-tasks-per-child 100, -O fair"
    # allow_abbrev off: an abbreviation of a Celery flag must reach Celery, not match one of these.
    p = sub.add_parser(
        "worker", help="start a Celery worker that runs Ratchet's tasks", epilog=about, allow_abbrev=False
    )
    p.add_argument(
        "--app", action="append", default=[], metavar="MODULE", help="module defining your agents (repeatable)"
    )
    p.add_argument("-Q", "--queues", help="comma-separated queues (default: model, tools and control)")
    p.add_argument("-c", "--concurrency", type=int, help="worker processes or threads")
    p.add_argument("-P", "--pool", default="prefork", choices=["prefork", "threads", "solo", "gevent", "eventlet"])
    p.add_argument(
        "-B",
        "--beat",
        action="store_true",
        help="also run Celery beat in this worker (recovery needs none: every worker sweeps)",
    )
    p.add_argument("-n", "--hostname", help="node name (default: ratchet-PID@HOST)")
    p.add_argument("-l", "--loglevel", default="INFO")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("beat", help="send the sweep from Celery beat (with RATCHET_WORKER_SWEEPS=false on the workers)")
    p.add_argument("--app", action="append", default=[], metavar="MODULE")
    p.add_argument("-l", "--loglevel", default="INFO")
    p.set_defaults(func=cmd_beat)

    p = sub.add_parser("scripted-model", help="serve the scripted OpenAI-compatible model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--config", help="a ScriptConfig as JSON, or @file")
    p.set_defaults(func=cmd_scripted_model)
    add_api_command(sub)
    add_metrics_command(sub)


def _import_apps(modules: Sequence[str]) -> list[str]:
    """Import the modules that define the agents (--app, else RATCHET_APP); return their names."""
    from workers.celery.app import import_apps

    return import_apps(modules)


def cmd_demo(args: argparse.Namespace) -> int:
    path = EXAMPLES / f"{args.example}.py"
    if not path.exists():
        names = ", ".join(sorted(p.stem for p in EXAMPLES.glob("*.py"))) or "none"
        raise ConfigurationError(f"no example {args.example!r} in {EXAMPLES.name}/ (known: {names})")
    runpy.run_path(str(path), run_name="__main__")
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    from orchestrator.store.database import upgrade

    print(f"migrated {upgrade(Settings.from_env().database_url)}")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    modules = _import_apps(args.app)
    if not modules:
        raise ConfigurationError(
            "ratchet worker needs --app MODULE (or RATCHET_APP): the module that defines your agents"
        )
    from workers.celery.app import create_app

    settings = Settings.from_env()
    app = create_app(settings)
    app.conf.imports = modules  # what each pool process finds imported (`workers.celery.worker`)
    queues = args.queues or ",".join([settings.model_queue, settings.tools_queue, settings.control_queue])
    # Task events: `worker_send_task_events` (RATCHET_TASK_EVENTS), set by create_app, as -E would
    argv = ["worker", "-Q", queues, "-P", args.pool, "-l", args.loglevel]
    if args.concurrency:
        argv += ["-c", str(args.concurrency)]
    # Celery's default node name (celery@host) collides when two workers share a host; Flower and
    # control commands then see one worker. The pid keeps names unique; containers differ by host.
    argv += ["-n", args.hostname or f"ratchet-{os.getpid()}@%h", *args.celery_args]
    if not args.beat:
        return _celery(app, argv)
    with _schedule_file() as schedule:
        return _celery(app, [*argv, "-B", "-s", schedule])


def _celery(app: Celery, argv: list[str]) -> int:
    """Run a Celery command (worker, beat) in this process and return its exit status.

    As `app.start` does, except that `app.start` drops the status, so a worker that stopped on an
    unrecoverable error exited 0. A reader of stdout that is gone when Celery prints its banner
    (`ratchet worker | head -1`) ends the command as it ends every other one: quietly, with 141,
    not with an 'Unrecoverable error' traceback. Celery's later output goes to its log (stderr).
    """
    from celery.apps.beat import Beat
    from celery.bin.celery import celery
    from click import ClickException

    from workers.celery.worker import Worker

    class RatchetWorker(Worker):
        def emit_banner(self) -> None:
            with _stdout_reader_gone_exits():
                super().emit_banner()

    class RatchetBeat(Beat):  # type: ignore[misc]
        def run(self) -> None:  # prints its banner first, then runs the schedule
            with _stdout_reader_gone_exits():
                super().run()

        def setup_logging(self, colorize: bool | None = None) -> None:
            with _stdout_reader_gone_exits():  # the banner now, as the worker's, not at exit
                sys.stdout.flush()
            super().setup_logging(colorize)

    app.Worker = app.subclass_with_self(RatchetWorker)
    app.Beat = app.subclass_with_self(RatchetBeat)
    celery.params[0].default = app  # the command's --app, as app.start sets it
    try:
        return int(celery.main(args=argv, standalone_mode=False) or 0)
    except ClickException as exc:  # a flag `celery worker` does not take: one line, as ours
        raise ConfigurationError(f"celery {argv[0]}: {exc.format_message()}") from None
    finally:
        celery.params[0].default = None


@contextmanager
def _stdout_reader_gone_exits() -> Iterator[None]:
    """Inside Celery's own catch-all: end the command quietly, with 141, if stdout's reader left."""
    try:
        yield
    except BrokenPipeError:
        _discard_stdout()
        raise SystemExit(SIGPIPE_EXIT) from None


def cmd_beat(args: argparse.Namespace) -> int:
    _import_apps(args.app)
    from workers.celery.app import create_app

    app = create_app(Settings.from_env())
    with _schedule_file() as schedule:
        return _celery(app, ["beat", "-l", args.loglevel, "-s", schedule])


@contextmanager
def _schedule_file() -> Iterator[str]:
    """Where beat keeps its schedule: a temp folder removed afterwards. The file only remembers
    when the sweep last ran, and the working directory may be read-only or a user's project."""
    with tempfile.TemporaryDirectory(prefix="ratchet-beat-") as folder:
        yield str(Path(folder) / "celerybeat-schedule")


def cmd_scripted_model(args: argparse.Namespace) -> int:
    from orchestrator.testing.server import main as serve

    argv = ["--host", args.host, "--port", str(args.port)]
    if args.config:
        argv += ["--config", args.config]
    serve(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
