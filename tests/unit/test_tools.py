"""Tools: schema from the signature, arguments validated before the function runs."""

from __future__ import annotations

import pytest

from orchestrator.errors import ConfigurationError, ToolArgumentsError
from orchestrator.tools import Tool, ToolContext, tool


def search(query: str, limit: int = 5) -> str:
    """Search the web.

    Returns the top results."""
    return f"{query}:{limit}"


def test_the_schema_comes_from_the_signature_and_the_docstring() -> None:
    spec = Tool(search).spec
    assert spec.name == "search"
    assert spec.description.startswith("Search the web.")
    assert spec.parameters["required"] == ["query"]
    assert spec.parameters["properties"]["query"] == {"type": "string"}
    assert spec.parameters["properties"]["limit"] == {"type": "integer", "default": 5}
    assert spec.parameters["additionalProperties"] is False


def test_valid_arguments_are_parsed_with_defaults() -> None:
    assert Tool(search).parse_arguments('{"query": "celery"}') == {"query": "celery", "limit": 5}


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ('{"query": ', "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ("{}", "query: Field required"),
        ('{"query": "x", "limit": "many"}', "limit: Input should be a valid integer"),
        ('{"query": "x", "colour": "red"}', "colour: Extra inputs are not permitted"),
    ],
)
def test_invalid_arguments_from_the_model_are_a_clear_tool_error(raw: str, says: str) -> None:
    with pytest.raises(ToolArgumentsError, match=says):
        Tool(search).parse_arguments(raw)


def test_a_tool_can_ask_for_its_context_and_the_model_never_sees_it() -> None:
    @tool(at_most_once=True)
    def charge(amount: int, ctx: ToolContext) -> str:
        """Charge a card once."""
        return f"{ctx.idempotency_key}:{amount}"

    assert "ctx" not in charge.spec.parameters["properties"]
    assert charge.at_most_once
    out = charge.call(charge.parse_arguments('{"amount": 3}'), ToolContext(run_id="r1", tool_call_id="c9"))
    assert out == "r1:c9:3"


def test_async_tools_are_awaited() -> None:
    async def fetch(url: str) -> str:
        """Fetch a page."""
        return url.upper()

    t = Tool(fetch)
    assert t.call(t.parse_arguments('{"url": "a"}'), ToolContext(run_id="r", tool_call_id="c")) == "A"


def test_a_signature_that_cannot_be_described_is_refused_at_definition() -> None:
    def anything(*args: str) -> str:
        return ""

    with pytest.raises(ConfigurationError, match=r"\*args/\*\*kwargs"):
        Tool(anything)
