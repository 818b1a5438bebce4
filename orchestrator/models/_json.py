"""A provider's reply read as the JSON it sent, whole or event by event.

The OpenAI adapters ask the client for the parsed JSON (`cast_to=object`, `Stream[object]`) rather
than its typed models, for two reasons. The typed models read a reply leniently: a `usage` that
its types would take ("12" for a count, true for 1, false for 0) is converted before Ratchet sees
it, and a count the provider did not send as a number would be stored as one (`orchestrator.usage`
keeps it unknown). And building them costs the worker more than reading the handful of fields an
adapter needs (bench/FINDINGS.md). The client's own handling of HTTP errors, timeouts and
`{"error": ...}` events is the same either way.

A part of the wrong type raises `TypeError` naming it, which `read_guarded` makes a malformed
reply (retryable); the usage alone is read leniently, since a bad count is unknown, never a
failed step.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import openai
    from openai import RequestOptions


def post_json(client: openai.OpenAI, path: str, body: dict[str, Any], options: RequestOptions) -> object:
    """POST `body` to `path`; the reply's JSON as the server sent it."""
    raw = client.post(path, body=body, cast_to=object, options=options)
    # The client hands back a body whose content type does not say JSON as its text; it would
    # parse it for a typed reply, and so it is parsed here (a body that is not JSON raises
    # JSONDecodeError, a malformed reply as the client's own does: `translate_call_error`).
    return json.loads(raw) if isinstance(raw, str) else raw


def json_object(value: Any, what: str) -> dict[str, Any]:
    """`value`, which must be a JSON object (`TypeError` naming `what` if it is not)."""
    if not isinstance(value, dict):
        raise TypeError(f"a {what} that is not a JSON object: {type(value).__name__}")
    return value


def json_list(value: Any, what: str) -> list[Any]:
    """`value`, which must be a JSON array (`TypeError` naming `what` if it is not)."""
    if not isinstance(value, list):
        raise TypeError(f"a {what} that is not a JSON array: {type(value).__name__}")
    return value


def member(value: Any, name: str) -> Any:
    """`value[name]` if `value` is a JSON object that has it, else None (for the usage, read leniently)."""
    return value.get(name) if isinstance(value, dict) else None
