"""Messages of a run's transcript, with Agno's field names.

A message is a frozen value: the store appends it once as a row and never rewrites it.
`tool_calls` keeps the OpenAI Chat shape (`{"id", "type": "function", "function": {"name",
"arguments"}}`), which is also what Agno stores, so transcripts move between the two unchanged.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from orchestrator.untrusted import TOOL_CALL_ID_MAX, TOOL_NAME_MAX, escape, storable_name
from orchestrator.usage import TIMING_COLUMNS, USAGE_COLUMNS, Metrics

Role = Literal["system", "user", "assistant", "tool"]
#: The longest model name the `model` column holds.
MODEL_NAME_MAX = 256


class ToolCall(BaseModel):
    """One function call the model asked for; `arguments` is the raw JSON text it sent."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    name: str
    arguments: str = "{}"

    def to_openai(self) -> dict[str, Any]:
        """The call in the OpenAI Chat shape that Agno stores in `Message.tool_calls`."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    def arguments_dict(self) -> dict[str, Any]:
        """The arguments as a dict for `Message.tool_args`; text that is not a JSON object is kept
        under "_raw" so a transcript shows what the model actually sent."""
        return decoded_arguments(self.arguments)

    @classmethod
    def from_openai(cls, raw: dict[str, Any]) -> ToolCall:
        """Read a call back from the OpenAI Chat shape."""
        fn = raw.get("function") or {}
        return cls(id=str(raw["id"]), name=str(fn.get("name", "")), arguments=str(fn.get("arguments") or "{}"))


def decoded_arguments(arguments: str) -> dict[str, Any]:
    """A call's arguments text as a dict (`ToolCall.arguments_dict`), for a reader of the stored
    OpenAI-shaped calls that builds no `ToolCall`."""
    try:
        value = json.loads(arguments)
    except (json.JSONDecodeError, TypeError, RecursionError):  # nested too deep to decode
        return {"_raw": arguments}
    return value if isinstance(value, dict) else {"_raw": arguments}


class Message(BaseModel):
    """One message of a transcript. Frozen: copy with `model_copy(update=...)`, never mutate."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: Role
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    tool_name: str | None = None
    tool_args: dict[str, Any] | None = None
    tool_call_error: bool = False
    #: When the message was committed (UNIX seconds); None until it is stored.
    created_at: float | None = None
    #: An assistant message's usage as the provider reported it and its call's timing (Agno's
    #: `Message.metrics`), a tool result's duration; None when none is known, on other roles, and
    #: on rows stored before (migrations 0005, 0018).
    metrics: Metrics | None = None
    #: The model that wrote an assistant message, by the id it was configured with (a reply of a
    #: fallback model names that model; a bounded label for the metrics, where the provider's own
    #: name of it is on the call's span). None on other roles and on rows stored before it was
    #: (migration 0017).
    model: str | None = None

    @property
    def calls(self) -> list[ToolCall]:
        """The tool calls of an assistant message as value objects."""
        return [ToolCall.from_openai(c) for c in self.tool_calls or []]

    def to_row(self) -> dict[str, Any]:
        """The columns this message is stored under (see `store.tables.messages`).

        The last guard before the database: text no column can hold is escaped and names are
        fitted to their columns here too, so no write (the failure handler's flush above all) can
        fail on a message's content. The engine already makes what models and tools return
        storable, saying so in the message (`orchestrator.untrusted`); JSON columns are ASCII."""
        return {
            "role": self.role,
            "content": escape(self.content)[0] if self.content is not None else None,
            "tool_calls": json.dumps(self.tool_calls) if self.tool_calls is not None else None,
            "tool_call_id": _name(self.tool_call_id, TOOL_CALL_ID_MAX),
            "tool_name": _name(self.tool_name, TOOL_NAME_MAX),
            "tool_args": _args_json(self.tool_args),
            "tool_call_error": self.tool_call_error,
            "model": _name(self.model, MODEL_NAME_MAX),
            **_usage_values(self.metrics),
        }

    @classmethod
    def from_row(cls, row: Any) -> Message:
        """Rebuild a message from a `messages` row."""
        return cls(
            role=row.role,
            content=row.content,
            tool_calls=json.loads(row.tool_calls) if row.tool_calls is not None else None,
            tool_call_id=row.tool_call_id,
            tool_name=row.tool_name,
            tool_args=json.loads(row.tool_args) if row.tool_args is not None else None,
            tool_call_error=bool(row.tool_call_error),
            created_at=row.created_at,
            metrics=metrics_of(row),
            model=getattr(row, "model", None),
        )


_METRICS_COLUMNS = (*USAGE_COLUMNS, *TIMING_COLUMNS)


def _usage_values(metrics: Metrics | None) -> dict[str, Any]:
    if metrics is None:
        return dict.fromkeys(_METRICS_COLUMNS)
    return {c: getattr(metrics, c) for c in _METRICS_COLUMNS}


def metrics_of(row: Any) -> Metrics | None:
    """The usage and timing columns of a row (NULL on rows older than migrations 0005 and 0018):
    None if all are. Typed columns, validated when the reply was stored: not validated again on
    every claim."""
    values = {c: getattr(row, c, None) for c in _METRICS_COLUMNS}
    return Metrics.model_construct(**values) if any(v is not None for v in values.values()) else None


def _args_json(args: dict[str, Any] | None) -> str | None:
    if args is None:
        return None
    try:
        return json.dumps(args)
    except (RecursionError, ValueError, TypeError):  # nested deeper than this thread's stack allows
        return json.dumps({"_unstorable": "the arguments are nested too deeply to store"})


def _name(value: str | None, limit: int) -> str | None:
    return storable_name(value, limit) if value is not None else None


def unanswered_calls(messages: list[Message]) -> list[ToolCall]:
    """The tool calls of the last assistant message that have no tool result yet.

    This is what a resumed run still owes: continue runs a tool batch for these alone, so a
    tool whose result is stored is never executed again.
    """
    last_assistant = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].role == "assistant"), None)
    if last_assistant is None:
        return []
    answered = {m.tool_call_id for m in messages[last_assistant + 1 :] if m.role == "tool"}
    return [c for c in messages[last_assistant].calls if c.id not in answered]
