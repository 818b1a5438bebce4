"""`ScriptedModel`: the scripted model of `orchestrator.testing.script`, in-process, with no HTTP.

For benchmarks and unit tests of agents: it answers exactly as `ScriptedServer` would (same
turns, tool calls, faults) and fails with the same `ModelCallError` classification as the
OpenAI adapters, so a test of retry behaviour means the same thing with either. A test double,
so it lives here and not in `orchestrator.models`: `import orchestrator` never loads it.

    agent = Agent(name="t", model=ScriptedModel(script=ScriptConfig(tool_batches=2)), tools=[...])
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from orchestrator.errors import ModelCallError
from orchestrator.messages import Message, ToolCall
from orchestrator.models.base import CallContext, Model, ModelReply, RateLimit, ToolSpec
from orchestrator.models.failures import (
    is_context_length_error,
    kind_for_status,
    malformed,
    retryable_status,
    stream_error,
)
from orchestrator.testing.script import ScriptConfig, ScriptedError, ScriptedReply, ScriptState, decide
from orchestrator.usage import Prices


class ScriptedModel(Model):
    """A model that follows a `ScriptConfig`. Fault budgets are counted per run id, per instance."""

    def __init__(
        self,
        id: str = "scripted",
        script: ScriptConfig | None = None,
        api_key: str | None = "scripted",
        prices: Prices | None = None,
        rate_limit: RateLimit | None = None,
    ) -> None:
        self.id = id
        self.prices = prices
        self.rate_limit = rate_limit
        self.script = script or ScriptConfig()
        # A test value, compared against the script's accept/reject lists; not a credential.
        self.api_key = api_key
        self.state = ScriptState()

    def invoke(self, messages: Sequence[Message], tools: Sequence[ToolSpec], *, context: CallContext) -> ModelReply:
        """Answer as the script says, after its `delay_s`; faults raise `ModelCallError`. With
        `context.on_delta` the text goes to it a word at a time, `chunk_delay_s` apart, and a
        stream-cutting fault cuts it after `break_stream_after` words (there are no other events
        to count) with the error the adapters raise for it."""
        decision = decide(
            self.script,
            self.state,
            model=self.id,
            api_key=self.api_key,
            conversation=conversation_of(messages),
            tools=[{"name": t.name, "description": t.description, "parameters": t.parameters} for t in tools],
            conversation_key=context.run_id,
            stream=context.on_delta is not None,
        )
        if decision.delay_s > 0:
            time.sleep(decision.delay_s)
        if isinstance(decision, ScriptedError) and decision.raw is not None and decision.status < 400:
            # What the OpenAI adapters make of a 2xx that is not a reply.
            raise malformed(self, "the body is not " + ("a reply" if _is_json(decision.raw) else "JSON"))
        if isinstance(decision, ScriptedError):
            kind = kind_for_status(decision.status)
            code = decision.body.get("error", {}).get("code")
            raise ModelCallError(
                f"{self.describe()}: {kind} (HTTP {decision.status}): {decision.message}",
                retryable=retryable_status(decision.status) and not is_context_length_error(code, decision.message),
                status_code=decision.status,
                retry_after=decision.retry_after,
                kind=kind,
            )
        if context.on_delta is not None:
            self._stream(decision, context.on_delta)
        return ModelReply(
            content=decision.content,
            tool_calls=[ToolCall(id=cid, name=name, arguments=args) for cid, name, args in decision.tool_calls],
            usage=dict(decision.usage),
            response_model=self.id,
            finish_reason=decision.finish_reason,
        )

    def _stream(self, reply: ScriptedReply, on_delta: Callable[[str], None]) -> None:
        # Imported here: the streams module loads openai's types, which a whole answer never needs.
        from orchestrator.testing.streams import words

        delay_s = self.script.for_model(self.id).chunk_delay_s
        for number, word in enumerate(words(reply.content or "")):
            if number == reply.break_after:
                break
            if number and delay_s > 0:
                time.sleep(delay_s)
            on_delta(word)
        if reply.break_after is None:
            return
        if reply.break_error is not None:
            error = reply.break_error["error"]
            raise stream_error(self, error["code"], error["message"], None)
        raise ModelCallError(
            f"{self.describe()}: APIConnectionError: the stream was cut", retryable=True, kind="APIConnectionError"
        )


def conversation_of(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Transcript messages in the script's normalised conversation shape."""
    return [
        {
            "role": m.role,
            "content": m.content,
            "tool_calls": [_call(c) for c in m.tool_calls] if m.tool_calls else None,
            "tool_call_id": m.tool_call_id,
        }
        for m in messages
    ]


def _call(raw: dict[str, Any]) -> dict[str, Any]:
    # What ToolCall.from_openai reads, without building one per message per call.
    fn = raw.get("function") or {}
    return {"id": str(raw["id"]), "name": str(fn.get("name", "")), "arguments": str(fn.get("arguments") or "{}")}


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
