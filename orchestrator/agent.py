"""Agent definitions: a model, tools and instructions, registered by name.

Defining an agent registers it in this process under its name. A worker imports the module
that defines the agents (`ratchet worker --app myproject.agents`), so only the name and the run
id cross the broker; code, models and credentials stay in each process.

An `AgentDefinition` is what the worker runs and the domain reads (routing, steps, delegation):
it knows no producer. `orchestrator.Agent` (in `orchestrator.producer`) is the same definition
with Agno's `run()` and friends, which start runs through a `Client`.
"""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any, NotRequired, Unpack

from pydantic import BaseModel

from orchestrator import state, validation
from orchestrator.budgets import BudgetOptions, Budgets
from orchestrator.errors import AgentNotFoundError, ConfigurationError, InvalidInputError
from orchestrator.models.base import Model, ToolSpec
from orchestrator.models.fallback import FallbackChain, FallbackConfig
from orchestrator.requirements import PausePolicy
from orchestrator.retry import RetryPolicy
from orchestrator.run import RunRecord
from orchestrator.tools import Tool, Toolkit, flatten
from orchestrator.tools.tool import queue_name, tools_queue

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


def _queue_options(name: str, run_timeout: float | None, max_queued: int | None) -> tuple[float | None, int | None]:
    """`run_timeout` (seconds, above 0, at most `validation.RUN_TIMEOUT_MAX`) and `max_queued` (a
    whole number of runs, 1 or more) checked; None where not given."""
    if run_timeout is not None:
        try:
            run_timeout = validation.run_timeout(run_timeout)
        except InvalidInputError as exc:
            raise ConfigurationError(f"{name}: {exc}") from None
    if max_queued is not None and (isinstance(max_queued, bool) or not isinstance(max_queued, int) or max_queued < 1):
        raise ConfigurationError(f"{name}: max_queued must be a whole number of runs, 1 or more; got {max_queued!r}")
    return run_timeout, max_queued


def _flag(name: str, option: str, value: object) -> bool:
    """A yes-or-no option checked: True or False, nothing that only looks like one ("no" is truthy)."""
    if not isinstance(value, bool):
        raise ConfigurationError(f"{name}: {option} must be True or False, got {value!r}")
    return value


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


def _check_prices(agent: AgentDefinition) -> None:
    """A cost budget counts the cost stored with each reply, which a model without prices leaves
    unknown: refuse one that would count such a model (the agent's, or a team member's at any
    depth) rather than a limit that is never reached."""
    if not agent.budgets.counts_cost:
        return
    for definition in agent.definitions():
        for model in definition.fallback.models:
            if model.prices is not None:
                continue
            what = "model" if model is definition.model else "fallback model"
            whose = f"its {what}" if definition is agent else f"its member {definition.name}'s {what}"
            raise ConfigurationError(
                f"{agent.kind} {agent.name}: a cost budget (max_cost) counts what each reply cost, and {whose} "
                f"({model.describe()}) has no prices: give it prices=Prices(input=..., output=...), "
                "or set max_tokens instead"
            )


def _tools_of(name: str, given: Sequence[Tool | Toolkit | Callable[..., Any]]) -> tuple[list[Tool], list[str]]:
    """An agent's tools, toolkits flattened (two of one name refused), and its toolkits' instructions."""
    tools = flatten(given)
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise ConfigurationError(f"{name}: two tools share a name: {sorted(names)}")
    instructions = [t.instructions for t in given if isinstance(t, Toolkit) and t.add_instructions and t.instructions]
    return tools, instructions


class AgentOptions(BudgetOptions):
    """The arguments an agent definition is built from, as `AgentDefinition.__init__` takes them:
    what `orchestrator.Agent` passes on to it besides its producer client (its budgets too)."""

    name: str
    model: Model
    fallback_models: NotRequired[Sequence[Model] | None]
    fallback_config: NotRequired[FallbackConfig | None]
    tools: NotRequired[Sequence[Tool | Toolkit | Callable[..., Any]]]
    instructions: NotRequired[str | Sequence[str] | None]
    description: NotRequired[str | None]
    role: NotRequired[str | None]
    retries: NotRequired[int]
    retry_policy: NotRequired[RetryPolicy | None]
    max_tool_batches: NotRequired[int]
    output_schema: NotRequired[type[BaseModel] | None]
    add_history_to_context: NotRequired[bool]
    num_history_runs: NotRequired[int | None]
    serialize_session_runs: NotRequired[bool]
    session_state: NotRequired[Mapping[str, Any] | None]
    queue: NotRequired[str | None]
    concurrency_key: NotRequired[Callable[[RunRecord], str | None] | None]
    pause_timeout: NotRequired[float | None]
    on_timeout: NotRequired[str | None]
    run_timeout: NotRequired[float | None]
    max_queued: NotRequired[int | None]


class AgentDefinition:
    """An LLM agent as the workers run it: its model, tools, instructions and limits, registered
    under its name when built. It starts nothing: `orchestrator.Agent` adds `run()`."""

    kind = "agent"

    def __init__(
        self,
        *,
        name: str,
        model: Model,
        fallback_models: Sequence[Model] | None = None,
        fallback_config: FallbackConfig | None = None,
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
        serialize_session_runs: bool = False,
        session_state: Mapping[str, Any] | None = None,
        queue: str | None = None,
        concurrency_key: Callable[[RunRecord], str | None] | None = None,
        pause_timeout: float | None = None,
        on_timeout: str | None = None,
        run_timeout: float | None = None,
        max_queued: int | None = None,
        **budgets: Unpack[BudgetOptions],
    ) -> None:
        _check(name, model, output_schema, concurrency_key)
        self.name = name
        self.model = model
        #: Agno's two ways to name the models tried when `model` fails for good, then them numbered.
        self.fallback_models, self.fallback_config = list(fallback_models or ()), fallback_config
        self._fallback = FallbackChain.of(name, model, fallback_models, fallback_config)
        self.tools, self._toolkit_instructions = _tools_of(name, tools)
        self.instructions, self.description = instructions, description
        #: What this agent does, shown to a team leader that may delegate to it.
        self.role = role
        #: How many times a transient model error (429, 5xx, timeout) is retried within a step, per model.
        self.retries = retries
        #: Backoff between those retries (exponential with jitter; Retry-After is honoured).
        self.retry_policy = retry_policy or RetryPolicy()
        #: A guard against a model that never stops calling tools: the run errors past this many.
        self.max_tool_batches = max_tool_batches
        #: The pydantic model the final answer must follow (`orchestrator.structured`).
        self.output_schema = output_schema
        self._session_options(add_history_to_context, num_history_runs, serialize_session_runs, session_state)
        #: Its steps' queue (None: the defaults); its tools' one takes their batches (`routing`).
        self.queue = None if queue is None else queue_name(queue, f"agent {name}")
        self.tool_queue = tools_queue(name, self.tools)
        pause = PausePolicy.of(f"agent {name}", pause_timeout, on_timeout)
        self._bound_runs(
            concurrency_key, pause, _queue_options(f"{self.kind} {name}", run_timeout, max_queued), budgets
        )
        _check_prices(self)
        register(self)

    def _bound_runs(
        self,
        concurrency_key: Callable[[RunRecord], str | None] | None,
        pause: PausePolicy,
        queued: tuple[float | None, int | None],
        budgets: BudgetOptions,
    ) -> None:
        """What bounds its runs, as `__init__` checked it."""
        #: Which runs RATCHET_MAX_RUNS_PER_KEY counts together, a function of the run's record
        #: (None: not counted; not given: the run's `user_id`): `orchestrator.limits`.
        self.concurrency_key = concurrency_key
        #: A paused call's deadline (a tool's own wins): `orchestrator.requirements`.
        self.pause_policy = pause
        #: The deadline of each run a producer starts of it, in seconds from the start, PAUSED
        #: time included (a start's `run_timeout=` wins; None: none), and the most of its runs
        #: QUEUED at once for a start to be taken (None: RATCHET_MAX_QUEUED_PER_AGENT): `orchestrator.starting`.
        self.run_timeout, self.max_queued = queued
        #: Limits that pause a run before a model call (max_tokens=, session_max_cost=, ...): `orchestrator.budgets`.
        self.budgets = Budgets.of(f"{self.kind} {self.name}", **budgets)

    def _session_options(
        self, history: bool, num_history_runs: int | None, serialize: bool, session_state: Mapping[str, Any] | None
    ) -> None:
        """What the agent's runs share with the other runs of their session."""
        #: Put the session's earlier runs before the new input (Agno's name and default): `orchestrator.store.history`.
        self.add_history_to_context = bool(history)
        #: How many earlier runs of the session the context includes (Agno's default: 3).
        self.num_history_runs = _history_runs(self.name, num_history_runs)
        #: Runs of one session one at a time, in the order they were started: a run's first step
        #: waits until every run of its session started before it has stopped (`store/turns.py`).
        self.serialize_session_runs = _flag(self.name, "serialize_session_runs", serialize)
        #: The state a session starts with (Agno's): a run's first step adds the keys it lacks (`orchestrator.state`).
        self.session_state = _session_state(self.name, session_state)

    def pause_policy_of(self, tool: Tool) -> PausePolicy:
        """The deadline of a paused call of `tool`: the tool's own, else the agent's."""
        return tool.pause_policy or self.pause_policy

    def tool(self, name: str) -> Tool | None:
        """The tool called `name`, if this agent has one."""
        return next((t for t in self.all_tools() if t.name == name), None)

    def all_tools(self) -> list[Tool]:
        """Every tool the model is offered (a team adds its delegation tools)."""
        return list(self.tools)

    @property
    def fallback(self) -> FallbackChain:
        """The agent's model, then its fallback models, numbered as a step's `model_index` counts
        them; led by `model` as it is now, so a model set after the agent was defined is the one
        called (as before fallbacks existed)."""
        self._fallback = self._fallback.led_by(self.model)
        return self._fallback

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

    def definitions(self) -> list[AgentDefinition]:
        """This definition and those it runs with: a team adds its members' (and theirs)."""
        return [self]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, model={self.model.describe()})"


_registry_lock = threading.Lock()
_registry: dict[str, AgentDefinition] = {}
#: Where each registered name was defined (see `_definition_site`).
_sites: dict[str, _Site] = {}


@dataclass(frozen=True)
class _Site:
    """The line of user code that built an agent: the file (resolved) and line number are its
    identity; `where` says it for people."""

    file: str
    line: int
    where: str


def register(agent: AgentDefinition) -> None:
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


def _definition_site(agent: AgentDefinition) -> _Site:
    """The frame that called the agent's constructor: past `AgentDefinition.__init__`, and past
    the `__init__` of a team, of `orchestrator.Agent`, or of any subclass that builds the same object."""
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


def _constructs(frame: FrameType, agent: AgentDefinition) -> bool:
    return frame.f_code.co_name == "__init__" and frame.f_locals.get("self") is agent


def registered() -> list[AgentDefinition]:
    """Every agent and team registered in this process."""
    with _registry_lock:
        return list(_registry.values())


def find_agent(name: str) -> AgentDefinition | None:
    """The agent or team registered under `name` in this process, or None."""
    with _registry_lock:
        return _registry.get(name)


def get_agent(name: str) -> AgentDefinition:
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
