"""Tool-call arguments the scripted model makes up from a tool's JSON schema: every required
property, with the user's text for strings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def arguments_from_schema(parameters: Mapping[str, Any] | None, user_text: str) -> dict[str, Any]:
    """Arguments that satisfy a JSON schema's required properties, with the user's text for strings."""
    if not parameters:
        return {}
    properties = parameters.get("properties") or {}
    args: dict[str, Any] = {}
    for name in parameters.get("required") or []:
        args[name] = _value_for(properties.get(name) or {}, user_text)
    return args


def _value_for(schema: Mapping[str, Any], user_text: str) -> Any:
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        # ["string", "null"] is how optional values are spelled; pick the real type.
        kind = next((k for k in kind if k != "null"), None)
    if kind is None and schema.get("anyOf"):
        options = [s for s in schema["anyOf"] if s.get("type") != "null"]
        return _value_for(options[0], user_text) if options else None
    defaults: dict[str, Any] = {
        "string": user_text,
        "integer": 1,
        "number": 1.0,
        "boolean": True,
        "array": [],
        "object": {},
    }
    return defaults.get(str(kind))
