"""The API's schema states what its validators take (`workers/api/contract.py`): each pattern is
held to the `orchestrator.validation` check behind it, both ways where the rule is exact, and
every text a request carries has a rule in the schema, so a new parameter cannot go unstated."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator import validation
from orchestrator.errors import InvalidInputError
from orchestrator.events import event_id, parse_id
from orchestrator.settings import Settings
from orchestrator.store.listing import encode_cursor
from workers.api import contract
from workers.api.routes import create_app

#: Deterministic: the same examples on every run, and nothing written to a database of examples.
SAMPLES = settings(derandomize=True, max_examples=100, database=None, deadline=None)


def accepts(check: Callable[[str], object], value: str) -> bool:
    try:
        check(value)
    except InvalidInputError:
        return False
    return True


def fits(rule: dict[str, Any], value: str) -> bool:
    """Whether `value` fits a schema rule as JSON Schema reads it (the pattern searched, as ECMA's `$`)."""
    size = rule.get("minLength", 0) <= len(value) <= rule.get("maxLength", sys.maxsize)
    return size and re.search(rule["pattern"].replace("$", r"\Z"), value) is not None


def texts_for(pattern: str) -> st.SearchStrategy[str]:
    """Text that fits the pattern, and any text, short, with control characters and spaces often."""
    odd = st.sampled_from(["\x00", "\x07", "\t", "\n", "\x1c", "\x7f", "\x85", "\x9f", " ", "\u3000", ",", "é"])
    mixed = st.lists(st.one_of(st.characters(), odd), max_size=12).map("".join)
    return st.one_of(st.from_regex(pattern.replace("$", r"\Z"), fullmatch=True), mixed)


EXACT = [
    ("run_id", contract.name(validation.RUN_ID_MAX), validation.known_run_id),
    ("session_id", contract.name(validation.SESSION_ID_MAX), validation.session_id),
    ("user_id", contract.name(validation.USER_ID_MAX), validation.user_id),
    ("agent", contract.name(validation.AGENT_NAME_MAX), validation.agent_name),
    ("fork_key", contract.name(validation.FORK_KEY_MAX), validation.fork_key),
    ("queue", contract.name(validation.QUEUE_NAME_MAX), validation.queue_name),
    ("input", contract.INPUT_TEXT, validation.input_text),
]


@pytest.mark.parametrize(("what", "rule", "check"), EXACT, ids=[e[0] for e in EXACT])
def test_an_exact_rule_takes_what_its_validator_takes_and_nothing_else(
    what: str, rule: dict[str, Any], check: Callable[[str], object]
) -> None:
    @SAMPLES
    @given(texts_for(rule["pattern"]))
    def agree(value: str) -> None:
        assert fits(rule, value) == accepts(check, value), value

    agree()


STRICTER = [
    ("Idempotency-Key", {**contract.name(256), "pattern": contract.HEADER_NAME}, validation.idempotency_key),
    ("status", contract.pattern(contract.STATUSES), validation.statuses),
    ("since", contract.pattern(contract.MOMENT), lambda text: validation.moment(text, now=0.0, what="since")),
    ("after", contract.pattern(contract.EVENT_ID), parse_id),
    ("Last-Event-ID", contract.LAST_EVENT_ID, lambda text: text and parse_id(text)),
]


@pytest.mark.parametrize(("what", "rule", "check"), STRICTER, ids=[e[0] for e in STRICTER])
def test_what_a_stricter_rule_takes_its_validator_takes(
    what: str, rule: dict[str, Any], check: Callable[[str], object]
) -> None:
    # Stated strictly where the server's rule is wider than a pattern says well (a time, any
    # case of a status): a client that follows the schema is never refused.
    @settings(SAMPLES, max_examples=25 if what == "status" else 100)  # a long pattern: slow to draw from
    @given(st.from_regex(rule["pattern"].replace("$", r"\Z"), fullmatch=True))
    def taken(value: str) -> None:
        assert not fits(rule, value) or accepts(check, value), value

    taken()


@pytest.mark.parametrize(
    ("rule", "refused"),
    [
        (contract.STATUSES, ["", "DONE", "ERROR,", " , ERROR", "ERR OR"]),
        (contract.MOMENT, ["", "someday", "2026-02-30", "6 hours", "1e9"]),
        (contract.EVENT_ID, ["", "1-2-3", "a-b-c-d", "1234567890-0-0-0"]),
        (contract.HEADER_NAME, ["", " key", "key\t", "k\x00"]),
    ],
)
def test_a_stricter_rule_still_refuses_what_its_validator_refuses(rule: str, refused: list[str]) -> None:
    assert [v for v in refused if re.search(rule.replace("$", r"\Z"), v)] == []


def test_every_cursor_a_listing_hands_out_fits_its_rule_and_every_event_id_within_nine_digits() -> None:
    for key in [(0.0, "r"), (1796114422.091988, "run-" + "x" * 60), (-1.5, "a b")]:
        assert re.fullmatch(contract.CURSOR, encode_cursor(key))
    assert re.fullmatch(contract.EVENT_ID, event_id((999_999_999, 0, 12, 7)))


def test_the_space_class_is_what_str_strip_takes_for_whitespace() -> None:
    every = "".join(map(chr, range(sys.maxunicode + 1)))
    assert set(re.findall(f"[{contract.SPACE}]", every)) == {c for c in every if c.isspace()}


def string_schemas(schema: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(where, schema) of each text a request can carry: parameters, and body fields."""
    found: list[tuple[str, dict[str, Any]]] = []
    for path, methods in schema["paths"].items():
        for method, operation in methods.items():
            for p in operation.get("parameters", []):
                s = p["schema"]
                s = s.get("items", s) if s.get("type") == "array" else s
                found.append((f"{method.upper()} {path} {p['in']} {p['name']}", s))
    for model, body in schema["components"]["schemas"].items():
        if model.endswith("Request"):
            found += [(f"{model}.{name}", s) for name, s in body["properties"].items()]
    return [
        (where, s) for where, s in found if "string" in {s.get("type"), *(a.get("type") for a in s.get("anyOf", []))}
    ]


def test_every_text_a_request_carries_has_its_limits_in_the_schema() -> None:
    schema = create_app(Settings(database_url="sqlite:///unused.db")).openapi()
    texts = string_schemas(schema)
    assert len(texts) > 20
    unstated = [where for where, s in texts if "pattern" not in s or "minLength" not in s]
    assert unstated == []
