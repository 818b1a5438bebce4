"""`ratchet schedule`: agents run on a cron schedule (`orchestrator.schedules`).

    ratchet schedule add AGENT --cron EXPR --input TEXT [--timezone TZ] [--session-id S]
                         [--user-id U] [--id ID] [--json]     store one; prints it with its next tick
    ratchet schedule list [--user-id U] [--json]              every schedule, its next tick, its last run
    ratchet schedule rm ID [--json]                           delete one (its runs stay)

The ticks fire from the sweeper (every worker's, or beat's sweep), so nothing else needs to run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from typing import Any

from orchestrator.client import Client
from orchestrator.store.schedule_rows import Schedule
from workers.cli.render import terminal


def add_schedule_commands(sub: Any) -> None:
    """Add `ratchet schedule add|list|rm` to the subcommands."""
    p = sub.add_parser("schedule", help="run an agent on a cron schedule: add, list, rm")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = actions.add_parser("add", help="run AGENT with --input at each tick of --cron")
    add.add_argument("agent")
    add.add_argument("--cron", required=True, help='five fields, like "0 9 * * mon-fri", or @hourly, @daily, ...')
    add.add_argument("--input", required=True, help="the user message each run starts with")
    add.add_argument("--timezone", default="UTC", help="the IANA zone the cron is read in (default: UTC)")
    add.add_argument("--session-id", help="every run in this session (default: a new session each)")
    add.add_argument("--user-id", help="who the runs are for")
    add.add_argument("--id", dest="schedule_id", help="the schedule's id (default: a new one)")
    add.add_argument("--json", action="store_true", help="print JSON (the shape of POST /schedules)")
    add.set_defaults(func=cmd_schedule_add)
    listing = actions.add_parser("list", help="every schedule, with its next tick and its last run")
    listing.add_argument("--user-id", help="only this user's schedules")
    listing.add_argument("--json", action="store_true", help="print JSON (the shape of GET /schedules)")
    listing.set_defaults(func=cmd_schedule_list)
    rm = actions.add_parser("rm", help="delete a schedule (the runs it started stay)")
    rm.add_argument("schedule_id")
    rm.add_argument("--json", action="store_true", help="print JSON")
    rm.set_defaults(func=cmd_schedule_rm)


def cmd_schedule_add(args: argparse.Namespace) -> int:
    made = Client().schedule(
        args.agent,
        cron=args.cron,
        input=args.input,
        timezone=args.timezone,
        session_id=args.session_id,
        user_id=args.user_id,
        schedule_id=args.schedule_id,
    )
    if args.json:
        print(json.dumps(made.to_dict(), indent=2))
    else:
        print(terminal(line(made)))
    return 0


def cmd_schedule_list(args: argparse.Namespace) -> int:
    found = Client().schedules(user_id=args.user_id)
    if args.json:
        print(json.dumps({"schedules": [s.to_dict() for s in found]}, indent=2))
    else:
        for schedule in found:
            print(terminal(line(schedule)))
    return 0


def cmd_schedule_rm(args: argparse.Namespace) -> int:
    Client().unschedule(args.schedule_id)
    if args.json:
        print(json.dumps({"schedule_id": args.schedule_id, "deleted": True}))
    else:
        print(terminal(f"deleted schedule {args.schedule_id}"))
    return 0


def line(schedule: Schedule) -> str:
    """One schedule on one line: id, agent, cron and zone, next tick, last run."""
    return (
        f"{schedule.schedule_id}  agent={schedule.agent_name}  cron={schedule.cron!r} {schedule.timezone}  "
        f"next={_when(schedule.next_at)}  last={schedule.last_run_id or '-'}"
    )


def _when(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).isoformat(timespec="minutes")
