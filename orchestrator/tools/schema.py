"""A tool's JSON schema from its signature and docstring.

Types and defaults come from the signature; each parameter's description from the docstring, read
by `docstring_parser` (as Agno reads it) in whichever of its styles finds the most parameters,
Google first: Google (`Args:`, `Arguments:`, `Parameters:`), NumPy (a `Parameters` section with
its dashed underline), reST (`:param x:`) and epydoc (`@param x:`). The docstring's text before
its sections (the short description, then the long one) is the tool's description.

An item of a Google section without its colon (`Raises:` then a bare `TypeError`, or an `Args:`
line `x the x`) makes `docstring_parser`'s Google parser refuse the whole docstring, and another
style then reads it with the whole text, sections and all, as its description. So a Google reading
that fails is tried again without those items (`without_unparsed_items`: such an item describes
nothing; the section's other items stand), and a description is cut at its first Google section
header whichever style read it. Only the library's public `parse` is used.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any, get_type_hints

import docstring_parser
from docstring_parser import Docstring, DocstringStyle, ParseError
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
    header = SECTION.search(summary)  # a reading that failed Google's: its sections' text
    if header:
        summary = summary[: header.start()]
    params = {p.arg_name: _one_line(p.description) for p in parsed.params if p.args[0] in PARAMETER_KEYS}
    return summary.strip(), {name: text for name, text in params.items() if text}


#: A Google section's header line, as docstring_parser knows them: its title alone, then a colon.
SECTION = re.compile(
    r"^[ \t]*(Args|Arguments|Parameters|Params|Other Parameters|Keyword Args|Keyword Arguments|Kwargs|Attributes"
    r"|Raises|Raise|Exceptions|Except|Returns|Return|Yields|Yield|Examples?|Notes?|Warnings?|See Also|Todo"
    r"|References):[ \t]*$",
    re.MULTILINE,
)


def without_unparsed_items(doc: str) -> str:
    """`doc` without the items of its Google sections that have no colon (an item is a section's
    line at the section's first indentation; deeper lines continue the item above)."""
    lines = inspect.cleandoc(doc).splitlines()
    kept: list[str] = []
    item_indent: int | None = None  # inside a section: its items' indentation, once seen
    in_section = False
    for line in lines:
        indent = len(line) - len(line.lstrip())
        if SECTION.match(line):
            in_section, item_indent = True, None
        elif in_section and line.strip():
            if indent == 0:
                in_section = False  # the section ended: prose again
            else:
                item_indent = indent if item_indent is None else item_indent
                if indent == item_indent and ":" not in line:
                    continue  # `TypeError` alone, `x the x`: describes nothing
        kept.append(line)
    return "\n".join(kept)


def _google(doc: str) -> Docstring:
    try:
        return docstring_parser.parse(doc, style=DocstringStyle.GOOGLE)
    except ParseError:
        return docstring_parser.parse(without_unparsed_items(doc), style=DocstringStyle.GOOGLE)


def read_docstring(doc: str) -> Docstring:
    """The reading of `doc` that finds the most parameters (then the most sections' items), in
    Google, NumPy, reST and epydoc style; Google's on a tie, a docstring of prose included."""
    readings: list[Docstring] = []
    for style in (DocstringStyle.GOOGLE, DocstringStyle.NUMPYDOC, DocstringStyle.REST, DocstringStyle.EPYDOC):
        try:
            google = style is DocstringStyle.GOOGLE
            readings.append(_google(doc) if google else docstring_parser.parse(doc, style=style))
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
