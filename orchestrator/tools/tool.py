"""Tools: plain Python functions the model may call.

A tool's JSON schema comes from its signature and docstring (`schema.py`). The model's arguments are
validated with pydantic (unknown keys forbidden, types checked) before the function runs; invalid
arguments, like an exception raised by the tool, become a tool message with
`tool_call_error=True` that the model sees on its next turn. They never fail the run.

A tool may take a `ToolContext` parameter (any name, annotated `ToolContext`): it carries the
run id, an idempotency key `run_id:tool_call_id` that stays the same when a step is retried, the
user id, and the session's state (`ToolContext.session_state`). A parameter named
`session_state` gets that state too (as Agno passes it), and, like the context, is not shown to
the model. What the call changes in the state is stored with its result (`orchestrator.state`).

A person in the loop (Agno's flags, `orchestrator.requirements`): `requires_confirmation=True`
pauses the run before the call runs until a person approves or rejects it;
`requires_user_input=True` with `user_input_fields=[...]` (empty or None: every parameter) takes
those parameters from a person instead of the model (they leave the model's schema);
`external_execution=True` never runs the function here: the caller runs it and supplies the
result. `pause_timeout=` seconds and `on_timeout=` say what happens when nobody decides in time.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, overload

from pydantic import ValidationError

from orchestrator.errors import ConfigurationError, ToolArgumentsError
from orchestrator.models.base import ToolSpec
from orchestrator.requirements import PausePolicy, PauseType, pause_type_of
from orchestrator.state import CallState
from orchestrator.tools.loop import process_loop
from orchestrator.tools.schema import docstring_parts, signature_model
from orchestrator.untrusted import safe_str

#: A tool parameter of this name is given the session's state (Agno's convention), not the model's.
STATE_PARAM = "session_state"


@dataclass(frozen=True, kw_only=True)
class ToolContext:
    """What a running tool may know about its call."""

    run_id: str
    tool_call_id: str
    session_id: str | None = None
    #: Who the run is for, as its producer said.
    user_id: str | None = None
    #: Where `session_state` comes from: the engine's view of the session for this call (a
    #: context built without one, in a test of a tool, has a state of its own, initially empty).
    state: CallState = field(default_factory=lambda: CallState(dict), repr=False, compare=False)

    @property
    def idempotency_key(self) -> str:
        """`run_id:tool_call_id`: the same on every retry of this call; pass it to side effects."""
        return f"{self.run_id}:{self.tool_call_id}"

    @property
    def session_state(self) -> dict[str, Any]:
        """The session's state, a dict to read and change in place (Agno's `session_state`): read
        when the call first uses it; what the call changed is stored with its result, once. A
        call that raises changes nothing. See `orchestrator.state`."""
        return self.state.open()


class Tool:
    """A callable the model can use. Build with `@tool` or pass a plain function to `tools=[...]`."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        at_most_once: bool = False,
        queue: str | None = None,
        requires_confirmation: bool = False,
        requires_user_input: bool = False,
        user_input_fields: list[str] | None = None,
        external_execution: bool = False,
        pause_timeout: float | None = None,
        on_timeout: str | None = None,
    ) -> None:
        self.fn = fn
        summary, params = docstring_parts(fn.__doc__)
        name = name or fn.__name__
        self._settle(
            name=name,
            description=description or summary or name,
            at_most_once=at_most_once,
            queue=queue,
            requires_confirmation=requires_confirmation,
            requires_user_input=requires_user_input,
            external_execution=external_execution,
            pause_timeout=pause_timeout,
            on_timeout=on_timeout,
        )
        self._context_param, self._args_model = signature_model(fn, self.name, params, ToolContext, STATE_PARAM)
        self._wants_state = STATE_PARAM in inspect.signature(fn).parameters and self._context_param != STATE_PARAM
        self.user_input_fields = self._user_fields(user_input_fields) if self.requires_user_input else []

    def _settle(
        self,
        *,
        name: str,
        description: str,
        at_most_once: bool,
        queue: str | None,
        requires_confirmation: bool,
        requires_user_input: bool,
        external_execution: bool,
        pause_timeout: float | None,
        on_timeout: str | None,
    ) -> None:
        """The settings of every tool, whatever it calls (a function, an MCP server's tool)."""
        self.name = name
        self.description = description
        #: If True, a call that started and never finished is not run again (docs/guarantees.md).
        self.at_most_once = at_most_once
        #: The queue of the tool batches that call it (workers that can run it consume it: a GPU
        #: host, a private network); None: the agent's queue, or the default tools queue.
        self.queue = None if queue is None else queue_name(queue, f"tool {self.name}")
        #: Agno's human-in-the-loop flags (see the module's docstring).
        self.requires_confirmation = bool(requires_confirmation)
        self.requires_user_input = bool(requires_user_input)
        self.external_execution = bool(external_execution)
        #: Its own deadline for a pause (None: the agent's, if any).
        self.pause_policy = (
            PausePolicy.of(f"tool {self.name}", pause_timeout, on_timeout)
            if pause_timeout is not None or on_timeout is not None
            else None
        )

    def _user_fields(self, given: list[str] | None) -> list[str]:
        """The parameters a person fills in: those named (each must be one), or all of them."""
        known = list(self._args_model.model_fields)
        if not given:
            return known
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise ConfigurationError(
                f"tool {self.name}: user_input_fields names {unknown}, which are not its parameters {known}"
            )
        return [f for f in known if f in given]

    @property
    def pause_type(self) -> PauseType | None:
        """What a call of it pauses for (None: it runs), by `pause_type_of`'s priority."""
        return pause_type_of(
            external_execution=self.external_execution,
            requires_user_input=self.requires_user_input,
            requires_confirmation=self.requires_confirmation,
        )

    def user_input_schema(self) -> list[dict[str, Any]]:
        """The fields a person fills in, as a requirement shows them: name, type, description."""
        schema = self._args_model.model_json_schema().get("properties", {})
        return [
            {
                "name": name,
                "type": schema.get(name, {}).get("type", "string"),
                "description": schema.get(name, {}).get("description"),
                "value": None,
            }
            for name in self.user_input_fields
        ]

    def with_flags(self, **changes: Any) -> Tool:
        """This tool with some of its settings changed (a toolkit's lists, a new name)."""
        settings: dict[str, Any] = dict(
            name=self.name,
            description=self.description,
            at_most_once=self.at_most_once,
            queue=self.queue,
            requires_confirmation=self.requires_confirmation,
            requires_user_input=self.requires_user_input,
            user_input_fields=self.user_input_fields or None,
            external_execution=self.external_execution,
            pause_timeout=self.pause_policy.timeout if self.pause_policy else None,
            on_timeout=self.pause_policy.on_timeout if self.pause_policy else None,
        )
        settings.update(changes)
        return self._rebuilt(settings)

    def _rebuilt(self, settings: dict[str, Any]) -> Tool:
        """A tool like this one with `with_flags`'s settings."""
        return Tool(self.fn, **settings)

    @functools.cached_property
    def spec(self) -> ToolSpec:
        """The schema the model is shown (built once: pydantic's schema costs ~0.2 ms a step)."""
        schema = self._args_model.model_json_schema()
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        schema.setdefault("properties", {})
        for name in self.user_input_fields:  # a person's to fill in, not the model's
            schema["properties"].pop(name, None)
            if name in schema.get("required", []):
                schema["required"].remove(name)
        if "required" in schema and not schema["required"]:
            del schema["required"]
        schema["additionalProperties"] = False
        return ToolSpec(name=self.name, description=self.description, parameters=schema)

    def parse_arguments(self, raw: str) -> dict[str, Any]:
        """Decode and validate the model's argument text; raise ToolArgumentsError if they don't fit."""
        try:
            data = json.loads(raw or "{}")
        except json.JSONDecodeError as exc:
            raise ToolArgumentsError(f"arguments are not valid JSON ({exc.msg} at {exc.pos}): {raw[:200]!r}") from None
        except RecursionError:
            raise ToolArgumentsError(
                f"arguments are nested too deeply to decode ({len(raw)} characters): send a flatter JSON object"
            ) from None
        if not isinstance(data, dict):
            raise ToolArgumentsError(f"arguments must be a JSON object, got {type(data).__name__}")
        try:
            validated = self._args_model.model_validate(data)
        except RecursionError:
            raise ToolArgumentsError(f"invalid arguments for {self.name}: nested too deeply to validate") from None
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in exc.errors()
            )
            raise ToolArgumentsError(f"invalid arguments for {self.name}: {problems}") from None
        except Exception as exc:  # a validator of the user's that raised something pydantic does not wrap
            raise ToolArgumentsError(
                f"invalid arguments for {self.name}: {type(exc).__name__}: {safe_str(exc)}"
            ) from None
        return {k: getattr(validated, k) for k in type(validated).model_fields}

    def call(self, arguments: dict[str, Any], context: ToolContext) -> Any:
        """Run the function with validated arguments; an async function runs on the process's
        long-lived tool loop (see `orchestrator.tools.loop`)."""
        kwargs = dict(arguments)
        if self._context_param:
            kwargs[self._context_param] = context
        if self._wants_state:
            kwargs[STATE_PARAM] = context.session_state
        result = self.fn(**kwargs)
        if inspect.isawaitable(result):
            result = process_loop().run(result)
        return result

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    at_most_once: bool = False,
    queue: str | None = None,
    requires_confirmation: bool = False,
    requires_user_input: bool = False,
    user_input_fields: list[str] | None = None,
    external_execution: bool = False,
    pause_timeout: float | None = None,
    on_timeout: str | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(fn: Callable[..., Any] | None = None, /, **settings: Any) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a function a tool: `@tool`, `@tool(at_most_once=True)`, `@tool(queue="gpu")`,
    `@tool(requires_confirmation=True)` (the keywords are `Tool`'s)."""
    if fn is not None:
        return Tool(fn)

    def wrap(f: Callable[..., Any]) -> Tool:
        return Tool(f, **settings)

    return wrap


#: What a queue name may hold: it is given to `-Q` (comma-separated) and is a Redis key or a
#: RabbitMQ queue name.
QUEUE_RULE = "1-200 characters of A-Z, a-z, 0-9, '.', '_', ':' and '-'"
_QUEUE = re.compile(r"[A-Za-z0-9._:-]{1,200}")


def queue_name(value: object, owner: str) -> str:
    """A queue an agent or a tool names, or ConfigurationError saying what it may be."""
    if not isinstance(value, str) or _QUEUE.fullmatch(value) is None:
        raise ConfigurationError(f"{owner}: queue={value!r} is not a queue name: use {QUEUE_RULE}")
    return value


def tools_queue(agent: str, tools: list[Tool]) -> str | None:
    """The one queue an agent's tools name (None if none does). A tool batch runs in one task, on
    one queue, so the tools of one agent may name one queue between them."""
    named = sorted({t.queue for t in tools if t.queue is not None})
    if len(named) > 1:
        raise ConfigurationError(
            f"{agent}: its tools name {len(named)} queues {named}; a tool batch goes to one queue, so the tools "
            "of one agent may name one queue between them: give them the same queue, or give the tools to two agents"
        )
    return named[0] if named else None


def as_tool(obj: Tool | Callable[..., Any]) -> Tool:
    """A Tool from a Tool or a plain function."""
    return obj if isinstance(obj, Tool) else Tool(obj)
