"""`ratchet session SESSION_ID`: a session's user, state and runs, as `Client.get_session` reads
them; and `--session-state`, the JSON object `ratchet run` merges over a session's state."""

from __future__ import annotations

import argparse
import json
from typing import Any

from orchestrator.client import Client
from orchestrator.run import Session
from workers.cli.exits import Refusal
from workers.cli.render import jsonable, terminal


def add_session_command(sub: Any) -> None:
    """Add `ratchet session` to the command line's subcommands."""
    p = sub.add_parser("session", help="show a session: its user, its state and its runs")
    p.add_argument("session_id")
    p.add_argument("--user-id", help="the session only if it is this user's (its first run's), with this user's runs")
    p.add_argument("--json", action="store_true", help="print JSON (each run whole)")
    p.set_defaults(func=cmd_session)


def state_argument(text: str) -> Any:
    """The value of `--session-state`: JSON text (the run control checks it is an object)."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc}); give a JSON object, e.g. '{{\"cart\": []}}'") from None


def cmd_session(args: argparse.Namespace) -> int:
    session = Client().get_session(args.session_id, user_id=args.user_id)
    if session is None:
        if args.user_id is not None:  # whether the session is somebody else's is not said
            raise Refusal(f"no session {args.session_id!r} of user_id {args.user_id!r}", type="SessionNotFound")
        raise Refusal(f"no run was ever started in session {args.session_id!r}", type="SessionNotFound")
    if args.json:
        print(json.dumps(session_json(session), indent=2, default=str))
        return 0
    print(terminal(f"session {session.session_id}  user={session.user_id or '-'}  runs={len(session.runs)}"))
    print(terminal(f"  state: {json.dumps(session.session_state)}"))
    for run in session.runs:
        print(terminal(f"  run {run.run_id}  {run.status}  agent={run.agent_name}  user={run.user_id or '-'}"))
    return 0


def session_json(session: Session) -> dict[str, Any]:
    """The session as JSON values (`ratchet session --json`)."""
    return {
        "session_id": session.session_id,
        "user_id": session.user_id,
        "session_state": session.session_state,
        "runs": [jsonable(run) for run in session.runs],
        "metrics": session.metrics.model_dump(mode="json"),
    }
