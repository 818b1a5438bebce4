"""`ratchet agents`: the agent catalog, what the workers serve and whether one still does.

    ratchet agents [--json]         every agent and team a worker ever served: kind, live or when
                                    last seen, definition hash, model, queues
    ratchet agents NAME [--json]    one of them: each definition workers served, with its tools

Read from the store (`orchestrator.catalog`), as `GET /agents` does: the command need not import
the agents' modules. A definition is live while a worker marked it seen within three
RATCHET_CATALOG_SEEN_SECONDS.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from typing import Any

from orchestrator import catalog
from orchestrator.catalog import Entry
from orchestrator.client import Client
from orchestrator.errors import AgentNotFoundError
from workers.cli.render import terminal


def add_agents_command(sub: Any) -> None:
    """Add `ratchet agents` to the subcommands."""
    p = sub.add_parser("agents", help="the agents and teams workers serve (the agent catalog)")
    p.add_argument("name", nargs="?", help="one agent or team: every definition workers served, with its tools")
    p.add_argument("--json", action="store_true", help="print JSON (the shape of GET /agents and /agents/NAME)")
    p.set_defaults(func=cmd_agents)


def cmd_agents(args: argparse.Namespace) -> int:
    client = Client()
    entries = catalog.entries(client.store, client.settings, args.name)
    if args.name is not None and not entries:  # as GET /agents/{agent} says it (404)
        raise AgentNotFoundError(f"no worker has served an agent or team named {args.name!r}: none is in the catalog")
    by_name: dict[str, list[Entry]] = {}
    for entry in entries:  # by name, then most recently seen first
        by_name.setdefault(entry.definition.name, []).append(entry)
    if args.json:
        answer: Any = (
            _agent(args.name, by_name[args.name])
            if args.name
            else {"agents": [_summary(n, e) for n, e in by_name.items()]}
        )
        print(json.dumps(answer, indent=2))
    elif args.name is not None:
        _print_versions(by_name[args.name])
    else:
        for versions in by_name.values():
            print(terminal(_line(versions[0], len(versions))))
    return 0


def version(entry: Entry) -> dict[str, Any]:
    """One definition as JSON, as the API answers it."""
    body = asdict(entry.definition)
    del body["name"]  # the agent's, said once above its versions
    body["definition_hash"] = body.pop("hash")
    return {**body, "first_seen": entry.first_seen, "last_seen": entry.last_seen, "live": entry.live}


def _summary(name: str, versions: list[Entry]) -> dict[str, Any]:
    return {
        "name": name,
        "live": any(e.live for e in versions),
        "last_seen": versions[0].last_seen,
        "latest": version(versions[0]),
        "versions": len(versions),
    }


def _agent(name: str, versions: list[Entry]) -> dict[str, Any]:
    return {**_summary(name, versions), "definitions": [version(e) for e in versions]}


def _seen(entry: Entry) -> str:
    """ "live", or when it was last seen, for people."""
    if entry.live:
        return "live"
    ago = max(0.0, time.time() - entry.last_seen)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(entry.last_seen))
    return f"not live: last seen {when} ({_ago(ago)} ago)"


def _ago(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _line(entry: Entry, versions: int) -> str:
    d = entry.definition
    model = f"{d.model.get('provider') or '?'}/{d.model.get('id')}"
    queues = f" queue={d.queue}" if d.queue else ""
    queues += f" tool_queue={d.tool_queue}" if d.tool_queue else ""
    fallbacks = [m.get("id") for ms in d.fallback_models.values() for m in ms]
    queues += f" fallback={','.join(str(f) for f in fallbacks)}" if fallbacks else ""
    more = f" ({versions} definitions)" if versions > 1 else ""
    return f"{d.name}  {d.kind}  {_seen(entry)}  {d.hash[:12]}  {model}{queues}{more}"


def _print_versions(versions: list[Entry]) -> None:
    for entry in versions:
        d = entry.definition
        print(terminal(f"{d.name} ({d.kind}) {d.hash}: {_seen(entry)}"))
        print(terminal(f"  model: {d.model.get('provider') or '?'}/{d.model.get('id')}"))
        print(f"  queues: steps {d.queue or '(default)'}, tools {d.tool_queue or '(default)'}")
        if d.members:
            print(terminal(f"  members: {', '.join(d.members)}"))
        for t in d.tools:
            flags = ", ".join(f"{k}={v}" for k, v in sorted(t.flags.items()))
            print(
                terminal(
                    f"  tool {t.name}({', '.join(t.parameters.get('properties', {}))})"
                    + (f" [{flags}]" if flags else "")
                )
            )
        print(f"  output schema: {'yes' if d.output_schema is not None else 'none (text)'}")
        print(f"  first seen {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(entry.first_seen))}")
