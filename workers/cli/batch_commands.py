"""`ratchet continue` and `ratchet cancel` on many runs at once (`Client.continue_runs`,
`Client.cancel_runs`, `orchestrator.batches`): by id, or a batch of the runs a filter with a status
matches, each run acted on its own.

    ratchet continue RUN_ID RUN_ID ... | --status error [--agent A] [--session S] [--user-id U]
                     [--since T] [--until T] [--limit N] [--cursor C] [--json]
    ratchet cancel   the same

One line a run: `RUN_ID continued QUEUED`, or `RUN_ID refused RunNotContinuableError: ...`, then
how many were done and refused, and the cursor of the next batch when the filter matched more.
With --json the batch as `POST /batches/continue` and `POST /batches/cancel` answer it. The exit status
is 0 when every run was done, 1 when one was refused, 2 (nothing done) for a batch that names no
runs, both ids and a filter, a filter without a status, or more than 100 runs.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from pydantic import TypeAdapter

from orchestrator.batches import BATCH_MAX, Batch, Selection
from orchestrator.client import Client
from orchestrator.errors import InvalidInputError
from workers.cli.exits import FAILURE, OK
from workers.cli.render import terminal

_BATCH = TypeAdapter(Batch)
#: The filter's options, as `Selection` names them.
_FILTERS = ("status", "agent", "session_id", "user_id", "since", "until", "limit", "cursor")
_DONE = {"continue": "continued", "cancel": "cancelled"}


def add_batch_arguments(parser: argparse.ArgumentParser, *, done: str) -> None:
    """The run ids, and the options that name a batch of runs by a filter; `done`: what a batch
    does to each, for the help."""
    parser.add_argument("run_ids", nargs="*", metavar="RUN_ID", help=f"the run; several: a batch, each {done}")
    parser.add_argument(
        "--status", action="append", metavar="STATUS", help="a batch of the runs in this status (ERROR, say)"
    )
    parser.add_argument("--agent", help="with --status: runs of this agent or team")
    parser.add_argument(
        "--session", dest="session_id", metavar="SESSION_ID", help="with --status: runs in this session"
    )
    parser.add_argument("--user-id", dest="user_id", metavar="USER_ID", help="with --status: runs for this user")
    parser.add_argument("--since", metavar="TIME", help='with --status: created at or after ("6h", ISO 8601)')
    parser.add_argument("--until", metavar="TIME", help="with --status: created before")
    parser.add_argument(
        "--limit", type=int, help=f"with --status: runs a batch takes (1-{BATCH_MAX}, default {BATCH_MAX})"
    )
    parser.add_argument("--cursor", help="with --status: the next batch, as the last one printed it")


def is_batch(args: argparse.Namespace) -> bool:
    """Whether the command names several runs, or a filter: a batch, not one run."""
    return len(args.run_ids) != 1 or any(getattr(args, key) is not None for key in _FILTERS)


def cmd_batch(args: argparse.Namespace, action: str, *, single: tuple[str, ...] = ()) -> int:
    """Continue or cancel the batch the arguments name; `single`: the options of one run only
    (refused with a batch)."""
    given = [f"--{name.replace('_', '-')}" for name in single if getattr(args, name) not in (None, False)]
    if given:
        raise InvalidInputError(f"{', '.join(given)} take one run: give a single RUN_ID without a filter")
    selection: dict[str, Any] = {key: getattr(args, key) for key in _FILTERS if getattr(args, key) is not None}
    if "status" in selection:
        selection["status"] = [s for item in selection["status"] for s in item.split(",")]
    client = Client()
    act = client.continue_runs if action == "continue" else client.cancel_runs
    batch = act(args.run_ids or None, **Selection(**selection))  # type: ignore[typeddict-item]
    if args.json:
        print(json.dumps(_BATCH.dump_python(batch, mode="json"), indent=2))
    else:
        _print(batch)
    return FAILURE if batch.refused else OK


def _print(batch: Batch) -> None:
    done = _DONE[batch.action]
    for result in batch.results:
        if result.ok:
            print(f"{result.run_id} {done} {result.status or ''}".rstrip())
        else:
            print(terminal(f"{result.run_id} refused {result.error}: {result.reason}"))
    print(f"{done} {len(batch.done)}, refused {len(batch.refused)}")
    if batch.next_cursor is not None:
        print(f"more runs match: run it again with --cursor {batch.next_cursor}")
