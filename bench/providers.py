"""#26 point 6: a step's model call on each provider adapter, against the OpenAI adapter's.

In one process, against the same scripted server (its Chat Completions, its Messages API and its
Gemini API), run as a process of its own (in this one, its work would take the GIL from the adapters'): the same
transcript (a system message, the user's, and `HISTORY` tool batches with their results: what a
model step of a run some way in sends), answered the same way by the same script, through each
adapter's `invoke` as the model step calls it (its SDK's client, cached, over HTTP). The rest of a
step (the claim, the context, the commit) is the same whatever the provider, so this is the part a
provider can make dearer, measured alone. Each round times `calls` calls of every adapter in turn
(OpenAIChat first), its figures the median call and the caller's CPU per call (the thread's time:
the adapter, its SDK and its HTTP client); the ratios are the medians of the per-round ratios to
OpenAIChat's, shown with no target: the call is not the issue's figure, and its wall time also
holds the scripted server's work, which is not the same for each wire format (it builds Gemini's
and Anthropic's replies as their SDKs' types, 0.3 to 0.4 ms a call more than its Chat Completions
replies on this machine). The caller's CPU is what the adapter itself costs: Gemini's is 1.1 to
1.2 times OpenAIChat's (the SDK's request building, and the transcript made Gemini's JSON, each
call's arguments decoded into it), Claude's about the same as OpenAIChat's.

Then whole steps, the issue's figure: `calls // 10` runs a round (at least one) of
`Agent(model=...)` per adapter, inline on a SQLite store (`orchestrator.testing.in_memory`: the
step engine a worker runs, without the broker), each `BATCHES` model steps that call two tools,
their tool steps and the final answer; its figure the time per step, its ratio the same median of
per-round ratios (target ≤ 1.10).

`PROVIDERS` lists the adapters measured; `python -m bench --only providers` runs it alone.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from bench.stats import Row, Section, interleave, median, paired_ratios
from orchestrator.messages import Message, ToolCall
from orchestrator.models import Claude, Gemini, OpenAIChat
from orchestrator.models.base import CallContext, Model, ToolSpec
from orchestrator.producer import Agent
from orchestrator.status import RunStatus
from orchestrator.testing.anthropic_wire import anthropic_base_url
from orchestrator.testing.gemini_wire import gemini_base_url
from orchestrator.testing.inmemory import in_memory
from orchestrator.testing.script import ScriptConfig

KEY = "bench-key-for-the-scripted-model"
#: The tool batches of a run measured step by step.
BATCHES = 5
#: Tool batches already in the transcript.
HISTORY = 10
TARGET = 1.10
TOOL = ToolSpec(
    name="lookup",
    description="Look a thing up.",
    parameters={"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
)


@dataclass(frozen=True)
class Served:
    """Where the scripted server listens (`url`: its OpenAI base URL, as `ScriptedServer.url`)."""

    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"


@contextmanager
def server_process() -> Iterator[Served]:
    """The scripted server in a process of its own, with its default script."""
    script = ScriptConfig(tool_batches=BATCHES, calls_per_batch=2, chat=True).model_dump_json()
    argv = [sys.executable, "-m", "orchestrator.testing.server", "--port", "0", "--config", script]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # "scripted model listening on http://host:port/v1"
        host, _, port = line.strip().rsplit("/", 2)[-2].partition(":")
        yield Served(host, int(port))
    finally:
        process.terminate()
        process.wait(10)


#: The adapters measured against OpenAIChat, each built for the scripted server.
PROVIDERS: list[tuple[str, Callable[[Served], Model]]] = [
    ("claude", lambda server: Claude(id="bench-claude", api_key=KEY, base_url=anthropic_base_url(server.url))),
    ("gemini", lambda server: Gemini(id="bench-gemini", api_key=KEY, base_url=gemini_base_url(server))),
]


def transcript() -> list[Message]:
    """A system message, the user's, and `HISTORY` batches of two calls with their results."""
    messages = [Message(role="system", content="Look things up, then answer."), Message(role="user", content="go")]
    for batch in range(HISTORY):
        calls = [
            ToolCall(id=f"call_{batch}_{i}", name="lookup", arguments=f'{{"query": "q{batch}{i}"}}') for i in (0, 1)
        ]
        messages.append(Message(role="assistant", tool_calls=[c.to_openai() for c in calls]))
        messages += [
            Message(role="tool", tool_call_id=c.id, tool_name="lookup", content=f"result {c.id} " * 8) for c in calls
        ]
    return messages


def measure(*, rounds: int, calls: int) -> Section:
    runs = max(1, calls // 10)  # a run is 11 steps of a few ms: five a round in a full run
    with server_process() as server:
        section = _measure(server, rounds=rounds, calls=calls)
        _measure_steps(server, section, rounds=rounds, runs=runs)
    return section


def lookup(query: str) -> str:
    """Look a thing up (the benchmark's tool: its result at once)."""
    return f"found {query}"


def _measure_steps(server: Served, section: Section, *, rounds: int, runs: int) -> None:
    builds = [("openai", lambda s: OpenAIChat(id="bench-openai", api_key=KEY, base_url=s.url)), *PROVIDERS]
    agents = [
        (name, Agent(name=f"bench-providers-{name}", model=build(server), tools=[lookup])) for name, build in builds
    ]
    with in_memory():

        def per_step(agent: Agent) -> Callable[[], float]:
            def one() -> float:
                started = time.perf_counter()
                for _ in range(runs):
                    out = agent.run("go")
                    assert out.status == RunStatus.COMPLETED, out.error
                steps = (2 * BATCHES + 1) * runs
                return (time.perf_counter() - started) * 1000 / steps

            return one

        for _, agent in agents:
            per_step(agent)()
        samples = interleave(rounds, *(per_step(agent) for _, agent in agents))
    setup = f"inline on SQLite, {runs} runs a round of {BATCHES} two-call batches ({2 * BATCHES + 1} steps)"
    section.rows.append(Row("Step, OpenAIChat", setup, samples[0], "ms", digits=3))
    for (name, agent), mine in zip(agents[1:], samples[1:], strict=True):
        ratio = median(paired_ratios(mine, samples[0]))
        section.rows.append(
            Row(f"Step, {type(agent.model).__name__}", setup, mine, "ms", ratio=ratio, ratio_note="vs OpenAIChat",
                target=f"≤ {TARGET:.2f}x", met=ratio <= TARGET, digits=3)
        )  # fmt: skip
        section.numbers[f"provider_step_ratio_{name}"] = ratio


def _measure(server: Served, *, rounds: int, calls: int) -> Section:
    openai = OpenAIChat(id="bench-openai", api_key=KEY, base_url=server.url)
    models = [("openai", openai), *((name, build(server)) for name, build in PROVIDERS)]
    messages = transcript()
    cpu: dict[str, list[float]] = {name: [] for name, _ in models}

    def timing(name: str, model: Model) -> Callable[[], float]:
        def one() -> float:
            samples = []
            spent = time.thread_time()
            for seq in range(calls):
                started = time.perf_counter()
                model.invoke(messages, [TOOL], context=CallContext(run_id="bench-providers", seq=seq))
                samples.append((time.perf_counter() - started) * 1000)
            cpu[name].append((time.thread_time() - spent) / calls * 1000)
            return median(samples)

        return one

    for name, model in models:  # warm each client and its connection
        timing(name, model)()
        cpu[name].clear()
    samples = interleave(rounds, *(timing(name, model) for name, model in models))
    setup = f"{len(messages)} messages, {calls} calls a round, the scripted server in its own process"
    rows = [
        Row("Model call, OpenAIChat", setup, samples[0], "ms", digits=3),
        Row("Model call's CPU in the caller, OpenAIChat", setup, cpu["openai"], "ms", digits=3),
    ]
    section = Section("Provider adapters", rows=rows)
    section.numbers["provider_call_ms_openai"] = median(samples[0])
    for (name, model), mine in zip(models[1:], samples[1:], strict=True):
        ratio = median(paired_ratios(mine, samples[0]))
        cpu_ratio = median(paired_ratios(cpu[name], cpu["openai"]))
        adapter = type(model).__name__
        rows += [
            Row(f"Model call, {adapter}", setup, mine, "ms", ratio=ratio,
                ratio_note="vs OpenAIChat (the scripted server's work included)", digits=3),
            Row(f"Model call's CPU in the caller, {adapter}", setup, cpu[name], "ms", ratio=cpu_ratio,
                ratio_note="vs OpenAIChat", digits=3),
        ]  # fmt: skip
        section.numbers[f"provider_ratio_{name}"] = ratio
        section.numbers[f"provider_cpu_ratio_{name}"] = cpu_ratio
        section.numbers[f"provider_call_ms_{name}"] = median(mine)
    return section


if __name__ == "__main__":
    result = measure(rounds=5, calls=50)
    for row in result.rows:
        print(" | ".join(row.cells()))
