"""`OpenAIResponses`: a model behind OpenAI's Responses API.

    OpenAIResponses(id="gpt-4.1", reasoning_effort="low")

Each call sends the whole transcript as `input` items (no `previous_response_id`), so a step
retried on another worker makes exactly the same request. See `orchestrator.models._openai` for
how the key, the base URL and errors are handled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.errors import ModelCallError
from orchestrator.messages import Message, ToolCall
from orchestrator.models._openai import OpenAIModel, malformed, sampling
from orchestrator.models.base import ModelReply, ToolSpec

if TYPE_CHECKING:
    import openai
    from openai import RequestOptions


class OpenAIResponses(OpenAIModel):
    """A Responses API model. Sampling arguments left at None are not sent."""

    def __init__(
        self,
        id: str = "gpt-4o",
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float | None = None,
        max_retries: int = 0,
        temperature: float | None = None,
        top_p: float | None = None,
        max_output_tokens: int | None = None,
        reasoning_effort: str | None = None,
        store: bool | None = None,
        user: str | None = None,
        parallel_tool_calls: bool | None = None,
        organization: str | None = None,
        default_headers: Mapping[str, str] | None = None,
        request_params: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(
            id,
            api_key=api_key,
            base_url=base_url,
            timeout=timeout,
            max_retries=max_retries,
            organization=organization,
            default_headers=default_headers,
            request_params=request_params,
        )
        self.sampling = sampling(
            temperature=temperature,
            top_p=top_p,
            max_output_tokens=max_output_tokens,
            reasoning={"effort": reasoning_effort} if reasoning_effort else None,
            store=store,
            user=user,
        )
        self.parallel_tool_calls = parallel_tool_calls

    def build_request(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> dict[str, Any]:
        """`model`, `input` items, `tools` and the sampling arguments of one Responses call."""
        params: dict[str, Any] = {"model": self.id, "input": input_items(messages), **self.sampling}
        if tools:
            # strict=False: the API defaults function tools to strict schemas, which ordinary
            # signatures (optional arguments, open objects) do not satisfy.
            params["tools"] = [
                {
                    "type": "function",
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                    "strict": False,
                }
                for t in tools
            ]
            if self.parallel_tool_calls is not None:
                params["parallel_tool_calls"] = self.parallel_tool_calls
        return params

    def send(self, client: openai.OpenAI, params: dict[str, Any], options: RequestOptions) -> Any:
        """POST /responses (see `OpenAIModel.send` for why not `responses.create`)."""
        from openai.types.responses import Response

        return client.post("/responses", body=params, cast_to=Response, options=options)

    def read_reply(self, raw: Any) -> ModelReply:
        """The output's text and function calls; arguments are passed through unparsed."""
        if getattr(raw, "status", None) == "failed":
            error = getattr(raw, "error", None)
            detail = getattr(error, "message", None) or "the response failed"
            raise ModelCallError(f"{self.describe()}: {detail}", retryable=True, kind="ResponseFailed")
        output = getattr(raw, "output", None)
        if not output:
            raise malformed(self, "the response has no output")
        texts: list[str] = []
        calls: list[ToolCall] = []
        saw_message = False
        for item in output:
            kind = getattr(item, "type", None)
            if kind == "message":
                saw_message = True
                texts.extend(p.text for p in item.content if getattr(p, "type", None) == "output_text" and p.text)
            elif kind == "function_call":
                # Invalid JSON is not an error here: the engine reports it to the model as a tool error.
                calls.append(ToolCall(id=item.call_id, name=item.name, arguments=item.arguments or "{}"))
        if not saw_message and not calls:
            raise malformed(self, "the output has neither a message nor a function call")
        usage = getattr(raw, "usage", None)
        return ModelReply(
            content="".join(texts) if saw_message else None,
            tool_calls=calls,
            usage=(
                {"input_tokens": usage.input_tokens or 0, "output_tokens": usage.output_tokens or 0}
                if usage is not None
                else {}
            ),
        )


def input_items(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """A transcript as Responses `input` items.

    An assistant message becomes its text as a message item (if any) followed by one
    function_call item per call; a tool message becomes a function_call_output item.
    """
    items: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "assistant":
            if m.content or not m.calls:
                items.append({"role": "assistant", "content": m.content or ""})
            items.extend(
                {"type": "function_call", "call_id": c.id, "name": c.name, "arguments": c.arguments} for c in m.calls
            )
        elif m.role == "tool":
            items.append({"type": "function_call_output", "call_id": m.tool_call_id or "", "output": m.content or ""})
        else:
            items.append({"role": m.role, "content": m.content or ""})
    return items
