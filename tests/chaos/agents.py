"""The agents and tools of the chaos tests. Worker subprocesses import this module
(`ratchet worker --app tests.chaos.agents`); the test process imports it for the names.

Everything a test steers goes through files in the folder named by CHAOS_DIR, so a test can
hold a tool mid-call, learn which pool process runs it, and then kill exactly that process:

- `hold-<key>`      while it exists, the tool `effect(key)` waits after it has started;
- `stubborn-<key>`  `effect(key)` ignores Celery's soft time limit (a badly behaved tool: it
  ignores the limit's signal, so it runs on until the hard limit kills its process);
- `started-<key>.<pid>`   written by `effect(key)` when a process starts it;
- `model-<run_id>-<seq>.<pid>`   written before each model call of a step;
- `changed-<key>.<pid>`   written by `tally(key)` once it changed the session state (not yet
  committed); `hold-after-<key>` then holds it there;
- `crash-before-publish-<run_id>`   the next worker process that is about to publish a step of
  that run after committing it dies instead (`os._exit`), once: the commit/publish gap (a
  sweep's republish, on a worker with beat, commits no step: it publishes as usual);
- `crash-before-turn-<run_id>`   the next worker process that is about to give the next run of
  that run's session its turn, once the run stopped, dies instead (`os._exit`), once: the gap
  between a stop and its session's wake (`orchestrator.store.turns`);
- `publish-twice`   every step a worker publishes is published twice (duplicate deliveries);
- `ready-<node name>`   written by each worker once it consumes.

The side effect of `effect(key)` is a row in `chaos_tool_effects`, one per time it took effect:
nothing there stops a second one, so the invariants see a call that took effect twice (the
harness checks each call's rows). Every execution is also logged in `chaos_tool_attempts`, which
shows whether a call ran again, effect or not.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import openai  # noqa: F401  (imported before the pool forks, not in each child's first call)
from celery.signals import worker_process_init, worker_ready
from sqlalchemy import Column, Engine, Float, Integer, MetaData, String, Table, insert

from orchestrator import Agent, RetryPolicy, Settings, ToolContext, tool
from orchestrator.messages import Message
from orchestrator.models import OpenAIChat
from orchestrator.models.base import CallContext, ModelReply, RateLimit, ToolSpec
from orchestrator.ports import StepRef
from orchestrator.run import RunRecord
from orchestrator.steps import StepRunner
from orchestrator.steps.admission import Admission
from orchestrator.store.database import open_engine
from orchestrator.sweeper import Sweeper, SweepReport

CHAOS_DIR = "CHAOS_DIR"
HOLD_LIMIT_S = 60.0

ledger = MetaData()
effects = Table(
    "chaos_tool_effects",
    ledger,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(64), nullable=False),
    Column("tool_call_id", String(128), nullable=False),
    Column("key", String(64), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("at", Float, nullable=False),
)
attempts = Table(
    "chaos_tool_attempts",
    ledger,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(64), nullable=False),
    Column("tool_call_id", String(128), nullable=False),
    Column("key", String(64), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("at", Float, nullable=False),
)


def chaos_dir() -> Path:
    return Path(os.environ[CHAOS_DIR])


_engines: dict[int, Engine] = {}
_engines_lock = threading.Lock()


def _ledger() -> Engine:
    """The ledger lives in the run store's database; one engine per process (forks included)."""
    with _engines_lock:
        engine = _engines.get(os.getpid())
        if engine is None:
            engine = _engines[os.getpid()] = open_engine(Settings.from_env().database_url)
        return engine


def _hold(key: str) -> None:
    folder = chaos_dir()
    deadline = time.monotonic() + HOLD_LIMIT_S
    while (folder / f"hold-{key}").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"hold-{key} was never released")
        time.sleep(0.01)


def _ignore_the_soft_limit() -> None:
    """Make the running tool deaf to Celery's soft time limit: billiard signals it to the pool
    process (SIGUSR1) and the handler raises SoftTimeLimitExceeded wherever the main thread is.
    Ignoring the signal, rather than catching the exception in a wait loop, leaves no instruction
    of the tool where the exception could land and end the step before the hard limit (the pool
    process is killed there, so the handler is never wanted back)."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("a stubborn tool must run alone in its batch (in the task's own thread)")
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


@tool
def effect(key: str, ctx: ToolContext) -> str:
    """Apply the side effect named `key`: a ledger row each time it runs to the end."""
    if (chaos_dir() / f"stubborn-{key}").exists():
        _ignore_the_soft_limit()
    now = time.time()
    with _ledger().begin() as conn:
        conn.execute(
            insert(attempts).values(run_id=ctx.run_id, tool_call_id=ctx.tool_call_id, key=key, pid=os.getpid(), at=now)
        )
    (chaos_dir() / f"started-{key}.{os.getpid()}").touch()
    _hold(key)
    with _ledger().begin() as conn:
        conn.execute(
            insert(effects).values(
                run_id=ctx.run_id, tool_call_id=ctx.tool_call_id, key=key, pid=os.getpid(), at=time.time()
            )
        )
    return f"{key}: applied"


@tool
async def effect_async(key: str, ctx: ToolContext) -> str:
    """`effect` as an async tool: its hold awaits on the worker process's tool loop."""
    with _ledger().begin() as conn:
        conn.execute(
            insert(attempts).values(
                run_id=ctx.run_id, tool_call_id=ctx.tool_call_id, key=key, pid=os.getpid(), at=time.time()
            )
        )
    (chaos_dir() / f"started-{key}.{os.getpid()}").touch()
    deadline = time.monotonic() + HOLD_LIMIT_S
    while (chaos_dir() / f"hold-{key}").exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)  # the soft limit cancels the call here
    with _ledger().begin() as conn:
        conn.execute(
            insert(effects).values(
                run_id=ctx.run_id, tool_call_id=ctx.tool_call_id, key=key, pid=os.getpid(), at=time.time()
            )
        )
    return f"{key}: applied"


def _effect_once(key: str, ctx: ToolContext) -> str:
    """Apply a side effect that must never run twice (at-most-once)."""
    return effect.fn(key, ctx)  # type: ignore[no-any-return]


effect_once = tool(name="effect_once", at_most_once=True)(_effect_once)


@tool
def tally(key: str, ctx: ToolContext) -> str:
    """Count `key` in the session's state: one more in `count`, and `key` added to `tallied`."""
    with _ledger().begin() as conn:
        conn.execute(
            insert(attempts).values(
                run_id=ctx.run_id, tool_call_id=ctx.tool_call_id, key=key, pid=os.getpid(), at=time.time()
            )
        )
    (chaos_dir() / f"started-{key}.{os.getpid()}").touch()
    _hold(key)
    state = ctx.session_state
    state["count"] = state.get("count", 0) + 1
    state["tallied"] = [*state.get("tallied", []), key]
    (chaos_dir() / f"changed-{key}.{os.getpid()}").touch()
    _hold(f"after-{key}")
    return f"{key}: tallied"


@tool
def crash(key: str) -> str:
    """Kill the process that runs it, every time (a poison step)."""
    (chaos_dir() / f"started-{key}.{os.getpid()}").touch()
    os._exit(1)


class MarkedChat(OpenAIChat):
    """The real Chat Completions adapter, which first writes which process makes the call."""

    def invoke(self, messages: Sequence[Message], tools: Sequence[ToolSpec], *, context: CallContext) -> ModelReply:
        (chaos_dir() / f"model-{context.run_id}-{context.seq}.{os.getpid()}").touch()
        return super().invoke(messages, tools, context=context)


FAST_RETRIES = RetryPolicy(base=0.1, factor=2.0, max_delay=0.5)

#: The chaos agent: the scripted model decides which tools it calls (ScriptConfig.batches).
AGENT = "chaos-agent"
Agent(
    name=AGENT,
    model=MarkedChat(id="scripted"),
    tools=[effect, effect_once, crash, effect_async, tally],
    instructions="Do what the script says.",
    retries=2,
    retry_policy=FAST_RETRIES,
)

#: The same model with session history on (`add_history_to_context`, Agno's default of 3 runs).
HISTORY_AGENT = "chaos-history"
Agent(
    name=HISTORY_AGENT,
    model=MarkedChat(id="scripted"),
    instructions="Remember the conversation.",
    retries=2,
    retry_policy=FAST_RETRIES,
    add_history_to_context=True,
)

#: The same, its session's runs one at a time (`serialize_session_runs`).
SERIAL_AGENT = "chaos-serial"
Agent(
    name=SERIAL_AGENT,
    model=MarkedChat(id="scripted"),
    instructions="Remember the conversation.",
    retries=2,
    retry_policy=FAST_RETRIES,
    add_history_to_context=True,
    serialize_session_runs=True,
)

#: A model every worker may call at most once per RATE_WINDOW seconds (the limiter's rates).
RATE_WINDOW = 1.0
LIMITED_AGENT = "chaos-limited"
Agent(
    name=LIMITED_AGENT,
    model=MarkedChat(id="scripted-limited", rate_limit=RateLimit(requests=1, per=RATE_WINDOW)),
    tools=[effect],
    retries=0,
)


#: A model that the chaos test of a fallback makes fail for good, and the one it falls back on.
FALLBACK_AGENT = "chaos-fallback"
Agent(
    name=FALLBACK_AGENT,
    model=MarkedChat(id="scripted-primary"),
    fallback_models=[MarkedChat(id="scripted-backup")],
    retries=0,
)


def calls(*keys: str, name: str = "effect") -> list[dict[str, Any]]:
    """One scripted tool batch: a call of `name` per key."""
    return [{"tool": name, "arguments": {"key": k}} for k in keys]


# ---------------------------------------------------------------- process-level faults


class DyingDispatcher:
    """A dispatcher whose process dies as it is asked to publish (RATCHET_DISPATCHER names it):
    a producer killed after it wrote the run, before the first task left."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def publish(self, step: StepRef) -> None:
        os._exit(3)


def _take(flag: Path) -> bool:
    # rename is atomic: of two processes racing for the flag, one wins.
    try:
        flag.rename(flag.with_name(flag.name + ".taken"))
    except FileNotFoundError:
        return False
    return True


@worker_ready.connect
def _announce_ready(sender: Any = None, **_: Any) -> None:
    """Tell the test this worker consumes now (`ready-<node name>`)."""
    (chaos_dir() / f"ready-{sender.hostname}").touch()


@worker_process_init.connect
def _fault_hooks(**_: Any) -> None:
    """In each pool process: die between a commit and its publish, or publish twice, on cue.
    A test double of the process dying, not of Celery: the real dispatcher publishes.

    A sweep does not die: on a loaded machine it may republish a step nobody claimed within the
    publish grace, and dying there would cut the wrong gap (and leave the step's own process alive)."""
    publish = StepRunner.publish
    sweep_once = Sweeper.sweep_once
    sweeping = threading.local()

    def faulty_publish(self: StepRunner, step: StepRef) -> None:
        folder = chaos_dir()
        if not getattr(sweeping, "on", False) and _take(folder / f"crash-before-publish-{step.run_id}"):
            os._exit(1)
        publish(self, step)
        if (folder / "publish-twice").exists():
            publish(self, step)

    def marked_sweep_once(self: Sweeper) -> SweepReport:
        sweeping.on = True
        try:
            return sweep_once(self)
        finally:
            sweeping.on = False

    turn = Admission.turn

    def faulty_turn(self: Admission, record: RunRecord) -> None:
        if _take(chaos_dir() / f"crash-before-turn-{record.run_id}"):
            os._exit(1)
        turn(self, record)

    Admission.turn = faulty_turn  # type: ignore[method-assign]
    StepRunner.publish = faulty_publish  # type: ignore[method-assign]
    Sweeper.sweep_once = marked_sweep_once  # type: ignore[method-assign]
