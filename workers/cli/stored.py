"""The commands that look after stored runs: `ratchet runs` (a page of runs, filtered),
`ratchet prune` (delete old stopped runs), `ratchet delete-session` and `ratchet sweep` (one
sweeper pass). Each calls `Client` (the sweep, the sweeper) as Python code does, with the same
arguments and errors.

    ratchet runs [--status S] [--agent A] [--session S] [--user-id U] [--since T] [--until T]
                 [--limit N] [--cursor C] [--members] [--json]
    ratchet prune --older-than 30d [--status S]
    ratchet delete-session SESSION_ID
    ratchet sweep [--app MODULE]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from orchestrator.client import Client
from orchestrator.settings import Settings
from workers.cli.exits import Refusal
from workers.cli.render import print_page, terminal


def add_ops_commands(sub: Any) -> None:
    """Add `ratchet runs`, `ratchet prune` and `ratchet delete-session` to the subcommands."""
    p = sub.add_parser("runs", help="list runs, newest first, filtered by status, agent, session, user, time")
    p.add_argument(
        "--status", action="append", metavar="STATUS", help="QUEUED, RUNNING, ..., ERROR (repeat, or S1,S2, for any)"
    )
    p.add_argument("--agent", help="runs of this agent or team")
    p.add_argument("--session", help="runs in this session")
    # --user-id as `ratchet run` and `ratchet session` name it; --user, its first name, still works
    p.add_argument("--user-id", "--user", dest="user_id", metavar="USER_ID", help="runs for this user id")
    p.add_argument("--since", metavar="TIME", help='created at or after: ISO 8601, UNIX seconds, or "6h" ago')
    p.add_argument("--until", metavar="TIME", help="created before (the same forms)")
    p.add_argument("--limit", type=int, default=50, help="runs a page (1-1000, default 50)")
    p.add_argument("--cursor", help="the next page: the cursor the previous page printed")
    p.add_argument("--members", action="store_true", help="also team members' runs (default: top-level runs)")
    p.add_argument("--json", action="store_true", help="print the page as JSON: runs and next_cursor")
    p.set_defaults(func=cmd_runs)

    p = sub.add_parser("prune", help="delete stopped runs nothing changed for a while, with all they stored")
    p.add_argument("--older-than", required=True, metavar="AGE", help='unchanged for this long: "30d", "12h", seconds')
    p.add_argument(
        "--status", action="append", metavar="STATUS", help="only runs in these stopped statuses (default: all)"
    )
    p.set_defaults(func=cmd_prune)

    p = sub.add_parser("delete-session", help="delete a session: its runs and everything stored for them")
    p.add_argument("session_id")
    p.set_defaults(func=cmd_delete_session)

    p = sub.add_parser("sweep", help="one sweeper pass: recover expired leases, publish due steps")
    p.add_argument("--app", action="append", default=[], metavar="MODULE")
    p.set_defaults(func=cmd_sweep)


def cmd_runs(args: argparse.Namespace) -> int:
    page = Client().list_runs(
        status=_statuses(args.status),
        agent=args.agent,
        session_id=args.session,
        user_id=args.user_id,
        since=args.since,
        until=args.until,
        limit=args.limit,
        cursor=args.cursor,
        members=args.members,
    )
    if args.json:
        print(json.dumps(asdict(page), indent=2))
    else:
        print_page(page)
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    report = Client().prune(args.older_than, status=_statuses(args.status))
    print(f"deleted {report.runs} runs")
    if report.kept:
        more = f" and {len(report.kept) - 20} more" if len(report.kept) > 20 else ""
        print(f"kept {len(report.kept)} old runs, live or changed meanwhile: {', '.join(report.kept[:20])}{more}")
    return 0


def cmd_delete_session(args: argparse.Namespace) -> int:
    deleted = Client().delete_session(args.session_id)
    if deleted is None:  # as DELETE /sessions/{id} says it (404)
        raise Refusal(f"no session {args.session_id!r} in this database", type="SessionNotFound")
    print(terminal(f"deleted session {args.session_id}: {deleted.runs} runs"))
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from orchestrator.sweeper import Sweeper
    from workers.celery.app import create_app, import_apps
    from workers.celery.tasks import runner_for

    import_apps(args.app)
    report = Sweeper(runner_for(create_app(Settings.from_env()))).sweep_once()
    acted = report.acted()
    print(
        ", ".join(f"{kind.replace('_', ' ')} {len(ids)}" for kind, ids in acted.items())
        + f", webhooks {report.webhooks}"
    )
    for kind, ids in acted.items():
        for run_id in ids:
            print(f"  {kind}: {run_id}")
    return 0


def _statuses(given: list[str] | None) -> list[str] | None:
    """--status S1 --status S2,S3 as one list (None: not given)."""
    return None if given is None else [s for item in given for s in item.split(",")]
