"""#26 point 6: what a model step costs on each provider adapter, against OpenAI's.

Each adapter of `ADAPTERS` makes the model call of a step (`invoke`, the part of a step that
differs between providers) against the same scripted server, in this process, with the same
transcript: a run ten tool batches deep (22 messages, a tool offered), the reply a tool call, not
streamed and streamed. Interleaved round by round with the reference (the first adapter,
`OpenAIChat`), each round `calls` calls of each. Two figures per adapter: the wall time of a call
and the CPU the calling thread spent on it (`time.thread_time`: the adapter and its SDK, what a
worker's thread pays; the scripted server's own work, on its threads, is left out, so a wire
that costs the server more to build does not count against its adapter). The ratio is the median
of the paired CPU ratios against the reference (target: within 1.10).

Another provider is one more entry of `ADAPTERS`: a name and how to build its model for a server.
`python -m bench.providers [--quick]` runs this alone and prints the rows.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from bench.stats import Row, Section, median, paired_ratios
from orchestrator.messages import Message, ToolCall
from orchestrator.models import Claude, OpenAIChat
from orchestrator.models.base import CallContext, Model, ToolSpec
from orchestrator.testing.anthropic_wire import anthropic_base_url
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.server import ScriptedServer

KEY = "sk-bench-key-for-the-scripted-model"
#: Each provider adapter: its name and its model for a scripted server; the first is the reference.
ADAPTERS: list[tuple[str, Callable[[ScriptedServer], Model]]] = [
    ("OpenAIChat", lambda server: OpenAIChat(id="bench", api_key=KEY, base_url=server.url)),
    ("Claude", lambda server: Claude(id="bench", api_key=KEY, base_url=anthropic_base_url(server.url))),
]
TOOL = ToolSpec(
    name="lookup",
    description="Look a word up.",
    parameters={"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
)
BATCHES = 10
TARGET = 1.10


def transcript() -> list[Message]:
    """A run `BATCHES` tool batches deep: each batch a call and its result."""
    messages = [Message(role="system", content="Look words up."), Message(role="user", content="define ratchet")]
    for i in range(BATCHES):
        call = ToolCall(id=f"call_{i}", name="lookup", arguments='{"query": "ratchet"}')
        messages += [
            Message(role="assistant", tool_calls=[call.to_openai()]),
            Message(role="tool", tool_call_id=call.id, tool_name="lookup", content="a toothed wheel " * 8),
        ]
    return messages


def _timer(model: Model, messages: list[Message], calls: int, stream: bool) -> Callable[[], tuple[float, float]]:
    on_delta = (lambda _text: None) if stream else None
    contexts = [CallContext(run_id=f"bench-{i}", seq=1, on_delta=on_delta) for i in range(calls)]

    def run() -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.thread_time()
        for context in contexts:
            reply = model.invoke(messages, [TOOL], context=context)
            assert reply.tool_calls, reply
        return (time.perf_counter() - wall) / calls * 1000, (time.thread_time() - cpu) / calls * 1000

    return run


def measure(server: ScriptedServer, *, rounds: int, calls: int) -> Section:
    """The rows and the headline ratios (`providers_ratio_<name>`, `..._stream`) of every adapter."""
    # Every call answers with a tool call (a batch past the transcript's ten), as a step deep in a run.
    server.configure(ScriptConfig(tool_batches=BATCHES + 1))
    messages = transcript()
    models = [(name, build(server)) for name, build in ADAPTERS]
    section = Section("A model step on each provider adapter")
    for stream in (False, True):
        timers = [_timer(model, messages, calls, stream) for _, model in models]
        for timer in timers:  # warm: clients, connections, imports
            timer()
        # A B A B ..., as `bench.stats.interleave` runs them, each sample a pair (wall, CPU).
        samples: list[list[tuple[float, float]]] = [[] for _ in timers]
        for _ in range(rounds):
            for taken, timer in zip(samples, timers, strict=True):
                taken.append(timer())
        kind = "streamed" if stream else "whole"
        reference_cpu = [cpu for _, cpu in samples[0]]
        for (name, _), taken in zip(models, samples, strict=True):
            walls, cpus = [w for w, _ in taken], [c for _, c in taken]
            setup = f"{kind} reply, {len(messages)} messages, {calls} calls a round"
            ratio = median(paired_ratios(cpus, reference_cpu))
            reference = name == models[0][0]
            section.rows.append(Row(f"{name} call, wall ({kind})", setup, walls, "ms", digits=3))
            section.rows.append(
                Row(
                    f"{name} call, caller CPU ({kind})", setup, cpus, "ms", digits=3,
                    ratio=None if reference else ratio, ratio_note="" if reference else f"vs {models[0][0]}",
                    target="" if reference else f"≤ {TARGET:.2f}x", met=None if reference else ratio <= TARGET,
                )
            )  # fmt: skip
            if not reference:
                suffix = "_stream" if stream else ""
                section.numbers[f"providers_ratio_{name.lower()}{suffix}"] = ratio
                section.numbers[f"providers_wall_ratio_{name.lower()}{suffix}"] = median(
                    paired_ratios(walls, [w for w, _ in samples[0]])
                )
    return section


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.providers", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    with ScriptedServer() as server:
        section = measure(server, rounds=3 if args.quick else 15, calls=20 if args.quick else 100)
    for row in section.rows:
        print(" | ".join(row.cells()))


if __name__ == "__main__":
    main()
