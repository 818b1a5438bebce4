"""`OpenAIChat`: a model behind the Chat Completions API (OpenAI or any compatible server).

    OpenAIChat(id="gpt-4o")                      # key from OPENAI_API_KEY at each call
    OpenAIChat(id="llama3", base_url="http://localhost:11434/v1")

The constructor mirrors Agno's. See `orchestrator.models._openai` for how the key, the base URL
and errors are handled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.messages import Message, ToolCall
from orchestrator.models._openai import OpenAIModel, malformed, sampling
from orchestrator.models.base import ModelReply, ToolSpec

if TYPE_CHECKING:
    import openai
    from openai import RequestOptions


class OpenAIChat(OpenAIModel):
    """A Chat Completions model. Sampling arguments left at None are not sent."""

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
        max_tokens: int | None = None,
        max_completion_tokens: int | None = None,
        seed: int | None = None,
        stop: str | list[str] | None = None,
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
            max_tokens=max_tokens,
            max_completion_tokens=max_completion_tokens,
            seed=seed,
            stop=stop,
            user=user,
        )
        self.parallel_tool_calls = parallel_tool_calls

    def build_request(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> dict[str, Any]:
        """`model`, `messages`, `tools` and the sampling arguments of one Chat Completions call."""
        params: dict[str, Any] = {"model": self.id, "messages": [chat_message(m) for m in messages], **self.sampling}
        if tools:
            params["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
                for t in tools
            ]
            if self.parallel_tool_calls is not None:
                params["parallel_tool_calls"] = self.parallel_tool_calls
        return params

    def send(self, client: openai.OpenAI, params: dict[str, Any], options: RequestOptions) -> Any:
        """POST /chat/completions (see `OpenAIModel.send` for why not `chat.completions.create`)."""
        from openai.types.chat import ChatCompletion

        return client.post("/chat/completions", body=params, cast_to=ChatCompletion, options=options)

    def read_reply(self, raw: Any) -> ModelReply:
        """The first choice's text and function calls; arguments are passed through unparsed."""
        choices = getattr(raw, "choices", None)
        if not choices or getattr(choices[0], "message", None) is None:
            raise malformed(self, "the reply has no choices")
        message = choices[0].message
        calls = []
        for call in message.tool_calls or []:
            function = getattr(call, "function", None)
            if function is None:
                # A custom (non-function) tool call: Ratchet only offers function tools.
                continue
            # Invalid JSON is not an error here: the engine reports it to the model as a tool error.
            calls.append(ToolCall(id=call.id, name=function.name, arguments=function.arguments or "{}"))
        usage = getattr(raw, "usage", None)
        return ModelReply(
            content=message.content,
            tool_calls=calls,
            usage=(
                {"input_tokens": usage.prompt_tokens or 0, "output_tokens": usage.completion_tokens or 0}
                if usage is not None
                else {}
            ),
        )


def chat_message(message: Message) -> dict[str, Any]:
    """One transcript message in the Chat Completions shape."""
    if message.role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": message.content}
        if message.tool_calls:
            out["tool_calls"] = [c.to_openai() for c in message.calls]
        return out
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id or "", "content": message.content or ""}
    return {"role": message.role, "content": message.content or ""}
