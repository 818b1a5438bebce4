"""Structured output: an agent's `output_schema`, a pydantic model its final answer must follow.

The worker asks the model for the schema the provider's way (`OutputFormat`, which each adapter
turns into its API's parameter), validates the final answer against it, and stores the answer as
the JSON text the model sent. A reply that does not validate is a retryable model error: the
retry's prompt ends with a correction (a user message, kept in flight and never stored) built
from the error the retry recorded, so every redelivery of that retry sends the same request.
When retries run out the run goes to ERROR with the invalid reply kept on the row.

A run's content reads the same in every process: the JSON text as stored (`Client`, the CLI, the
HTTP API). The schema's instance is given where the caller holds the definition: `Agent.run()`
and a handle started from the agent parse it with the agent's own `output_schema` (`parsed`);
any other caller names the schema, `RunOutput.content_as(MyModel)`.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from pydantic import BaseModel, ValidationError

from orchestrator.errors import ModelCallError
from orchestrator.messages import Message
from orchestrator.models.base import OutputFormat

#: The `kind` of the model error a reply that does not follow the schema raises.
INVALID_OUTPUT = "OutputValidationError"
#: How much of a validation error the model and the error row are shown.
_ERROR_CHARS = 2000


@cache
def output_format(schema: type[BaseModel]) -> OutputFormat:
    """The strict JSON schema of `schema`, as OpenAI's structured outputs want it (every field
    required, no extra properties), named after the class."""
    from openai.lib._pydantic import to_strict_json_schema

    name = re.sub(r"[^A-Za-z0-9_-]", "_", schema.__name__)[:64] or "output"
    return OutputFormat(name=name, schema=to_strict_json_schema(schema))


def validate(schema: type[BaseModel], content: str | None) -> ModelCallError | None:
    """None when `content` is JSON that follows `schema`, else the retryable error saying why."""
    try:
        schema.model_validate_json(content or "")
    except ValidationError as exc:
        detail = str(exc)[:_ERROR_CHARS]
        return ModelCallError(
            f"the reply does not follow the output schema {schema.__name__}: {detail}",
            retryable=True,
            kind=INVALID_OUTPUT,
        )
    return None


def correction(error: dict[str, Any] | None) -> Message | None:
    """The message that shows the model why its last reply was refused, when the retry being
    made is one of an invalid output (`error`: what the retry recorded); else None."""
    if not error or error.get("type") != INVALID_OUTPUT:
        return None
    return Message(
        role="user",
        content=(
            f"Your previous reply was refused: {error.get('message', '')}\n"
            "Reply again with only a JSON object that follows the required schema."
        ),
    )


def parsed(schema: type[BaseModel], content: Any) -> Any:
    """A completed run's content as an instance of `schema` when the stored text validates, else
    as given: None, or the text when the schema changed since the run (still the answer)."""
    if not isinstance(content, str):
        return content
    try:
        return schema.model_validate_json(content)
    except ValidationError:
        return content
