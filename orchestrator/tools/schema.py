"""A tool's JSON schema from its signature and docstring.

Types and defaults come from the signature; each parameter's description from the docstring, read
by `docstring_parser` (as Agno reads it) in whichever of its styles finds the most parameters,
Google first: Google (`Args:`, `Arguments:`, `Parameters:`), NumPy (a `Parameters` section with
its dashed underline), reST (`:param x:`) and epydoc (`@param x:`). The docstring's text before
its sections (the short description, then the long one) is the tool's description.

An item of a Google section without its colon (`Raises:` then a bare `TypeError`, or an `Args:`
line `x the x`) makes `docstring_parser`'s Google parser refuse the whole docstring, and its
automatic choice then reads it in another style, whose description is the whole text, sections
and all. `TolerantGoogleParser` reads such an item as describing nothing and keeps the others;
and a description is cut at its first Google section header whichever style read it.
It overrides `_build_meta`, private to `docstring_parser`: pyproject.toml bounds it to the series
tests/unit/test_toolkit.py passed on.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, get_type_hints

import docstring_parser
from docstring_parser import Docstring, DocstringMeta, DocstringStyle, ParseError
from docstring_parser.google import GoogleParser
from pydantic import BaseModel, ConfigDict, Field, create_model

from orchestrator.errors import ConfigurationError

#: The keys `docstring_parser` gives what describes a parameter, in any style (`Args:`, NumPy's
#: `Other Parameters`, reST's `:param x:`, `:arg x:`, `:keyword x:`, epydoc's `@param x:`); not an
#: `Attributes` section's entries, which describe a class.
PARAMETER_KEYS = frozenset({"param", "parameter", "arg", "argument", "key", "keyword", "other_param"})


def docstring_parts(doc: str | None) -> tuple[str, dict[str, str]]:
    """The docstring's summary (its text before the first section) and its parameters' descriptions,
    each on one line (a description's lines joined by a space); a parameter without one is left out."""
    parsed = read_docstring(doc or "")
    summary = parsed.short_description or ""
    if parsed.long_description:
        summary += ("\n\n" if parsed.blank_after_short_description else "\n") + parsed.long_description
    header = GOOGLE.titles_re.search(summary)  # a reading that failed Google's: its sections' text
    if header:
        summary = summary[: header.start()]
    params = {p.arg_name: _one_line(p.description) for p in parsed.params if p.args[0] in PARAMETER_KEYS}
    return summary.strip(), {name: text for name, text in params.items() if text}


class TolerantGoogleParser(GoogleParser):
    """`docstring_parser`'s Google parser, which reads an item it cannot parse as describing nothing
    (not a parameter) where the library's refuses the whole docstring."""

    def _build_meta(self, text: str, title: str) -> DocstringMeta:
        try:
            return super()._build_meta(text, title)
        except ParseError:  # no colon (`TypeError` alone, `x the x`): the section's other items stand
            return DocstringMeta(args=["unparsed", title], description=text)


GOOGLE = TolerantGoogleParser()


def read_docstring(doc: str) -> Docstring:
    """The reading of `doc` that finds the most parameters (then the most sections' items), in
    Google, NumPy, reST and epydoc style; Google's on a tie, a docstring of prose included."""
    readings: list[Docstring] = []
    for style in (DocstringStyle.GOOGLE, DocstringStyle.NUMPYDOC, DocstringStyle.REST, DocstringStyle.EPYDOC):
        try:
            if style is DocstringStyle.GOOGLE:
                readings.append(GOOGLE.parse(doc))
            else:
                readings.append(docstring_parser.parse(doc, style=style))
        except ParseError:
            continue
    if not readings:
        return Docstring()
    return max(readings, key=lambda d: (sum(p.args[0] in PARAMETER_KEYS for p in d.params), len(d.meta)))


def _one_line(text: str | None) -> str:
    return " ".join(line.strip() for line in (text or "").splitlines() if line.strip())


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
