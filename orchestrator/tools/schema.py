"""A tool's JSON schema from its signature and docstring.

Types and defaults come from the signature; each parameter's description from the docstring's
`Args:` section (Google style; `Arguments:`, `Parameters:` and a numpy-style `Parameters` section
with its dashed underline are read too). The docstring's text before its first section is the
tool's description.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, create_model

from orchestrator.errors import ConfigurationError

_ARGS_HEADERS = {"args", "arguments", "parameters", "params"}
_OTHER_HEADERS = {
    "returns", "return", "yields", "raises", "examples", "example", "notes", "note", "see also",
    "attributes", "warnings", "warning", "references", "todo", "other parameters",
}  # fmt: skip
# `name: text`, `name (int): text`, `name (int, optional): text`; numpy: `name : int` (a space before
# the colon), its text on the indented lines below.
_GOOGLE_ITEM = re.compile(r"^\*{0,2}(\w+)(?:\s*\([^)]*\))?:\s*(.*)$")
_NUMPY_ITEM = re.compile(r"^(\w+)\s*(?::\s*.*)?$")


def docstring_parts(doc: str | None) -> tuple[str, dict[str, str]]:
    """The docstring's summary (text before its first section) and its parameter descriptions."""
    lines = inspect.cleandoc(doc or "").splitlines()
    summary: list[str] = []
    params: dict[str, str] = {}
    i = 0
    while i < len(lines):
        header = _section_header(lines, i)
        if header is None:
            summary.append(lines[i])
            i += 1
            continue
        name, i = header
        body, i = _section_body(lines, i)
        if name in _ARGS_HEADERS:
            params.update(_parse_items(body))
        while i < len(lines) and _section_header(lines, i) is None:
            i += 1  # text after a section belongs to it, not to the summary
    return "\n".join(summary).strip(), params


def _section_header(lines: list[str], i: int) -> tuple[str, int] | None:
    """The section starting at line i (its lowercased name, the index after the header), if any."""
    text = lines[i].strip()
    if text.endswith(":") and text[:-1].lower() in _ARGS_HEADERS | _OTHER_HEADERS and lines[i] == lines[i].lstrip():
        return text[:-1].lower(), i + 1
    underline = lines[i + 1].strip() if i + 1 < len(lines) else ""
    if text.lower() in _ARGS_HEADERS | _OTHER_HEADERS and underline and set(underline) == {"-"}:
        return text.lower(), i + 2
    return None


def _section_body(lines: list[str], i: int) -> tuple[list[str], int]:
    """The section's lines up to the next header (or a blank line then unindented text)."""
    body: list[str] = []
    while i < len(lines) and _section_header(lines, i) is None:
        body.append(lines[i])
        i += 1
    return body, i


def _parse_items(body: list[str]) -> dict[str, str]:
    """Each item's description: its first line's text after the colon and its indented lines."""
    nonblank = [line for line in body if line.strip()]
    if not nonblank:
        return {}
    base = min(len(line) - len(line.lstrip()) for line in nonblank)
    items: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in nonblank:
        indent, text = len(line) - len(line.lstrip()), line.strip()
        if indent == base:
            google = _GOOGLE_ITEM.match(text)
            numpy = None if google else _NUMPY_ITEM.match(text)
            if google:
                current = items[google.group(1)] = [google.group(2)] if google.group(2) else []
            elif numpy:
                current = items[numpy.group(1)] = []
            else:
                current = None
        elif current is not None:
            current.append(text)
    return {name: " ".join(words).strip() for name, words in items.items() if " ".join(words).strip()}


def signature_model(
    fn: Callable[..., Any], name: str, descriptions: dict[str, str], context_type: type, *injected: str
) -> tuple[str | None, type[BaseModel]]:
    """The pydantic model of the function's arguments, and the name of its context parameter;
    parameters named in `injected` are the engine's to pass, left out of the model too."""
    try:
        hints = get_type_hints(fn, include_extras=True)  # keep Annotated constraints and validators
    except Exception as exc:  # an unresolvable annotation is the user's to fix, named here
        raise ConfigurationError(f"tool {name}: cannot read its type hints: {exc}") from exc
    context_param = None
    fields: dict[str, Any] = {}
    for pname, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ConfigurationError(f"tool {name}: *args/**kwargs cannot be described to a model")
        annotation = hints.get(pname, Any)
        if annotation is context_type or annotation == context_type | None:  # the engine's to pass
            context_param = pname
            continue
        if pname in injected:
            continue
        default = ... if param.default is param.empty else param.default
        if pname in descriptions:
            default = Field(default, description=descriptions[pname])
        fields[pname] = (annotation, default)
    model = create_model(f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
    return context_param, model
