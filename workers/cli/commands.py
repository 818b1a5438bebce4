"""The `ratchet` command line.

    ratchet demo                                   the seed scenarios on the embedded default
    ratchet migrate                                apply the store's migrations
    ratchet worker --app MODULE [-Q q,..] [-c N] [-P pool] [-B] [any `celery worker` flag]
    ratchet beat [--app MODULE]                    the sweep sent from Celery beat (workers sweep anyway)
    ratchet run AGENT INPUT [--session S] [--run-id ID] [--user-id U] [--session-state JSON]
                [--priority 0-9] [--wait | --stream] [--timeout T]
    ratchet continue RUN_ID [--input TEXT] [--fork-key KEY] [--wait]
    ratchet cancel RUN_ID
    ratchet show RUN_ID [--log] [--steps] [--json]   a run; --log: what happened to it; --steps: its steps
    ratchet session SESSION_ID [--user-id U] [--json]   a session: its user, state and runs
    ratchet runs [--status S] [--agent A] [--since T] ... [--json]; prune --older-than 30d [--status S];
    delete-session SESSION_ID: list runs, delete old stopped runs, delete a session (workers/cli/stored.py)
    ratchet stream RUN_ID [--after ID] [--json]    follow a run's events (with --stream, `run` does)
    ratchet agents [NAME] [--json]                 the agent catalog: what the workers serve (agent_commands.py)
    ratchet sweep                                  one sweeper pass
    ratchet health [--check C] [--destination NODE] ...   database, broker, workers (workers/health.py)
    ratchet scripted-model [--port N]              the scripted OpenAI-compatible server
    ratchet api --app MODULE [--host H] [--port N] the HTTP API (workers/api/serve.py)
                [--workers N] [--root-path PATH]

Settings come from RATCHET_* variables (see orchestrator/settings.py). Errors print one line
saying what to do and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import runpy
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.client import Client
from orchestrator.errors import ConfigurationError, RatchetError
from orchestrator.settings import Settings
from workers.api.serve import add_api_command
from workers.cli.agent_commands import add_agents_command
from workers.cli.render import jsonable, print_events, show
from workers.cli.session_state import add_session_command, state_argument
from workers.cli.stored import add_ops_commands
from workers.health import add_health_command
from workers.prometheus import add_metrics_command

if TYPE_CHECKING:
    from _typeshed import SupportsWrite
    from celery import Celery

#: The repository's examples/ (workers/cli/commands.py is two folders below it).
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
#: The exit status when stdout's reader went away: what a shell reports for a command ended by SIGPIPE.
SIGPIPE_EXIT = 141


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `ratchet` command."""
    try:
        args = _parse(argv)
    except SystemExit as done:  # --help, or a usage error argparse has printed
        raise SystemExit(_flushed(done.code if isinstance(done.code, int) else 2)) from None
    except BrokenPipeError:  # --help into a reader that went away
        _discard_stdout()
        return SIGPIPE_EXIT
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        code = int(args.func(args) or 0)
    except RatchetError as exc:
        print(f"ratchet: error: {_printable(str(exc))}", file=sys.stderr)
        code = 2
    except BrokenPipeError:
        _discard_stdout()
        code = SIGPIPE_EXIT
    except KeyboardInterrupt:
        return 130
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


def _printable(text: str) -> str:
    """One line that any terminal encoding can print: newlines folded, and characters the
    encoding cannot take (a lone surrogate from invalid UTF-8 in argv) escaped."""
    encoding = getattr(sys.stderr, "encoding", None) or "utf-8"
    line = " ".join(text.splitlines())
    return line.encode(encoding, "backslashreplace").decode(encoding, "replace")


class _Parser(argparse.ArgumentParser):
    """argparse's parser, except that help written into a closed pipe raises BrokenPipeError
    like any other output here (argparse drops the error and exits 0)."""

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
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_process_commands(sub)
    _add_run_commands(sub)
    add_ops_commands(sub)
    add_agents_command(sub)
    add_health_command(sub)
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


def _add_run_commands(sub: Any) -> None:
    """The commands on runs: start, continue, cancel, show."""
    p = sub.add_parser("run", help="start a run of an agent or team by name")
    p.add_argument("agent")
    p.add_argument("input")
    p.add_argument("--session", help="session id (default: a new one); it takes runs only for its first run's user")
    p.add_argument(
        "--run-id", help="your own id for the run: running again with it prints the same run instead of a new one"
    )
    p.add_argument(
        "--user-id", help="who the run is for (with RATCHET_MAX_RUNS_PER_KEY, its runs in progress are limited)"
    )
    p.add_argument(
        "--session-state",
        type=state_argument,
        metavar="JSON",
        help="a JSON object merged over the session's state, key by key",
    )
    p.add_argument("--wait", action="store_true", help="wait for the run to stop and show it")
    p.add_argument("--stream", action="store_true", help="stream the run: print its events as they happen")
    p.add_argument("--timeout", type=float, help="seconds to wait with --wait or --stream")
    p.add_argument("--priority", type=int, metavar="0-9", help="the run's priority, higher first (default: none, as 0)")
    p.add_argument("--app", action="append", default=[], metavar="MODULE", help="import these modules first")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("continue", help="continue a run (ERROR resumes in place, COMPLETED forks)")
    p.add_argument("run_id")
    p.add_argument("--input", help="a new user message to add first")
    p.add_argument(
        "--fork-key", help="a COMPLETED run forks once per key (default: the input); another key forks again"
    )
    p.add_argument("--wait", action="store_true")
    p.add_argument("--timeout", type=float)
    p.set_defaults(func=cmd_continue)

    p = sub.add_parser("cancel", help="cancel a run that has not finished")
    p.add_argument("run_id")
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser("show", help="show a run: status, error, messages, member runs")
    p.add_argument("run_id")
    p.add_argument("--log", action="store_true", help="and each run's log: retries, errors, recoveries, fences")
    p.add_argument("--steps", action="store_true", help="and each run's steps: task, attempt, duration, tokens")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_show)

    add_session_command(sub)

    p = sub.add_parser("stream", help="print a run's events as they happen, until it stops")
    p.add_argument("run_id")
    p.add_argument("--after", metavar="ID", help="start after this event id (the last one you saw)")
    p.add_argument("--json", action="store_true", help="one JSON object per event and line")
    p.add_argument("--timeout", type=float, help="give up after this many seconds (the run goes on)")
    p.set_defaults(func=cmd_stream)


def _import_apps(modules: Sequence[str]) -> list[str]:
    """Import the modules that define the agents (--app, else RATCHET_APP); return their names."""
    from workers.celery.app import import_apps

    return import_apps(modules)


def cmd_demo(args: argparse.Namespace) -> int:
    path = EXAMPLES / f"{args.example}.py"
    if not path.exists():
        names = ", ".join(sorted(p.stem for p in EXAMPLES.glob("*.py"))) or "none"
        raise ConfigurationError(f"no example {args.example!r} in {EXAMPLES.name}/ (known: {names})")
    sys.path.insert(0, str(EXAMPLES.parent))
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


def cmd_run(args: argparse.Namespace) -> int:
    _import_apps(args.app)
    client = Client()
    handle = client.start(
        args.agent,
        input=args.input,
        session_id=args.session,
        run_id=args.run_id,
        stream=args.stream,
        user_id=args.user_id,
        session_state=args.session_state,
        priority=args.priority,
    )
    print(handle.run_id, flush=args.stream)  # before the events it streams
    if args.stream:
        return print_events(client, handle.run_id, timeout=args.timeout)
    if args.wait:
        return show(handle.wait(args.timeout))
    return 0


def cmd_continue(args: argparse.Namespace) -> int:
    handle = Client().continue_run(args.run_id, input=args.input, fork_key=args.fork_key)
    print(handle.run_id)
    if args.wait:
        return show(handle.wait(args.timeout))
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    out = Client().cancel(args.run_id)
    print(f"{out.run_id} {out.status}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    client = Client()
    out = client.get_run(args.run_id)
    log, steps = client.get_log if args.log else None, client.get_steps if args.steps else None
    if args.json:
        print(json.dumps(jsonable(out, log, steps), indent=2, default=str))
        return 0
    return show(out, log=log, steps=steps)


def cmd_stream(args: argparse.Namespace) -> int:
    return print_events(Client(), args.run_id, after=args.after, as_json=args.json, timeout=args.timeout)


def cmd_scripted_model(args: argparse.Namespace) -> int:
    from orchestrator.testing.server import main as serve

    argv = ["--host", args.host, "--port", str(args.port)]
    if args.config:
        argv += ["--config", args.config]
    serve(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
