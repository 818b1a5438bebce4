"""The commands on runs: start, continue, cancel, show and follow one, each calling `Client` as
Python code does.

    ratchet run AGENT INPUT [--session S] [--run-id ID] [--user-id U] [--session-state JSON]
                [--priority 0-9] [--webhook URL] [--run-timeout T] [--wait | --stream] [--timeout T]
                [--app MODULE] [--json]
    ratchet continue RUN_ID [--input TEXT] [--fork-key KEY] [--run-timeout T]
                            [--accept-definition HASH|AGENT=HASH] [--wait] [--timeout T] [--json]
    ratchet cancel RUN_ID [--json]
    ratchet continue|cancel RUN_ID RUN_ID ... | --status S [filters]   a batch (`batch_commands.py`)
    ratchet show RUN_ID [--log] [--steps] [--json]
    ratchet stream RUN_ID [--after ID] [--json] [--timeout T]

With --json each prints what the HTTP API answers for the same thing: the run as `POST /runs`,
`POST /runs/{id}/continue`, `POST /runs/{id}/cancel` and `GET /runs/{id}` answer it (with --wait:
as `GET /runs/{id}/wait` answers a run that has stopped), and with --stream one event a line, as
`ratchet stream --json` prints them.

`ratchet run` refuses an agent that neither the modules it imported (--app, RATCHET_APP) nor the
agent catalog (what workers served: `orchestrator.catalog.known`) know, before it writes
anything, as `POST /runs` answers 404: such a run would wait for a worker that never comes, or
fail on one that does not know it.

`--run-timeout` is the run's deadline (seconds, or "90s", "30m", "2h", "7d"): past it the run is
stopped in ERROR with RunTimeoutError. `--timeout` only bounds the wait of --wait or --stream. A
start refused because the agent's (or the user's) runs already wait (QueueFullError) exits 75
(EX_TEMPFAIL: try again later), nothing written.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from orchestrator import catalog, validation
from orchestrator.client import Client, RunHandle
from orchestrator.errors import AgentNotFoundError, InvalidInputError
from orchestrator.idempotency import StartRequest
from orchestrator.run import RunOutput
from orchestrator.status import RunStatus
from workers.cli.batch_commands import add_batch_arguments, cmd_batch, is_batch
from workers.cli.exits import FAILURE, OK, about
from workers.cli.render import jsonable, print_events, show
from workers.cli.session_state import add_session_command, state_argument

JSON_HELP = "print JSON: the run as the HTTP API answers it"
RUN_TIMEOUT_HELP = (
    'the run\'s deadline: seconds, or "30m", "2h", "7d" (default: its agent\'s run_timeout); past it the run is '
    "stopped in ERROR with RunTimeoutError, PAUSED time included"
)


def add_run_commands(sub: Any) -> None:
    """Add `ratchet run`, `continue`, `cancel`, `show`, `session` and `stream` to the subcommands."""
    _add_run(sub)
    _add_continue(sub)

    p = sub.add_parser("cancel", help="cancel a run that has not finished, or a batch of runs")
    add_batch_arguments(p, done="cancelled")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser("show", help="show a run: status, error, messages, member runs")
    p.add_argument("run_id")
    p.add_argument("--log", action="store_true", help="and each run's log: retries, errors, recoveries, fences")
    p.add_argument("--steps", action="store_true", help="and each run's steps: task, attempt, duration, tokens")
    p.add_argument("--json", action="store_true", help=f"{JSON_HELP} (with --log, --steps: and those)")
    p.set_defaults(func=cmd_show)

    add_session_command(sub)

    p = sub.add_parser("stream", help="print a run's events as they happen, until it stops")
    p.add_argument("run_id")
    p.add_argument("--after", metavar="ID", help="start after this event id (the last one you saw)")
    p.add_argument("--json", action="store_true", help="one JSON object per event and line")
    p.add_argument("--timeout", type=float, help="give up after this many seconds (the run goes on)")
    p.set_defaults(func=cmd_stream)


def _add_run(sub: Any) -> None:
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
    p.add_argument("--webhook", metavar="URL", help="POST a signed summary to URL each time the run stops")
    p.add_argument("--run-timeout", metavar="T", help=RUN_TIMEOUT_HELP)
    p.add_argument("--app", action="append", default=[], metavar="MODULE", help="import these modules first")
    p.add_argument("--json", action="store_true", help=f"{JSON_HELP} (with --stream: one event a line)")
    p.set_defaults(func=cmd_run)


def _add_continue(sub: Any) -> None:
    """Add `ratchet continue`."""
    p = sub.add_parser("continue", help="continue a run (ERROR in place, COMPLETED forks), or a batch in place")
    add_batch_arguments(p, done="continued in place")
    p.add_argument("--input", help="a new user message to add first")
    p.add_argument(
        "--fork-key", help="a COMPLETED run forks once per key (default: the input); another key forks again"
    )
    p.add_argument(
        "--run-timeout",
        metavar="T",
        help="a new deadline, from now, for the run that goes on (default: a deadline that passed is given again)",
    )
    p.add_argument(
        "--accept-definition",
        action="append",
        metavar="HASH|AGENT=HASH",
        help="go on under this definition although a deploy changed what the run's next step depends on "
        "(DefinitionChangedError); AGENT=HASH for a member of the team (repeatable)",
    )
    p.add_argument("--wait", action="store_true")
    p.add_argument("--timeout", type=float)
    p.add_argument("--json", action="store_true", help=f"{JSON_HELP} (the run that goes on: a fork's own)")
    p.set_defaults(func=cmd_continue)


def cmd_run(args: argparse.Namespace) -> int:
    from workers.celery.app import import_apps

    modules = import_apps(args.app)
    client = Client()
    # Every argument checked first: a usage error is one whether or not the agent is known.
    StartRequest.checked(
        agent=args.agent,
        input=args.input,
        session_id=args.session,
        user_id=args.user_id,
        stream=args.stream,
        priority=args.priority,
        session_state=args.session_state,
        run_timeout=args.run_timeout,
    )
    if args.run_id is not None:
        validation.run_id(args.run_id)
    if not catalog.known(client.store, args.agent):
        raise AgentNotFoundError(unknown_agent(args.agent, modules, client))
    handle = client.start(
        args.agent,
        input=args.input,
        session_id=args.session,
        run_id=args.run_id,
        stream=args.stream,
        user_id=args.user_id,
        session_state=args.session_state,
        priority=args.priority,
        webhook=args.webhook,
        run_timeout=None if args.run_timeout is None else validation.run_timeout(args.run_timeout),
    )
    with about(handle.run_id):
        if args.stream:
            if not args.json:
                print(handle.run_id, flush=True)  # before the events it streams
            return print_events(client, handle.run_id, as_json=args.json, timeout=args.timeout)
        return _answer(client, handle, wait=args.wait, timeout=args.timeout, as_json=args.json)


def unknown_agent(name: str, modules: Sequence[str], client: Client) -> str:
    """Why `ratchet run` refuses `name`: where it looked, and what to do."""
    return (
        f"no agent or team named {name!r}: no module this command imported defines one (--app or RATCHET_APP: "
        f"{', '.join(modules) or 'none'}), and no worker has served one (the agent catalog in "
        f"{client.store.display_url}); start a worker whose module defines it (`ratchet worker --app MODULE`), or "
        "give this command that module (--app MODULE); nothing was written"
    )


def cmd_continue(args: argparse.Namespace) -> int:
    if is_batch(args):
        return cmd_batch(
            args, "continue", single=("input", "fork_key", "run_timeout", "accept_definition", "wait", "timeout")
        )
    client = Client()
    timeout = None if args.run_timeout is None else validation.run_timeout(args.run_timeout, what="--run-timeout")
    accept = accepted(args.accept_definition)
    handle = client.continue_run(
        args.run_ids[0], input=args.input, fork_key=args.fork_key, run_timeout=timeout, accept_definition=accept
    )
    with about(handle.run_id):
        return _answer(client, handle, wait=args.wait, timeout=args.timeout, as_json=args.json)


def accepted(given: list[str] | None) -> str | dict[str, str] | None:
    """`--accept-definition` as `Client.continue_run` takes it: one HASH, or AGENT=HASH pairs."""
    if not given:
        return None
    if len(given) == 1 and "=" not in given[0]:
        return given[0]
    pairs = [item.rpartition("=") for item in given]
    if any(not sep or not name for name, sep, _ in pairs):
        raise InvalidInputError("--accept-definition: give one HASH, or AGENT=HASH for each agent of the team")
    return {name: value for name, _, value in pairs}


def _answer(client: Client, handle: RunHandle, *, wait: bool, timeout: float | None, as_json: bool) -> int:
    """The run a start or a continue made: its id (with --json the run as saved), or with
    `wait` the run once it stops."""
    if not as_json:
        print(handle.run_id)
        return show(handle.wait(timeout)) if wait else OK
    out = handle.wait(timeout) if wait else client.get_run(handle.run_id)
    print_json(jsonable(out))
    return outcome(out) if wait else OK


def cmd_cancel(args: argparse.Namespace) -> int:
    if is_batch(args):
        return cmd_batch(args, "cancel")
    out = Client().cancel(args.run_ids[0])
    if args.json:
        print_json(jsonable(out))
    else:
        print(f"{out.run_id} {out.status}")
    return OK


def cmd_show(args: argparse.Namespace) -> int:
    client = Client()
    out = client.get_run(args.run_id)
    log, steps = client.get_log if args.log else None, client.get_steps if args.steps else None
    if args.json:
        print_json(jsonable(out, log, steps))
        return outcome(out)
    return show(out, log=log, steps=steps)


def cmd_stream(args: argparse.Namespace) -> int:
    return print_events(Client(), args.run_id, after=args.after, as_json=args.json, timeout=args.timeout)


def outcome(out: RunOutput) -> int:
    """The exit status of a command that reports how a run ended: 1 for ERROR, else 0."""
    return FAILURE if out.status == RunStatus.ERROR else OK


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))
