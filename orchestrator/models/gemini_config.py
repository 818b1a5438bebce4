"""The `GenerateContentConfig` of a Gemini call: what depends only on the model's settings built
once, and a type whose walk costs the SDK little.

Before each request the SDK turns the config into the body's `generationConfig` (and its
`systemInstruction`, `tools`, `safetySettings`, ...) by looking up every field it knows, set or
not: about 45 lookups a call, each `name in config` before `getattr(config, name)`. A pydantic
model has no `__contains__`, so each `in` iterates the model, building the list of its 39
(name, value) pairs to find that none is the name: 0.2 ms of the caller's CPU a call, GIL held,
more than the rest of the SDK's request (bench/providers.py). `LeanConfig` is the SDK's type with
the answer that iteration gives, without the iteration; the SDK takes it as the
`GenerateContentConfig` it is (pydantic keeps an instance of a subclass as it is) and reads every
field by attribute, as before.

The fields a model's settings give (`request_params`, sampling, safety, thinking, its headers)
are validated once into `static_config`, which `Gemini` keeps while its settings stay equal; each
call's config is a copy with the call's own fields set (`call_config`: no validation, every value
in it already the SDK's type or validated). Imported when a call is made
(`orchestrator.models.gemini`), as the SDK is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.genai import types

from orchestrator.models.base import OutputFormat

#: The `contents` each call hands the SDK, which the body's own replace (`Gemini.request` says
#: why): one Content, no Part. Read by the SDK, never changed.
EMPTY_CONTENT = types.Content(role="user", parts=[])


class LeanConfig(types.GenerateContentConfig):
    """A `GenerateContentConfig` whose `name in config` is answered at once: False for a name, as
    iterating it says (its items are (name, value) pairs, never a name); anything else is looked
    for among those pairs, as Python does for a type without `__contains__`."""

    def __contains__(self, item: object) -> bool:
        if isinstance(item, str):
            return False
        return any(item == pair for pair in self)


def static_config(
    request_params: Mapping[str, Any],
    sampling: Mapping[str, Any],
    safety_settings: list[Any] | None,
    thinking: Mapping[str, Any],
    headers: Mapping[str, str],
) -> LeanConfig:
    """The fields of every call's config that a model's settings give, validated: `request_params`
    under the sampling arguments, the safety and thinking settings, its own headers, and the
    automatic function calling off (the tools are declarations for the engine to run, never
    Python functions for the SDK). A field of `request_params` that a call sets itself
    (`http_options`, `should_return_http_response`) is a `TypeError`, as a keyword given twice."""
    fields: dict[str, Any] = {**request_params, **sampling}
    if safety_settings is not None:
        fields["safety_settings"] = safety_settings
    if thinking:
        fields["thinking_config"] = types.ThinkingConfig(**thinking)
    return LeanConfig(
        **fields,
        http_options=types.HttpOptions(headers=dict(headers)),
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
        should_return_http_response=None,
    )


def call_config(
    static: LeanConfig, *, headers: Mapping[str, str], body: dict[str, Any], output: OutputFormat | None, raw: bool
) -> LeanConfig:
    """One call's config: `static`'s with the call's headers over the model's, its body (the API's
    JSON, `http_options.extra_body`), the output schema asked for, and `raw` (the SDK returns the
    HTTP response instead of its reply types)."""
    options = static.http_options
    assert options is not None  # `static_config` sets it
    update: dict[str, Any] = {
        "http_options": options.model_copy(
            update={"headers": {**(options.headers or {}), **headers}, "extra_body": body}
        ),
        "should_return_http_response": raw or None,
    }
    if output is not None:
        update["response_mime_type"] = "application/json"
        update["response_json_schema"] = output.schema
    return static.model_copy(update=update)
