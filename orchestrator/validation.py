"""Checks at the door: what a producer passes (ids, names, input) is refused here with one clear
InvalidInputError, before it reaches the store, the broker or a model.

Every producer entry goes through these in the run control (`orchestrator.control`), which
`Client` (and so `Agent.run` and the CLI) and the Celery tasks `ratchet.start_run` and
`ratchet.continue_run` call.

The limits follow the columns (`orchestrator/store/tables.py`) and where the values travel. A
run id is also sent to the model as an HTTP header and is part of Celery task ids, so it is
plain ASCII without spaces. Names and ids are stored in VARCHAR columns and shown on terminals,
so they hold no control characters. Text is stored as UTF-8 and PostgreSQL cannot store NUL,
so no value holds a NUL or a lone surrogate (which is what invalid UTF-8 on a command line
decodes to). Every message shows a value through `repr`, which escapes both.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from orchestrator import state
from orchestrator.errors import InvalidInputError
from orchestrator.requirements import DEADLINE
from orchestrator.status import RunStatus

RUN_ID_MAX = 64
SESSION_ID_MAX = 128
USER_ID_MAX = 128
AGENT_NAME_MAX = 256
FORK_KEY_MAX = 256
IDEMPOTENCY_KEY_MAX = 256
#: The longest queue or worker name a health check takes (AMQP's limit for a queue's name).
QUEUE_NAME_MAX = 255
#: The most runs one page of a listing holds.
PAGE_MAX = 1000
#: A duration as text: a number and a unit (s, m, h, d or w), like "90s", "30m", "36h", "30d", "2w".
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", re.IGNORECASE)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
DURATION_RULE = 'a number of seconds, or a number and a unit (s, m, h, d or w), like "30m", "36h" or "30d"'
#: The largest input message, in bytes of UTF-8: one user message, not a document store.
INPUT_MAX_BYTES = 1 << 20
#: A run's priorities: 0 (the lowest, as no priority) to 9 (the highest).
PRIORITY_MIN, PRIORITY_MAX = 0, 9
#: The longest deadline a run may be given (`run_timeout`): 366 days, in seconds.
RUN_TIMEOUT_MAX = 366 * 86400.0

RUN_ID_RULE = f"1-{RUN_ID_MAX} characters of A-Z, a-z, 0-9, '.', '_', ':' and '-'"
_RUN_ID = re.compile(rf"[A-Za-z0-9._:-]{{1,{RUN_ID_MAX}}}")
#: Unicode categories refused in names and ids: control characters and (lone) surrogates.
_UNPRINTABLE = frozenset({"Cc", "Cs"})


def run_id(value: object, *, what: str = "run_id") -> str:
    """A run id as given, or InvalidInputError naming the rule."""
    text = _string(value, what)
    if _RUN_ID.fullmatch(text) is None:
        size = f" ({len(text)} characters)" if len(text) > RUN_ID_MAX else ""
        raise InvalidInputError(f"{what} {_show(text)}{size} is not a valid run id: use {RUN_ID_RULE}")
    return text


def known_run_id(value: object) -> str:
    """The id of a run to look up: 1-64 characters, no control characters, valid UTF-8.

    Laxer than `run_id`, which new runs must follow: a run created before that rule existed
    (with a space, say) can still be read, continued and cancelled."""
    try:
        return _name(value, "run_id", RUN_ID_MAX)
    except InvalidInputError as exc:
        raise InvalidInputError(f"not a valid run id: {exc}") from None


def requirement_id(value: object) -> str:
    """The id of a paused run's requirement: 1-64 characters, no control characters."""
    return _name(value, "requirement_id", RUN_ID_MAX)


def decider(value: object) -> str:
    """Who decides a requirement, as stored with the decision: 1-128 characters, no control
    characters, and not "deadline", the name a deadline's own decision is stored under."""
    name = _name(value, "by", USER_ID_MAX)
    if name == DEADLINE:
        raise InvalidInputError(
            f"by={name!r} is the name Ratchet stores a deadline's own decision under; name who decides instead"
        )
    return name


def session_id(value: object) -> str:
    """A session id: 1-128 characters, no control characters, valid UTF-8."""
    return _name(value, "session_id", SESSION_ID_MAX)


def user_id(value: object) -> str:
    """A user id: 1-128 characters, no control characters, valid UTF-8."""
    return _name(value, "user_id", USER_ID_MAX)


def session_state(value: object) -> dict[str, Any]:
    """A run's session state: a JSON object (string keys, JSON values) of at most 1 MiB as JSON,
    returned as it will read back once stored (tuples as lists)."""
    try:
        return state.normalised(value)
    except state.StateError as exc:
        raise InvalidInputError(f"{exc}; it is merged over the session's stored state, key by key") from None


def agent_name(value: object) -> str:
    """The name of an agent or team: 1-256 characters, no control characters, valid UTF-8."""
    return _name(value, "agent", AGENT_NAME_MAX)


#: A definition hash (`orchestrator.catalog`): SHA-256 in lowercase hex.
_DEFINITION_HASH = re.compile(r"[0-9a-f]{64}")
#: The most agents one continue's `accept_definition` names.
ACCEPTED_MAX = 64


def accept_definition(value: object) -> str | dict[str, str]:
    """What a continue accepts (`orchestrator.deploys`): a definition hash for the continued run,
    or a mapping of agent names (its team's members) to definition hashes."""
    if isinstance(value, str):
        return definition_hash(value)
    if not isinstance(value, dict) or not value:
        raise InvalidInputError(
            "accept_definition must be a definition hash (64 hex digits), or a mapping of agent names to "
            f"definition hashes, not {_show(repr(value))}"
        )
    if len(value) > ACCEPTED_MAX:
        raise InvalidInputError(f"accept_definition names {len(value)} agents; the limit is {ACCEPTED_MAX}")
    return {
        agent_name(name): definition_hash(hash_, what=f"accept_definition[{name!r}]") for name, hash_ in value.items()
    }


def definition_hash(value: object, *, what: str = "accept_definition") -> str:
    """A definition hash as `ratchet agents NAME` and a DefinitionChangedError show it: 64 hex digits."""
    text = _string(value, what)
    if _DEFINITION_HASH.fullmatch(text) is None:
        raise InvalidInputError(
            f"{what} {_show(text)} is not a definition hash: give all 64 lowercase hex digits, as "
            "`ratchet agents NAME` and the run's DefinitionChangedError show them"
        )
    return text


def fork_key(value: object) -> str:
    """A producer's key for a fork: 1-256 characters, no control characters, valid UTF-8."""
    return _name(value, "fork_key", FORK_KEY_MAX)


def idempotency_key(value: object) -> str:
    """An HTTP API client's Idempotency-Key: 1-256 characters, no control characters."""
    return _name(value, "Idempotency-Key", IDEMPOTENCY_KEY_MAX)


def queue_name(value: object, *, what: str = "queue") -> str:
    """A broker queue's or a worker's name: 1-255 characters, no control characters."""
    return _name(value, what, QUEUE_NAME_MAX)


def flag(value: object, *, what: str) -> bool:
    """A yes/no argument: a real bool (JSON true/false), not text that looks like one."""
    if not isinstance(value, bool):
        raise InvalidInputError(f"{what} must be true or false, not {_show(repr(value))}")
    return value


def priority(value: object) -> int:
    """A run's priority: an int from 0 to 9, higher first."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(
            f"priority must be an int from {PRIORITY_MIN} to {PRIORITY_MAX} (higher runs first), "
            f"not {type(value).__name__}"
        )
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise InvalidInputError(
            f"priority {value} is out of range: give {PRIORITY_MIN} (the lowest, as no priority) to "
            f"{PRIORITY_MAX} (the highest)"
        )
    return value


def run_timeout(value: object, *, what: str = "run_timeout") -> float:
    """A run's deadline, in seconds from its start (or from the continue that gives it): above 0
    and at most RUN_TIMEOUT_MAX, as seconds (a number), a timedelta, or text such as "30m"."""
    seconds = duration(value, what=what)
    if not 0 < seconds <= RUN_TIMEOUT_MAX:
        raise InvalidInputError(
            f"{what} is {value!r}: give a deadline above 0 and at most {RUN_TIMEOUT_MAX:.0f} seconds (366 days), "
            f"{DURATION_RULE}"
        )
    return seconds


def input_text(value: object, *, what: str = "input") -> str:
    """A user message: a non-empty str without NUL or lone surrogates, at most 1 MiB of UTF-8."""
    if not isinstance(value, str):
        raise InvalidInputError(f"{what} must be a str (the user's message), not {type(value).__name__}")
    if not value.strip():
        raise InvalidInputError(f"{what} is empty: a run needs a non-empty input message")
    nul = value.find("\x00")
    if nul >= 0:
        raise InvalidInputError(
            f"{what} contains a NUL character at index {nul}, which the database cannot store; "
            "remove it (send binary data encoded, e.g. as base64)"
        )
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidInputError(
            f"{what} is not valid UTF-8 text: {_describe(value[exc.start])} at index {exc.start} "
            "(invalid bytes decoded with surrogateescape?); send valid UTF-8"
        ) from None
    if size > INPUT_MAX_BYTES:
        raise InvalidInputError(
            f"{what} is {size} bytes of UTF-8; the limit is {INPUT_MAX_BYTES} bytes (1 MiB): pass a large "
            "document by reference (a URL or a file id that a tool can read)"
        )
    return value


def statuses(value: object, *, what: str = "status") -> tuple[RunStatus, ...]:
    """Run statuses to filter on: None (any), a RunStatus or its name in any case, or several (an
    iterable of those, or names separated by commas); in the order given, without repeats."""
    if value is None:
        return ()
    if isinstance(value, str):  # a RunStatus is a str too
        items: list[object] = list(value.split(","))
    elif isinstance(value, Iterable):
        items = list(value)
    else:
        raise InvalidInputError(f"{what} must be a run status or several, not {type(value).__name__}")
    found: list[RunStatus] = []
    for item in items:
        try:
            if not isinstance(item, str):
                raise ValueError(item)
            status = RunStatus(item.strip().upper())
        except ValueError:
            known = ", ".join(s.value for s in RunStatus)
            raise InvalidInputError(f"{what} {_show(str(item))} is not a run status: use {known}") from None
        if status not in found:
            found.append(status)
    return tuple(found)


def page_size(value: object) -> int:
    """How many runs a page of a listing holds: 1 to PAGE_MAX."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= PAGE_MAX:
        raise InvalidInputError(f"limit is {value!r}: give a whole number of runs from 1 to {PAGE_MAX}")
    return value


def cursor(value: object) -> str:
    """A listing's cursor: text as a page's next_cursor gave it (what it names is the store's to check)."""
    if not isinstance(value, str) or not value or len(value) > 1024:
        raise InvalidInputError("cursor must be the next_cursor of the previous page, as it was returned")
    return value


def duration(value: object, *, what: str = "older_than") -> float:
    """A length of time in seconds (>= 0): seconds as a number, a timedelta, or text such as "30d"."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.fullmatch(value)):
        seconds = float(m[1]) * _UNITS[m[2].lower()]
    elif isinstance(value, str) and _is_number(value):
        seconds = float(value)
    else:
        raise InvalidInputError(f"{what} {_show(str(value))} is not a duration: give {DURATION_RULE}")
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidInputError(f"{what} is {value!r}: give a duration of zero or more, {DURATION_RULE}")
    return seconds


def moment(value: object, *, now: float, what: str) -> float | None:
    """A point in time as UNIX seconds: None; UNIX seconds as a number; a datetime (naive: local
    time); or text: ISO 8601 ("2026-03-01", "2026-03-01T09:30:00+01:00"; local time without an
    offset), UNIX seconds, or a duration ago ("30m", "6h", "7d")."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    if isinstance(value, str):
        if _is_number(value):
            return float(value)
        if _DURATION.fullmatch(value):
            return now - duration(value, what=what)
        try:
            return datetime.fromisoformat(value.strip()).timestamp()
        except ValueError:
            pass
    raise InvalidInputError(
        f"{what} {_show(str(value))} is not a time: give an ISO 8601 date or time (2026-03-01T09:30), "
        'UNIX seconds, or how long ago ("30m", "6h", "7d")'
    )


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _string(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidInputError(f"{what} must be a str, not {type(value).__name__}")
    return value


def _name(value: object, what: str, limit: int) -> str:
    text = _string(value, what)
    if not text:
        raise InvalidInputError(f"{what} is empty: give 1-{limit} characters")
    if len(text) > limit:
        raise InvalidInputError(f"{what} is {len(text)} characters long; the limit is {limit}")
    for i, char in enumerate(text):
        if unicodedata.category(char) in _UNPRINTABLE:
            raise InvalidInputError(
                f"{what} {_show(text)} contains {_describe(char)} at index {i}: "
                "names and ids must be valid UTF-8 without control characters"
            )
    return text


def _describe(char: str) -> str:
    kind = "a lone surrogate" if unicodedata.category(char) == "Cs" else "a control character"
    return f"{kind} (U+{ord(char):04X})"


def _show(text: str, limit: int = 80) -> str:
    """The value for a message: `repr` escapes what a terminal or an encoder would choke on."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + "..."
