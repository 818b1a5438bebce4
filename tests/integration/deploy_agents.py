"""The agent of tests/integration/test_deploy_workers.py in three versions of its code, as three
deploys of one module would define it: its worker subprocesses import this module
(`ratchet worker --app tests.integration.deploy_agents`) with DEPLOY_VERSION set to 1, 2 or 3; the
test process defines whichever version its producer starts runs of (`define`).

- version 1: `lookup(query)`, and `pay(amount, to)`, which needs a person's confirmation;
- version 2: the same tools, other instructions: a run of version 1 goes on under it;
- version 3: `lookup(query, limit=5)`: a run that owes a lookup call stops under it.

`lookup` waits while `$DEPLOY_TEST_DIR/hold-<query>` exists (after writing `started-<query>.<pid>`),
so a test can hold a run in flight across a deploy. `lookup` and `pay` each append a line to
`<run_id>.ran`: the tool, its argument, the version and the pid that ran it. Each worker writes
`ready-<node name>` once it consumes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import openai  # noqa: F401  (imported before the pool starts, not in its first call)
from celery.signals import worker_ready

from orchestrator import Agent, ToolContext, tool
from orchestrator.models import OpenAIChat

DIR = "DEPLOY_TEST_DIR"
VERSION = "DEPLOY_VERSION"
AGENT = "deploy-agent"
HOLD_LIMIT_S = 60.0


def _ran(context: ToolContext, what: str, version: int) -> None:
    with (Path(os.environ[DIR]) / f"{context.run_id}.ran").open("a") as ledger:
        ledger.write(f"{what} {version} {os.getpid()}\n")


def _hold(query: str) -> None:
    folder = Path(os.environ[DIR])
    (folder / f"started-{query}.{os.getpid()}").touch()
    deadline = time.monotonic() + HOLD_LIMIT_S
    while (folder / f"hold-{query}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def define(version: int) -> Agent:
    """The agent as version `version` of this module defines it (registered in this process)."""

    if version == 3:

        def lookup3(query: str, context: ToolContext, limit: int = 5) -> str:
            """Look something up.

            Args:
                query: What to look up.
                limit: How many answers at most.
            """
            _hold(query)
            _ran(context, f"lookup:{query}", version)
            return f"found {query} (v{version})"

        lookup: Any = tool(name="lookup")(lookup3)
    else:

        def lookup1(query: str, context: ToolContext) -> str:
            """Look something up.

            Args:
                query: What to look up.
            """
            _hold(query)
            _ran(context, f"lookup:{query}", version)
            return f"found {query} (v{version})"

        lookup = tool(name="lookup")(lookup1)

    @tool(requires_confirmation=True)
    def pay(amount: int, to: str, context: ToolContext) -> str:
        """Pay someone.

        Args:
            amount: In cents.
            to: Who is paid.
        """
        _ran(context, f"pay:{to}", version)
        return f"paid {amount} to {to} (v{version})"

    instructions = "Look things up, pay who you are asked to." + (" Be brief." if version >= 2 else "")
    return Agent(name=AGENT, model=OpenAIChat(id="deploy-model"), tools=[lookup, pay], instructions=instructions)


if VERSION in os.environ:
    define(int(os.environ[VERSION]))


@worker_ready.connect
def _ready(sender: Any, **_: Any) -> None:
    if DIR in os.environ:
        (Path(os.environ[DIR]) / f"ready-{sender.hostname}").touch()
