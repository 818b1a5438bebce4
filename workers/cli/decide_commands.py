"""The commands of a person in the loop: what paused runs wait for, and a decision on one of
their requirements, each calling `Client` (`pending`, `decide`) as Python code does.

    ratchet pending [--agent A] [--user-id U] [--limit N] [--json]
    ratchet approve RUN_ID REQUIREMENT_ID [--by NAME] [--json]
    ratchet reject RUN_ID REQUIREMENT_ID [--note TEXT] [--by NAME] [--json]
    ratchet answer RUN_ID REQUIREMENT_ID (--field NAME=VALUE ... | --result TEXT) [--by NAME] [--json]

`answer` gives a user_input requirement its fields (each value read as the field's type: a
number, true/false, JSON for a list or an object, else the text) or an external_execution one
the result of the caller's own run of it. The decider is `--by`, else the OS user's name. With
--json, `pending` prints what `GET /approvals` answers and a decision the requirement as `POST
/runs/{id}/requirements/{req}` answers it. A refusal is the store's: RequirementNotFoundError,
DecisionConflictError (naming who decided first), DecisionExpiredError and RunNotPausedError exit
1; DecisionKindError (a decision that does not answer what is asked) exits 2, as a value that
cannot be taken (`workers.cli.exits`).
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
import time
from typing import Any

from pydantic import TypeAdapter

from orchestrator.client import Client
from orchestrator.errors import InvalidInputError
from orchestrator.requirements import Decision, RunRequirement
from workers.approvals import Approval, approvals
from workers.cli.exits import OK
from workers.cli.render import terminal

_REQUIREMENT = TypeAdapter(RunRequirement)
BY_HELP = "who decides, kept with the decision (default: your OS user name)"
JSON_HELP = "print the requirement as stored, as the HTTP API answers it"


def add_decide_commands(sub: Any) -> None:
    """Add `ratchet pending`, `approve`, `reject`, `answer` and `raise` to the subcommands."""
    p = sub.add_parser("pending", help="what paused runs wait for: each call to approve, reject or answer")
    p.add_argument("--agent", help="of this agent's runs (a team member's own name)")
    p.add_argument("--user-id", "--user", dest="user_id", metavar="USER_ID", help="of this user's runs")
    p.add_argument("--limit", type=int, default=100, help="requirements at most (1-1000, default 100)")
    p.add_argument("--json", action="store_true", help="print them as the HTTP API answers GET /approvals")
    p.set_defaults(func=cmd_pending)

    p = sub.add_parser("approve", help="approve a paused call: it runs when its run resumes")
    _requirement_arguments(p)
    p.set_defaults(func=cmd_approve)

    p = sub.add_parser("reject", help="reject a paused call: it does not run, and the model reads the note")
    _requirement_arguments(p)
    p.add_argument("--note", help="why: the model reads it as the call's result")
    p.set_defaults(func=cmd_reject)

    p = sub.add_parser("answer", help="fill in what a call asks of a person, or give an external call's result")
    _requirement_arguments(p)
    given = p.add_mutually_exclusive_group(required=True)
    given.add_argument(
        "--field", action="append", type=_field, metavar="NAME=VALUE", help="a field the tool asks for (repeat)"
    )
    given.add_argument("--result", help="what the external call returned, which the model reads")
    p.set_defaults(func=cmd_answer)

    p = sub.add_parser("raise", help="raise the budget a paused run spent: it resumes in place")
    _requirement_arguments(p)
    p.add_argument("--max-tokens", type=int, help="the new token limit (above what was spent)")
    p.add_argument("--max-cost", type=float, help="the new cost limit (above what was spent)")
    p.set_defaults(func=cmd_raise)


def _requirement_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_id", help="the paused run (or a team above it)")
    p.add_argument("requirement_id", help="the requirement's id, as `ratchet pending` lists it")
    p.add_argument("--by", help=BY_HELP)
    p.add_argument("--json", action="store_true", help=JSON_HELP)


def _field(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    return name, value


def decider(given: str | None) -> str | None:
    """`--by`, else the OS user's name (None where the OS has none to give)."""
    if given is not None:
        return given
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no user name: no passwd entry, no LOGNAME or USER
        return None


def cmd_pending(args: argparse.Namespace) -> int:
    found = approvals(Client(), agent_name=args.agent, user_id=args.user_id, limit=args.limit)
    if args.json:
        print(json.dumps(found.model_dump(mode="json"), indent=2))
        return OK
    if not found.approvals:
        print("nothing is waiting for a decision", file=sys.stderr)
        return OK
    rows = [_row(a, time.time()) for a in found.approvals]
    head = ("RUN", "REQUIREMENT", "AGENT", "TOOL", "ARGUMENTS", "ASKED", "AGE", "DEADLINE")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for row in [head, *rows]:
        print(terminal("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()))
    return OK


def _row(approval: Approval, now: float) -> tuple[str, ...]:
    """One requirement as a line of `ratchet pending`'s table."""
    r = approval.requirement
    call = r.tool_execution
    args = json.dumps(call.tool_args, ensure_ascii=False) if call is not None and call.tool_args is not None else ""
    deadline = "-" if r.deadline_at is None else _span(r.deadline_at - now, ahead=True)
    agent = approval.agent_name + (f" (member of {approval.parent_run_id})" if approval.parent_run_id else "")
    return (
        approval.run_id,
        r.id,
        agent,
        call.tool_name if call is not None else "-",
        args if len(args) <= 60 else args[:59] + "…",
        _asked(r),
        _span(now - r.created_at),
        deadline if r.deadline_at is None else f"{deadline} ({r.on_timeout or 'reject'})",
    )


def _asked(r: RunRequirement) -> str:
    """What the requirement asks of a person, in a few words."""
    if r.pause_type == "user_input":
        return "input: " + ", ".join(f["name"] for f in r.user_input_schema or [])
    if r.pause_type == "external_execution":
        return "external result"
    if r.pause_type == "budget":
        spent = r.budget or {}
        return f"budget: {spent.get('limit', '?')} spent"
    return "confirmation"


def _span(seconds: float, *, ahead: bool = False) -> str:
    """A duration in its largest unit ("5m", "3h"); ahead: "in 5m", or "passed"."""
    if ahead and seconds <= 0:
        return "passed"
    s = max(0.0, seconds)
    shown = next(
        f"{int(s // unit)}{sign}"
        for unit, sign in ((86400, "d"), (3600, "h"), (60, "m"), (1, "s"))
        if s >= unit or unit == 1
    )
    return f"in {shown}" if ahead else shown


def cmd_approve(args: argparse.Namespace) -> int:
    return _decide(args, Decision(kind="confirm"))


def cmd_reject(args: argparse.Namespace) -> int:
    return _decide(args, Decision(kind="reject", note=args.note))


def cmd_answer(args: argparse.Namespace) -> int:
    if args.result is not None:
        return _decide(args, Decision(kind="result", result=args.result))
    client = Client()
    asked = next((r for r in client.get_run(args.run_id).requirements if r.id == args.requirement_id), None)
    types = {f["name"]: f.get("type") for f in (asked.user_input_schema or [])} if asked is not None else {}
    values = {name: typed(name, value, types.get(name)) for name, value in args.field}
    return _decide(args, Decision(kind="input", values=values), client)


def cmd_raise(args: argparse.Namespace) -> int:
    limits = {k: v for k, v in (("max_tokens", args.max_tokens), ("max_cost", args.max_cost)) if v is not None}
    return _decide(args, Decision(kind="budget", values=limits))


def typed(name: str, value: str, kind: str | None) -> Any:
    """A field's value from the command line, as the type the tool states for it."""
    try:
        if kind == "integer":
            return int(value)
        if kind == "number":
            return float(value)
        if kind in ("array", "object"):
            return json.loads(value)
    except ValueError:
        raise InvalidInputError(f"--field {name}: the tool takes {_a(kind)} here, not {value!r}") from None
    if kind == "boolean":
        if value.lower() in ("true", "yes", "1"):
            return True
        if value.lower() in ("false", "no", "0"):
            return False
        raise InvalidInputError(f"--field {name}: the tool takes true or false here, not {value!r}")
    return value


def _a(kind: str | None) -> str:
    return {"integer": "a whole number", "number": "a number", "array": "a JSON list"}.get(kind or "", "a JSON object")


def _decide(args: argparse.Namespace, decision: Decision, client: Client | None = None) -> int:
    client = client or Client()
    stored = client.decide(args.run_id, args.requirement_id, decision, by=decider(args.by))
    if args.json:
        print(json.dumps(_REQUIREMENT.dump_python(stored, mode="json"), indent=2))
        return OK
    what = stored.decision.describe() if stored.decision is not None else stored.status
    by = f" by {stored.decided_by}" if stored.decided_by else ""
    status = client.store.get_record(stored.run_id).status
    print(terminal(f"{stored.id}  {what}{by}; run {stored.run_id} is {status}"))
    return OK
