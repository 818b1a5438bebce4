"""Making what a model or a tool returns storable, and errors describable.

Everything a model or a tool produces is untrusted (ARCHITECTURE.md, "What comes from outside"): it may hold
characters no database column can take (NUL on PostgreSQL; lone surrogates, which `os.listdir`
and `surrogateescape` produce, on both) or names and ids longer than their columns. Such text is
escaped, never dropped, and the message says so; names and ids are clipped or mapped to what the
schema holds. Producer input is not escaped here: it is refused at the door instead
(`orchestrator.validation`).
"""

from __future__ import annotations

import hashlib
import re

#: What no column can hold: NUL (PostgreSQL text) and lone surrogates (UTF-8 on both databases).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
#: Column widths of the message columns that hold model-chosen names (see `store.tables`).
TOOL_NAME_MAX = 256
TOOL_CALL_ID_MAX = 128
ERROR_TYPE_MAX = 128
#: A stored error's text is for people: long enough for a provider's message, not for a dump.
ERROR_MESSAGE_MAX = 4000


def _escape_char(match: re.Match[str]) -> str:
    char = match.group()
    return "\\x00" if char == "\x00" else f"\\u{ord(char):04x}"


def escape(text: str) -> tuple[str, int]:
    """`text` with NUL and lone surrogates written as `\\x00` and `\\udXXX`, and how many there were.

    The common case (nothing to escape) costs one scan and one encode of the text."""
    if "\x00" not in text:
        try:
            text.encode("utf-8")
            return text, 0
        except UnicodeEncodeError:
            pass
    return _UNSTORABLE.subn(_escape_char, text)


def storable_text(text: str) -> str:
    """`escape`d text, with a note at the end when anything was escaped (the model reads it too)."""
    escaped, count = escape(text)
    if not count:
        return text
    return (
        f"{escaped}\n[ratchet: {count} character(s) the run store cannot hold (NUL or lone surrogates) "
        "were escaped as \\x00 or \\udXXX]"
    )


def storable_name(text: str, limit: int) -> str:
    """A name or id for a column of `limit` characters: escaped, and if too long clipped with a
    short hash of the whole, so two long names that differ only at the end stay different."""
    escaped, _ = escape(text)
    if len(escaped) <= limit:
        return escaped
    digest = hashlib.sha256(escaped.encode("utf-8")).hexdigest()[:12]
    return f"{escaped[: limit - 14]}~{digest}"


def clip(text: str, limit: int) -> str:
    """Escaped and cut to `limit` characters, saying how much was cut."""
    escaped, _ = escape(text)
    if len(escaped) <= limit:
        return escaped
    note = f" [... {len(escaped) - limit} more characters cut]"
    return escaped[: max(0, limit - len(note))] + note


def safe_str(exc: BaseException) -> str:
    """`str(exc)`, even for an exception whose `__str__` raises (a tool's own exception class)."""
    try:
        return str(exc)
    except Exception as inner:  # the text of a tool's error must never fail the step
        try:
            why = f"{type(inner).__name__}: {inner}"
        except Exception:
            why = type(inner).__name__
        return f"<{type(exc).__name__} whose message could not be read: {why}>"


def shown(value: object) -> str:
    """`str(value)` for a value a tool returned, even one whose `__str__` raises."""
    try:
        return str(value)
    except Exception as exc:
        return f"<{type(value).__name__} that could not be shown: {safe_str(exc)}>"


def error_record(exc: BaseException) -> dict[str, str]:
    """The `(type, message)` stored on an ERROR row, for any exception.

    A database driver's error is described by its own message only: SQLAlchemy's text appends the
    SQL and its bound parameters (kilobytes of the run's own messages, possibly what made it fail),
    which is no error text for people and no place for a transcript."""
    to_record = getattr(exc, "to_record", None)
    if callable(to_record):
        try:
            record = dict(to_record())
            kind, message = str(record.get("type", type(exc).__name__)), str(record.get("message", ""))
        except Exception:
            kind, message = type(exc).__name__, safe_str(exc)
    else:
        kind, message = type(exc).__name__, safe_str(exc)
        orig = getattr(exc, "orig", None)
        if orig is not None and _is_statement_error(exc):
            kind = type(orig).__name__
            first = (safe_str(orig).strip().splitlines() or [""])[0]
            message = f"database error: {first}"
    return {"type": clip(kind, ERROR_TYPE_MAX), "message": clip(message, ERROR_MESSAGE_MAX)}


def _is_statement_error(exc: BaseException) -> bool:
    from sqlalchemy.exc import StatementError

    return isinstance(exc, StatementError)


__all__ = ["clip", "error_record", "escape", "safe_str", "shown", "storable_name", "storable_text"]
