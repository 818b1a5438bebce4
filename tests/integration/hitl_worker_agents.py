"""The agent of tests/integration/test_hitl_workers.py, imported by its worker subprocesses
(`ratchet worker --app tests.integration.hitl_worker_agents`); producers start it by name.

`pay` needs a person's confirmation. Each time it runs it appends a line to
`$HITL_TEST_DIR/<run_id>.paid` (amount, payee, the worker's pid), so a test sees how many times
each call took effect and on which worker. Each worker writes `$HITL_TEST_DIR/ready-<node name>`
once it consumes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import openai  # noqa: F401  (imported before the pool starts, not in its first call)
from celery.signals import worker_ready

from orchestrator import Agent, ToolContext, tool
from orchestrator.models import OpenAIChat

DIR = "HITL_TEST_DIR"
AGENT = "hitl-payer"


@tool(requires_confirmation=True)
def pay(amount: int, to: str, context: ToolContext) -> str:
    """Pay someone.

    Args:
        amount: In cents.
        to: Who is paid.
    """
    with (Path(os.environ[DIR]) / f"{context.run_id}.paid").open("a") as ledger:
        ledger.write(f"{amount} {to} {os.getpid()}\n")
    return f"paid {amount} to {to} on pid {os.getpid()}"


Agent(name=AGENT, model=OpenAIChat(id="hitl-payer"), tools=[pay], instructions="Pay who you are asked to pay.")


@worker_ready.connect
def _ready(sender: Any, **_: Any) -> None:
    if DIR in os.environ:
        (Path(os.environ[DIR]) / f"ready-{sender.hostname}").touch()
