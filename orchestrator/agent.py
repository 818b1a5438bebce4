"""Agents: a model, tools and instructions, registered by name.

Defining an `Agent` registers it in this process under its name. A worker imports the module
that defines the agents (`ratchet worker --app myproject.agents`), so only the name and the run
id cross the broker; code, models and credentials stay in each process.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal, overload

from pydantic import BaseModel

from orchestrator import state
from orchestrator.errors import AgentNotFoundError, ConfigurationError
from orchestrator.events import RunEvent
from orchestrator.models.base import Model, ToolSpec
from orchestrator.retry import RetryPolicy
from orchestrator.run import RunOutput, RunRecord
from orchestrator.tools import Tool, Toolkit, flatten
from orchestrator.tools.tool import queue_name, tools_queue

if TYPE_CHECKING:
    from orchestrator.client import Client, RunHandle


#: Agno's default number of earlier runs in the context when history is on.
DEFAULT_HISTORY_RUNS = 3


def _history_runs(name: str, num_history_runs: int | None) -> int:
    """`num_history_runs` checked, or Agno's default when not given."""
    if num_history_runs is None:
        return DEFAULT_HISTORY_RUNS
    if isinstance(num_history_runs, bool) or not isinstance(num_history_runs, int) or num_history_runs < 1:
        raise ConfigurationError(
            f"{name}: num_history_runs must be a whole number of runs, 1 or more; got {num_history_runs!r}"
        )
    return num_history_runs


def _session_state(name: str, given: Mapping[str, Any] | None) -> dict[str, Any]:
    """An agent's `session_state=` checked and made storable ({} when not given)."""
    try:
        return {} if given is None else state.normalised(given)
    except state.StateError as exc:
        raise ConfigurationError(f"{name}: {exc}") from None


def _check(name: str, model: Model, output_schema: object, concurrency_key: object) -> None:
    """Refuse an agent definition whose name, model, schema or key function cannot work."""
    if not name or not isinstance(name, str):
        raise ConfigurationError("an agent needs a non-empty name: it is how workers find it")
    if not isinstance(model, Model):
        raise ConfigurationError(f"{name}: model must be a Model (e.g. OpenAIChat(id=...)), got {model!r}")
    if output_schema is not None and not (isinstance(output_schema, type) and issubclass(output_schema, BaseModel)):
        raise ConfigurationError(f"{name}: output_schema must be a pydantic model class, got {output_schema!r}")
    if concurrency_key is not None and not callable(concurrency_key):
        raise ConfigurationError(f"{name}: concurrency_key must be a function of the run, got {concurrency_key!r}")


class Agent:
    """An LLM agent. `run()` enqueues a durable run on the workers and waits for it."""

    kind = "agent"

    def __init__(
        self,
        *,
        name: str,
        model: Model,
        tools: Sequence[Tool | Toolkit | Callable[..., Any]] = (),
        instructions: str | Sequence[str] | None = None,
        description: str | None = None,
        role: str | None = None,
        retries: int = 3,
        retry_policy: RetryPolicy | None = None,
        max_tool_batches: int = 50,
        output_schema: type[BaseModel] | None = None,
        add_history_to_context: bool = False,
        num_history_runs: int | None = None,
        session_state: Mapping[str, Any] | None = None,
        queue: str | None = None,
        concurrency_key: Callable[[RunRecord], str | None] | None = None,
        client: Client | None = None,
    ) -> None:
        _check(name, model, output_schema, concurrency_key)
        self.name = name
        self.model = model
        self.tools = flatten(tools)
        self._toolkit_instructions = [
            t.instructions for t in tools if isinstance(t, Toolkit) and t.add_instructions and t.instructions
        ]
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ConfigurationError(f"{name}: two tools share a name: {sorted(names)}")
        self.instructions = instructions
        self.description = description
        #: What this agent does, shown to a team leader that may delegate to it.
        self.role = role
        #: How many times a transient model error (429, 5xx, timeout) is retried within one step.
        self.retries = retries
        #: Backoff between those retries (exponential with jitter; Retry-After is honoured).
        self.retry_policy = retry_policy or RetryPolicy()
        #: A guard against a model that never stops calling tools: the run errors after this many.
        self.max_tool_batches = max_tool_batches
        #: The pydantic model the final answer must follow (asked of the model as a JSON schema and
        #: validated; an invalid reply is retried as a model error): `orchestrator.structured`.
        self.output_schema = output_schema
        #: Put the session's earlier runs before the new input (Agno's name; off by default, as
        #: in Agno): `orchestrator.store.history` says which runs and how they are fixed.
        self.add_history_to_context = bool(add_history_to_context)
        #: How many earlier runs of the session the context includes (Agno's default: 3).
        self.num_history_runs = _history_runs(name, num_history_runs)
        #: The state a session starts with (Agno's `session_state=`): each run's first step adds
        #: the keys the session's stored state lacks (`orchestrator.state`).
        self.session_state = _session_state(name, session_state)
        #: Its steps' queue (None: the defaults); its tools' one takes their batches (`routing`).
        self.queue = None if queue is None else queue_name(queue, f"agent {name}")
        self.tool_queue = tools_queue(name, self.tools)
        #: Which runs RATCHET_MAX_RUNS_PER_KEY counts together (`orchestrator.limits`): a function of
        #: the run's record, None for a run it does not count; None: the run's `user_id`.
        self.concurrency_key = concurrency_key
        self._client = client
        register(self)

    # ---------------------------------------------------------------- what the worker uses

    def tool(self, name: str) -> Tool | None:
        """The tool called `name`, if this agent has one."""
        return next((t for t in self.all_tools() if t.name == name), None)

    def all_tools(self) -> list[Tool]:
        """Every tool the model is offered (a team adds its delegation tools)."""
        return list(self.tools)

    def tool_specs(self) -> list[ToolSpec]:
        """The tools as the model sees them."""
        return [t.spec for t in self.all_tools()]

    def render_system_message(self) -> str | None:
        """The system message of a new run: description and instructions, or None if neither."""
        parts: list[str] = []
        if self.description:
            parts.append(self.description)
        if isinstance(self.instructions, str):
            parts.append(self.instructions)
        elif self.instructions:
            parts.append("\n".join(f"- {line}" for line in self.instructions))
        parts.extend(self._toolkit_instructions)
        return "\n\n".join(parts) or None

    # ---------------------------------------------------------------- what a producer uses

    @property
    def client(self) -> Client:
        """The producer client: the one given, else the one `use_client` installed (as
        `orchestrator.testing.in_memory` does), else one from the environment's settings."""
        if self._client is not None:
            return self._client
        if _default_client is not None:
            return _default_client
        from orchestrator.client import Client

        return Client()  # light: the store and the dispatcher behind it are cached per process

    def start(
        self,
        input: str,
        *,
        session_id: str | None = None,
        run_id: str | None = None,
        user_id: str | None = None,
        session_state: Mapping[str, Any] | None = None,
        stream: bool = False,
        priority: int | None = None,
    ) -> RunHandle:
        """Enqueue a run and return at once with its handle. `user_id`, `session_state` (merged
        over the session's stored state) and `priority` (0-9, higher first): see `Client.start`."""
        return self.client.start(
            self.name, input=input, session_id=session_id, run_id=run_id, stream=stream, user_id=user_id,
            session_state=session_state, priority=priority,
        )  # fmt: skip

    @overload
    def run(
        self, input: str, *, session_id: str | None = None, timeout: float | None = None,
        stream: Literal[False] = False, user_id: str | None = None, session_state: Mapping[str, Any] | None = None,
        priority: int | None = None,
    ) -> RunOutput: ...  # fmt: skip

    @overload
    def run(
        self, input: str, *, session_id: str | None = None, timeout: float | None = None, stream: Literal[True],
        user_id: str | None = None, session_state: Mapping[str, Any] | None = None, priority: int | None = None,
    ) -> Iterator[RunEvent]: ...  # fmt: skip

    def run(
        self, input: str, *, session_id: str | None = None, timeout: float | None = None, stream: bool = False,
        user_id: str | None = None, session_state: Mapping[str, Any] | None = None, priority: int | None = None,
    ) -> RunOutput | Iterator[RunEvent]:  # fmt: skip
        """Enqueue a run and wait for it. Returns the output whatever the status (ERROR too),
        with the session's state after it (`RunOutput.session_state`).

        `stream=True` (Agno's shape): enqueue a streamed run and return an iterator of its events
        (`Client.stream`), text deltas included, that ends when the run is final or PAUSED."""
        handle = self.start(
            input, session_id=session_id, user_id=user_id, session_state=session_state, stream=stream,
            priority=priority,
        )  # fmt: skip
        return self.client.stream(handle.run_id, timeout=timeout) if stream else handle.wait(timeout)

    @overload
    async def arun(
        self, input: str, *, session_id: str | None = None, timeout: float | None = None,
        stream: Literal[False] = False, user_id: str | None = None, session_state: Mapping[str, Any] | None = None,
        priority: int | None = None,
    ) -> RunOutput: ...  # fmt: skip

    @overload
    async def arun(
        self, input: str, *, session_id: str | None = None, timeout: float | None = None, stream: Literal[True],
        user_id: str | None = None, session_state: Mapping[str, Any] | None = None, priority: int | None = None,
    ) -> AsyncIterator[RunEvent]: ...  # fmt: skip

    async def arun(
        self, input: str, *, session_id: str | None = None, timeout: float | None = None, stream: bool = False,
        user_id: str | None = None, session_state: Mapping[str, Any] | None = None, priority: int | None = None,
    ) -> RunOutput | AsyncIterator[RunEvent]:  # fmt: skip
        """`run()` for asyncio: the wait does not block the event loop. With `stream=True`,
        `async for event in await agent.arun(input, stream=True)`."""
        client = self.client
        handle = await asyncio.to_thread(
            self.start, input, session_id=session_id, user_id=user_id, session_state=session_state, stream=stream,
            priority=priority,
        )  # fmt: skip
        return client.astream(handle.run_id, timeout=timeout) if stream else await handle.await_(timeout)

    def get_session_state(self, session_id: str, *, user_id: str | None = None) -> dict[str, Any]:
        """The session's state as stored now (Agno's `get_session_state`); {} for a new session,
        and with `user_id` for a session that is not that user's (`Client.get_session_state`)."""
        return self.client.get_session_state(session_id, user_id=user_id)

    def continue_run(
        self,
        run_id: str,
        *,
        input: str | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
        fork_key: str | None = None,
    ) -> RunOutput:
        """Continue a run and wait: ERROR resumes in place (same run_id), COMPLETED forks (the
        same fork for the same input; another `fork_key` forks again, see `Client.continue_run`).

        `session_id` is accepted for Agno compatibility; the run id alone finds the run."""
        return self.client.continue_run(run_id, input=input, fork_key=fork_key).wait(timeout)

    async def acontinue_run(
        self,
        run_id: str,
        *,
        input: str | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
        fork_key: str | None = None,
    ) -> RunOutput:
        """`continue_run()` for asyncio."""
        handle = await asyncio.to_thread(self.client.continue_run, run_id, input=input, fork_key=fork_key)
        return await handle.await_(timeout)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, model={self.model.describe()})"


_registry_lock = threading.Lock()
_registry: dict[str, Agent] = {}
_default_client: Client | None = None
#: Where each registered name was defined (see `_definition_site`).
_sites: dict[str, _Site] = {}


@dataclass(frozen=True)
class _Site:
    """The line of user code that built an agent: the file (resolved) and line number are its
    identity; `where` says it for people."""

    file: str
    line: int
    where: str


def use_client(client: Client | None) -> Client | None:
    """Make `client` the producer client of every agent built without one (None: each builds
    one from the environment again); returns the one it replaces, to restore it afterwards."""
    global _default_client
    with _registry_lock:
        previous, _default_client = _default_client, client
    return previous


def register(agent: Agent) -> None:
    """Register an agent under its name.

    A name belongs to one definition: workers find agents by name, so two different definitions
    of one name (two modules, two lines) would let import order pick which one runs. That is a
    ConfigurationError naming both. The same line defining it again is the same definition and
    replaces it: a module imported again or reloaded, a file run as `__main__` and imported under
    its own name too, a parametrized test, a notebook cell run again unchanged.
    """
    site = _definition_site(agent)
    with _registry_lock:
        earlier = _sites.get(agent.name)
        if earlier is not None and (earlier.file, earlier.line) != (site.file, site.line):
            raise ConfigurationError(
                f"two different agents are named {agent.name!r}: one defined at {earlier.where}, another at "
                f"{site.where}. Workers find agents by name, so a name needs a single definition: rename one, "
                "or define it once in a module and import it where it is needed"
            )
        _registry[agent.name] = agent
        _sites[agent.name] = site


def _definition_site(agent: Agent) -> _Site:
    """The frame that called the agent's constructor: past `Agent.__init__`, and past the
    `__init__` of Team or of any subclass that builds the same object."""
    here = inspect.currentframe()
    register_frame = here.f_back if here is not None else None
    del here  # a frame kept in its own locals would be a reference cycle
    frame = register_frame
    while frame is not None and not _constructs(frame, agent):
        frame = frame.f_back
    while frame is not None and _constructs(frame, agent):
        frame = frame.f_back
    if frame is None and register_frame is not None:  # register() called outside a constructor
        frame = register_frame.f_back
    if frame is None:  # an interpreter that shows no frames: every definition is one place
        return _Site(file="?", line=0, where="an unknown place")
    code = frame.f_code
    module = frame.f_globals.get("__name__", "?")
    scope = f"module {module}" if code.co_qualname == "<module>" else f"{module}.{code.co_qualname}"
    return _Site(
        file=os.path.realpath(code.co_filename),
        line=frame.f_lineno,
        where=f"{code.co_filename}:{frame.f_lineno} ({scope})",
    )


def _constructs(frame: FrameType, agent: Agent) -> bool:
    return frame.f_code.co_name == "__init__" and frame.f_locals.get("self") is agent


def registered() -> list[Agent]:
    """Every agent and team registered in this process."""
    with _registry_lock:
        return list(_registry.values())


def find_agent(name: str) -> Agent | None:
    """The agent or team registered under `name` in this process, or None."""
    with _registry_lock:
        return _registry.get(name)


def get_agent(name: str) -> Agent:
    """The agent or team registered under `name` in this process."""
    with _registry_lock:
        found = _registry.get(name)
    if found is None:
        known = ", ".join(sorted(_registry)) or "none"
        raise AgentNotFoundError(
            f"no agent named {name!r} is registered in this process (known: {known}); "
            "start the worker with --app naming the module that defines it"
        )
    return found
