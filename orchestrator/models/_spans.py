"""What the span of an OpenAI adapter's call says about its request (`OpenAIModel.span_attributes`),
keyed as OpenTelemetry's GenAI conventions say: the server (its host and port only: a base URL's
credentials stay out), the API, and the sampling settings that were set. Never the key or the prompt."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

#: Sampling arguments and the attributes they become.
_SAMPLING = {
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "max_tokens": "gen_ai.request.max_tokens",
    "max_completion_tokens": "gen_ai.request.max_tokens",
    "max_output_tokens": "gen_ai.request.max_tokens",
    "seed": "gen_ai.request.seed",
    "stop": "gen_ai.request.stop_sequences",
}


def request_attributes(base_url: str, api_type: str, sampling: Mapping[str, Any]) -> dict[str, Any]:
    """The attributes of a call to `base_url` through `api_type` ("chat_completions", "responses")."""
    attributes: dict[str, Any] = {"openai.api.type": api_type}
    try:
        parts = urlsplit(base_url)
        port = parts.port
    except ValueError:  # not a URL the client could call either: the call's own error says so
        return attributes
    if parts.hostname:
        attributes["server.address"] = parts.hostname
        attributes["server.port"] = port or (443 if parts.scheme == "https" else 80)
    for key, name in _SAMPLING.items():
        value = sampling.get(key)
        if value is not None:
            attributes[name] = [value] if isinstance(value, str) else value
    return attributes
