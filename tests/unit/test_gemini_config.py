"""A Gemini call's `GenerateContentConfig`: a name looked up in it without iterating it, and the
fields the model's settings give validated once, then again whenever a setting changes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from google.genai import types

from orchestrator.messages import Message
from orchestrator.models import Gemini
from orchestrator.models.base import CallContext, OutputFormat, ToolSpec
from orchestrator.models.gemini_config import LeanConfig

MESSAGES = [Message(role="system", content="Be brief."), Message(role="user", content="hi")]
TOOL = ToolSpec(name="lookup", description="Look up.", parameters={"type": "object", "properties": {}})


class Counted(LeanConfig):
    """A `LeanConfig` that counts how often it is iterated."""

    iterations: ClassVar[int] = 0

    def __iter__(self) -> Iterator[tuple[str, Any]]:  # type: ignore[override]
        type(self).iterations += 1
        yield from super().__iter__()


def config_of(model: Gemini, *, seq: int = 1, output: OutputFormat | None = None) -> types.GenerateContentConfig:
    return model.request(MESSAGES, [TOOL], CallContext(run_id="r", seq=seq, output=output), raw=True)[1]


def test_a_field_name_is_looked_up_in_the_config_without_iterating_it_and_found_as_in_the_sdks_type() -> None:
    lean, counted, plain = (
        LeanConfig(temperature=0.5),
        Counted(temperature=0.5),
        types.GenerateContentConfig(temperature=0.5),
    )
    Counted.iterations = 0

    # The SDK asks `name in config` of every field it knows, before reading it by attribute.
    assert [name in counted for name in types.GenerateContentConfig.model_fields] == [
        name in plain for name in types.GenerateContentConfig.model_fields
    ]
    assert Counted.iterations == 0
    # Anything but a name is looked for among the (name, value) pairs, as for the SDK's own type.
    assert (("temperature", 0.5) in lean) is (("temperature", 0.5) in plain) is True
    assert (("temperature", 0.7) in lean) is (("temperature", 0.7) in plain) is False


def test_the_config_of_a_call_is_the_sdks_type_with_the_models_settings_and_the_calls_own_fields() -> None:
    model = Gemini(id="g", api_key="k", temperature=0.2, thinking_budget=64, default_headers={"x-team": "a"})
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}

    config = config_of(model, seq=4, output=OutputFormat(name="o", schema=schema))

    assert isinstance(config, types.GenerateContentConfig)
    assert config.temperature == 0.2
    assert config.thinking_config == types.ThinkingConfig(thinking_budget=64)
    assert config.automatic_function_calling == types.AutomaticFunctionCallingConfig(disable=True)
    assert config.should_return_http_response is True
    assert (config.response_mime_type, config.response_json_schema) == ("application/json", schema)
    assert config.http_options is not None and config.http_options.headers is not None
    assert config.http_options.headers["x-team"] == "a"
    assert config.http_options.headers["X-Ratchet-Step"] == "4"
    assert config.http_options.extra_body is not None
    assert config.http_options.extra_body["systemInstruction"] == {"parts": [{"text": "Be brief."}]}


def test_the_settings_fields_are_validated_once_while_the_settings_stay_the_same() -> None:
    model = Gemini(
        id="g",
        api_key="k",
        thinking_budget=64,
        safety_settings=[{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}],
    )

    first, second = config_of(model, seq=1), config_of(model, seq=2)

    assert first is not second  # each call has its own config, its own headers and body
    assert first.http_options is not None and second.http_options is not None
    assert first.http_options.headers != second.http_options.headers
    # The validated settings are the same objects: built once, not at each call.
    assert second.thinking_config is first.thinking_config
    assert second.safety_settings is first.safety_settings


def test_a_setting_changed_after_a_call_reaches_the_next_call_even_when_changed_in_place() -> None:
    model = Gemini(
        id="g",
        api_key="k",
        temperature=0.1,
        safety_settings=[{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}],
    )
    config_of(model)

    model.sampling["temperature"] = 0.9
    assert config_of(model).temperature == 0.9

    assert model.safety_settings is not None
    model.safety_settings[0]["threshold"] = "BLOCK_ONLY_HIGH"
    settings = config_of(model).safety_settings
    assert settings is not None and settings[0].threshold == types.HarmBlockThreshold.BLOCK_ONLY_HIGH

    model.request_params["candidate_count"] = 2
    assert config_of(model).candidate_count == 2
