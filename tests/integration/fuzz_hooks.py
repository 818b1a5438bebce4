"""Schemathesis hooks of the API's fuzz test (tests/integration/test_api_fuzz.py), loaded through
SCHEMATHESIS_HOOKS: each failure filter drops one kind of failure that is not a disagreement
between the schema and the server, named narrowly so that anything else still fails the run; the
others bound how long a request holds the server, and leave out of the fuzzed schema one limit
the fuzzer cannot work with."""

from __future__ import annotations

from typing import Any

import schemathesis


def _error(response: Any) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body.get("error", {}) if isinstance(body, dict) else {}


@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    """Keep every failure but these six."""
    # A cursor is whatever a listing handed out, which no schema can state: one the server did
    # not issue is refused (422) however well it fits the pattern.
    if (
        failure.code == "ST202"
        and case.path in ("/runs", "/batches/continue", "/batches/cancel")
        and "not one a listing returned" in _error(response).get("message", "")
    ):
        return False
    # A definition hash to accept is one a worker served, which no schema can state either: one
    # no worker served is refused (422) however well it fits the pattern.
    if (
        failure.code == "ST202"
        and case.path == "/runs/{run_id}/continue"
        and _error(response).get("message", "").startswith("accept_definition: no worker ever served")
    ):
        return False
    # A cron expression's grammar and the IANA zones are more than a schema states: an expression
    # or a zone the server cannot read is refused (422) however well it fits the schema's text.
    if (
        failure.code == "ST202"
        and case.path == "/schedules"
        and _error(response).get("message", "").startswith(("cron ", "timezone "))
    ):
        return False
    # Where a webhook may go is the host's address, which DNS and RATCHET_WEBHOOK_ALLOW decide, not
    # the URL's text: a URL that fits the schema may still be refused (422, saying why).
    if failure.code == "ST202" and case.path == "/runs" and _error(response).get("message", "").startswith("webhook "):
        return False
    # No worker runs beside the fuzzed server, so /health/checks reports that one is missing:
    # a 503 with the report, as the schema says.
    if failure.code == "ST101" and case.path == "/health/checks" and response.status_code == 503:
        return False
    # Schemathesis 4.32's coverage phase labels some cases positive whose body it generated
    # negative (a header's boundary case sent with a body of `0`): not a request the schema allows.
    meta = case.meta
    negative_part = meta is not None and any(c.mode.is_negative for c in meta.components.values())
    return not (failure.code == "ST202" and negative_part)


#: The longest a fuzzed request may hold the server, in seconds: a wait for a run no worker takes,
#: or a health check for a worker that is not there, lasts as long as it is asked to.
HOLD = 0.2
#: The parameter that says how long, on the routes that hold a request, and its largest value.
_HELD = {"/runs/{run_id}/wait": ("timeout", 300.0), "/health/checks": ("timeout", 60.0)}


@schemathesis.hook
def map_case(context: Any, case: Any) -> Any:
    """A wait or a health check asks for HOLD seconds at most: a longer time in range is as
    valid, and only slower. A time out of range, or not a number, stays as generated (it may be
    what a negative case is about)."""
    held = _HELD.get(case.operation.path)
    if held is not None:
        name, most = held
        query = dict(case.query or {})
        given = _seconds(query.get(name, most))
        if given is not None and HOLD < given <= most:
            query[name] = HOLD
            case.query = query
    return case


def _seconds(value: object) -> float | None:
    """A number of seconds as generated (a number, or its text in a query); None if not one."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        return float(value)
    except ValueError:
        return None


#: The bodies whose `input` states the 1 MiB limit as a maxLength of 1,048,576 characters.
_INPUTS = ("StartRequest", "ContinueRequest")


@schemathesis.hook
def before_load_schema(context: Any, raw_schema: dict[str, Any]) -> None:
    """The fuzzed copy of the schema states no maxLength on `input`. Schemathesis folds a length
    into a pattern's quantifiers (`^[^\\x00]{0,1048575}...`), which the regex engine of its
    canonicalizer refuses after 3-7 s, every time it meets the schema (eight times a run): it then
    skipped those cases, so no input near the limit was ever sent, and most of the run went there.
    Without it, the coverage phase covers the input's pattern in a third of the time. The limit
    is held elsewhere: the check (`tests/unit/test_validation.py`, `test_producer_input.py`) and
    the schema's statement of it (`tests/unit/test_api_contract.py`)."""
    for model in _INPUTS:
        raw_schema["components"]["schemas"][model]["properties"]["input"].pop("maxLength")
