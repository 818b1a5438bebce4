"""The benchmarks' agents. A bench worker imports this module (`ratchet worker --app
bench.agents`), so every agent here is known on both sides of the broker.

- `bench-steps`: the scripted model, in-process: 100 model calls that each ask for the no-op
  tool, their 100 tool batches, and a final answer (201 steps).
- `bench-instant`: `InstantModel`, whose cost does not grow with the transcript; the input
  `batches=N gates=a,b,...` sets the run's length and the steps where it pauses for a reading.
- `bench-chat` / `bench-io`: the real openai client against the scripted HTTP server
  (OPENAI_BASE_URL), one step / model-tool-model.
- `bench-talk`: `TalkingModel`, `InstantModel` that also says a sentence at each model step
  (streamed a word a delta when the run is), for the cost of a streamed step.
- `bench-recovery`: its first tool call stalls until the worker is killed.
- `bench-history` / `bench-plain`: `InstantModel` with 20 runs of session history, and without.
- `bench-mem`: one model call on the scripted model, for the memory soak.
- `bench-approve`: `InstantModel` asking for one call of `approve_me`, which needs a person's
  confirmation: the run PAUSES, and a decision resumes it (bench/decision.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import redis

import bench.ready  # noqa: F401  (announces readiness)
from orchestrator import Agent, ToolContext, tool
from orchestrator.messages import Message, ToolCall
from orchestrator.models import OpenAIChat
from orchestrator.models.base import CallContext, Model, ModelReply, ToolSpec
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.scripted_model import ScriptedModel

UNLIMITED = 1_000_000


def noop() -> str:
    """Do nothing and say so."""
    return "ok"


@tool(requires_confirmation=True)
def approve_me() -> str:
    """Do nothing once a person said yes."""
    return "ok"


def stall(ctx: ToolContext) -> str:
    """The first call of a run reports that it started, then hangs (its worker is killed)."""
    r = _redis()
    if r.set(f"bench:stall:{ctx.run_id}", os.getpid(), nx=True, ex=600):
        r.rpush(f"bench:stall:{ctx.run_id}:started", os.getpid())
        time.sleep(300)
    return "ok"


class InstantModel(Model):
    """Answers at once at a cost that does not depend on the transcript's length (the scripted
    model hashes the whole conversation to name its tool calls: 3.6 ms at 1,000 messages).

    The run's first user message says how many tool batches to ask for, and at which steps
    (`seq`) to pause until the benchmark has taken a reading: `batches=510 gates=10,20`."""

    def __init__(self) -> None:
        self.id = "instant"

    def invoke(self, messages: Sequence[Message], tools: Sequence[ToolSpec], *, context: CallContext) -> ModelReply:
        user = next(m for m in messages if m.role == "user")
        options = dict(part.split("=", 1) for part in (user.content or "").split() if "=" in part)
        gates = {int(g) for g in options.get("gates", "").split(",") if g}
        if context.seq in gates:
            _gate(context.run_id, context.seq)
        turn = context.seq // 2 + 1
        if tools and turn <= int(options.get("batches", "0")):
            call = ToolCall(id=f"call_{context.seq}", name=tools[0].name, arguments="{}")
            return ModelReply(tool_calls=[call], usage={"input_tokens": 1, "output_tokens": 1})
        return ModelReply(content="done", usage={"input_tokens": 1, "output_tokens": 1})


#: What `TalkingModel` says at each model step: 29 words, a sentence or two such as a model writes
#: before its tool calls and in its answer (bench/streaming.py).
SENTENCE = (
    "Let me look that up first: I will call the tool, read what it returns, and then tell you what "
    "it found and what it means for your question."
)
WORDS = [w + " " for w in SENTENCE.split()]


class TalkingModel(InstantModel):
    """`InstantModel` whose every reply also carries `SENTENCE`: handed to `context.on_delta` a
    word at a time when the run is streamed, returned whole when not, so a streamed run and a
    plain one commit the same messages and differ only in the deltas published."""

    def __init__(self) -> None:
        self.id = "talking"

    def invoke(self, messages: Sequence[Message], tools: Sequence[ToolSpec], *, context: CallContext) -> ModelReply:
        reply = super().invoke(messages, tools, context=context)
        if context.on_delta is not None:
            for word in WORDS:
                context.on_delta(word)
        return ModelReply(content="".join(WORDS), tool_calls=reply.tool_calls, usage=reply.usage)


def _gate(run_id: str, seq: int) -> None:
    r = _redis()
    r.rpush(f"bench:gate:{run_id}:arrived", seq)
    if pop(r, f"bench:gate:{run_id}:go", timeout=120) is None:
        raise RuntimeError(f"bench gate {run_id}@{seq} was never opened")


def pop(r: redis.Redis, key: str, timeout: float) -> bytes | None:
    """BLPOP one item within `timeout` seconds, in one-second waits (a long blocking read can
    trip the client's socket timeout)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = r.blpop([key], timeout=1)
        if got is not None:
            return got[1]  # type: ignore[no-any-return]
    return None


_client: Any = None


def _redis() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(os.environ.get("BENCH_REDIS_URL") or os.environ["RATCHET_BROKER_URL"])
    return _client  # type: ignore[no-any-return]


steps = Agent(
    name="bench-steps", model=ScriptedModel(script=ScriptConfig(tool_batches=100)), tools=[noop],
    max_tool_batches=UNLIMITED,
)  # fmt: skip
instant = Agent(name="bench-instant", model=InstantModel(), tools=[noop], max_tool_batches=UNLIMITED)
talk = Agent(name="bench-talk", model=TalkingModel(), tools=[noop], max_tool_batches=UNLIMITED)
chat = Agent(name="bench-chat", model=OpenAIChat(id="scripted"))
io = Agent(name="bench-io", model=OpenAIChat(id="scripted"), tools=[noop])
recovery = Agent(name="bench-recovery", model=ScriptedModel(script=ScriptConfig(tool_batches=1)), tools=[stall])
history = Agent(
    name="bench-history", model=InstantModel(), tools=[noop], add_history_to_context=True, num_history_runs=20
)
plain = Agent(name="bench-plain", model=InstantModel(), tools=[noop])
mem = Agent(name="bench-mem", model=ScriptedModel(script=ScriptConfig(tool_batches=0)))
approve = Agent(name="bench-approve", model=InstantModel(), tools=[approve_me])
