"""The API's schema states what its validators take (`workers/api/contract.py`): each pattern is
held to the `orchestrator.validation` check behind it, both ways where the rule is exact, and
every text a request carries has a rule in the schema, so a new parameter cannot go unstated.
And it names what a generated client is built from: every operation by an explicit operationId
and a summary of its own, every error status it answers with the one error body."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.routing import iter_route_contexts
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator import validation
from orchestrator.errors import InvalidInputError
from orchestrator.events import event_id, parse_id
from orchestrator.settings import Settings
from orchestrator.store.listing import encode_cursor
from workers.api import contract, create_app

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
    ("requirement_id", contract.name(validation.RUN_ID_MAX), validation.requirement_id),
    ("by", contract.DECIDER, validation.decider),
    ("accept_definition", contract.DEFINITION, validation.definition_hash),
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
    # And the size of an input, as `validation.input_text` limits it
    bodies = schema["components"]["schemas"]
    assert {bodies[m]["properties"]["input"]["maxLength"] for m in ("StartRequest", "ContinueRequest")} == {
        validation.INPUT_MAX_BYTES
    }


def operations(schema: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """("METHOD /path", operation) of each operation in the schema."""
    return [(f"{m.upper()} {p}", o) for p, methods in schema["paths"].items() for m, o in methods.items()]


def test_every_operation_has_an_explicit_camel_case_id_and_a_summary_of_its_own() -> None:
    app = create_app(Settings(database_url="sqlite:///unused.db"))
    stated = operations(app.openapi())
    assert len(stated) >= 17
    ids = [o.get("operationId", "") for _, o in stated]
    # Given in each route (FastAPI's generated ones read `start_run_runs_post`), and stable: a
    # generated client names its methods after them
    assert [i for i in ids if not re.fullmatch(r"[a-z]+([A-Z][a-z]+)*", i)] == []
    given = {r.operation_id for r in iter_route_contexts(app.routes) if getattr(r, "include_in_schema", False)}
    assert set(ids) == given and len(set(ids)) == len(ids), ids
    summaries = [o.get("summary", "") for _, o in stated]
    assert "" not in summaries and len(set(summaries)) == len(summaries), summaries
    assert {"startRun", "getRun", "getSession", "getSessionRuns", "streamRunEvents"} <= set(ids)
    assert {"decideRequirement", "listApprovals"} <= set(ids)


def test_every_link_names_an_operation_of_the_schema() -> None:
    schema = create_app(Settings(database_url="sqlite:///unused.db")).openapi()
    ids = {o["operationId"] for _, o in operations(schema)}
    links = schema["paths"]["/runs"]["post"]["responses"]["202"]["links"]
    assert {link["operationId"] for link in links.values()} <= ids and len(links) == 9


def error_schemas(schema: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """(operation, status) -> the content of each 4xx and 5xx response the schema states."""
    return {
        (where, status): response.get("content", {})
        for where, operation in operations(schema)
        for status, response in operation["responses"].items()
        if status[0] in "45"
    }


@pytest.mark.parametrize("tokens", ["", "t0k3n"], ids=["without tokens", "with tokens"])
def test_every_error_status_of_every_operation_is_the_error_body_in_json(tokens: str) -> None:
    schema = create_app(Settings(database_url="sqlite:///unused.db", api_tokens=tokens)).openapi()
    errors = error_schemas(schema)
    body = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    # A failed health check answers its report, which says what failed in `detail` too
    report = {("GET /health/checks", "503")}
    assert {where: content for where, content in errors.items() if content != body and where not in report} == {}
    assert "detail" in schema["components"]["schemas"]["HealthReport"]["properties"]
    error_body = schema["components"]["schemas"]["ErrorBody"]
    assert error_body["required"] == ["detail", "error"] and error_body["properties"]["detail"]["type"] == "string"
    assert "HTTPValidationError" not in schema["components"]["schemas"]  # FastAPI's 422, never answered
    # Every operation may fail on the server; a stream's refusals are JSON like the others'
    assert {where for where, _ in operations(schema)} == {where for where, status in errors if status == "500"}
    assert {"401", "404", "422"} <= {status for where, status in errors if where == "GET /runs/{run_id}/events"}
    # Without tokens, the refusals of the Guard in front of every route (`workers.api.loopback`)
    guarded = {(where, status) for where, status in errors if status in {"403", "415", "421"}}
    if tokens:
        assert guarded == set()
    else:
        writes = {where for where, _ in operations(schema) if not where.startswith("GET ")}
        assert {where for where, status in guarded if status == "415"} == writes
        assert {where for where, status in guarded if status == "421"} == {where for where, _ in operations(schema)}
