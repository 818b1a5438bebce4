"""The checks at the door: each mistake a producer can make gets one InvalidInputError that names
the argument and the rule, and never carries a character a terminal or an encoder chokes on."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from orchestrator import validation
from orchestrator.errors import ConfigurationError, InvalidInputError
from orchestrator.status import RunStatus

MISTAKES: dict[str, tuple[Callable[[], object], str]] = {
    "a run id of 65 characters": (
        lambda: validation.run_id("r" * 65),
        r"\(65 characters\) is not a valid run id: use 1-64 characters of A-Z, a-z, 0-9, '.', '_', ':' and '-'",
    ),
    "a run id with a non-ASCII letter": (lambda: validation.run_id("rün-1"), r"'rün-1' is not a valid run id"),
    "a run id with a newline": (lambda: validation.run_id("a\nb"), r"'a\\nb' is not a valid run id"),
    "a run id with a space": (lambda: validation.run_id("a b"), "not a valid run id"),
    "an empty run id": (lambda: validation.run_id(""), "'' is not a valid run id"),
    "a run id that is not a str": (lambda: validation.run_id(42), "run_id must be a str, not int"),
    "a session id of 129 characters": (
        lambda: validation.session_id("s" * 129),
        "session_id is 129 characters long; the limit is 128",
    ),
    "a session id with a NUL": (
        lambda: validation.session_id("s\x00"),
        r"session_id 's\\x00' contains a control character \(U\+0000\) at index 1",
    ),
    "a session id with a lone surrogate": (
        lambda: validation.session_id("caf\udce9"),
        r"contains a lone surrogate \(U\+DCE9\) at index 3: names and ids must be valid UTF-8",
    ),
    "an empty session id": (lambda: validation.session_id(""), "session_id is empty"),
    "an agent name of 257 characters": (
        lambda: validation.agent_name("a" * 257),
        "agent is 257 characters long; the limit is 256",
    ),
    "an agent name with a tab": (lambda: validation.agent_name("a\tb"), r"control character \(U\+0009\)"),
    "an input that is an int": (
        lambda: validation.input_text(5),
        r"input must be a str \(the user's message\), not int",
    ),
    "an empty input": (lambda: validation.input_text(""), "input is empty: a run needs a non-empty input message"),
    "a blank input": (lambda: validation.input_text(" \n"), "non-empty input"),
    "an input with a NUL": (lambda: validation.input_text("ab\x00"), "NUL character at index 2"),
    "an input with a lone surrogate": (
        lambda: validation.input_text("caf\udce9"),
        r"input is not valid UTF-8 text: a lone surrogate \(U\+DCE9\) at index 3",
    ),
    "an input over 1 MiB": (
        lambda: validation.input_text("é" * (1 << 19) + "x"),
        r"input is 1048577 bytes of UTF-8; the limit is 1048576 bytes \(1 MiB\)",
    ),
    "a fork key with a NUL": (lambda: validation.fork_key("k\x00"), "fork_key 'k\\\\x00' contains a control"),
    "a status that is none": (
        lambda: validation.statuses("ERROR,DONE"),
        "status 'DONE' is not a run status: use QUEUED, RUNNING, WAITING, PAUSED, ERROR, COMPLETED, CANCELLED",
    ),
    "a status that is an int": (lambda: validation.statuses([5]), "status '5' is not a run status"),
    "statuses that are an int": (lambda: validation.statuses(5), "status must be a run status or several, not int"),
    "a page of none": (lambda: validation.page_size(0), "limit is 0: give a whole number of runs from 1 to 1000"),
    "a page too large": (lambda: validation.page_size(1001), "from 1 to 1000"),
    "a page of True": (lambda: validation.page_size(True), "from 1 to 1000"),
    "a duration in words": (lambda: validation.duration("a month"), r"older_than 'a month' is not a duration: give"),
    "a negative duration": (lambda: validation.duration(-5), "give a duration of zero or more"),
    "an endless duration": (lambda: validation.duration(float("inf")), "give a duration of zero or more"),
    "a time in words": (
        lambda: validation.moment("last tuesday", now=0, what="since"),
        r"since 'last tuesday' is not a time: give an ISO 8601 date or time",
    ),
    "a time that is a list": (lambda: validation.moment([1], now=0, what="until"), "until '\\[1\\]' is not a time"),
    "an empty cursor": (lambda: validation.cursor(""), "cursor must be the next_cursor of the previous page"),
}


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_each_mistake_is_one_clear_error(mistake: str) -> None:
    check, message = MISTAKES[mistake]
    with pytest.raises(InvalidInputError, match=message) as caught:
        check()
    text = str(caught.value)
    assert "\n" not in text and "\x00" not in text
    text.encode("ascii", "backslashreplace").decode("ascii")  # no lone surrogate to trip an encoder
    text.encode("utf-8")


def test_an_invalid_input_is_still_a_configuration_error_for_code_that_caught_that() -> None:
    with pytest.raises(ConfigurationError):
        validation.input_text("")


def test_statuses_durations_and_times_are_read_in_every_form_a_caller_has_them() -> None:
    assert validation.statuses(None) == ()
    assert validation.statuses("error, Cancelled,ERROR") == (RunStatus.ERROR, RunStatus.CANCELLED)
    assert validation.statuses(RunStatus.PAUSED) == (RunStatus.PAUSED,)
    assert validation.statuses(["queued", RunStatus.RUNNING]) == (RunStatus.QUEUED, RunStatus.RUNNING)
    assert [validation.duration(v) for v in ("90s", "30m", "36h", "30d", "2w", "1.5d", "120", 0)] == [
        90,
        1800,
        36 * 3600,
        30 * 86400,
        14 * 86400,
        1.5 * 86400,
        120,
        0,
    ]
    assert validation.duration(timedelta(hours=2)) == 7200
    now = 1_800_000_000.0
    assert validation.moment("6h", now=now, what="since") == now - 6 * 3600
    assert validation.moment("1700000000", now=now, what="since") == 1_700_000_000
    assert validation.moment(1.5, now=now, what="since") == 1.5
    assert (
        validation.moment("2026-03-01T09:30:00+00:00", now=now, what="since")
        == datetime(2026, 3, 1, 9, 30, tzinfo=UTC).timestamp()
    )
    local = datetime(2026, 3, 1)  # no offset: local time, as datetime.timestamp() reads it
    assert validation.moment("2026-03-01", now=now, what="since") == validation.moment(local, now=now, what="s")
    assert validation.moment(None, now=now, what="since") is None


@pytest.mark.parametrize(
    "good",
    [
        lambda: validation.run_id("0b6f9c2e-1d4a-4a57-9f8e-2c7d1e3b5a69"),
        lambda: validation.run_id("order:42.retry_1-b"),
        lambda: validation.run_id("r" * 64),
        lambda: validation.session_id("sessión ✓ " + "s" * 118),
        lambda: validation.agent_name("équipe de recherche"),
        lambda: validation.input_text("héllo\tworld\n✓ \U0001f600"),
        lambda: validation.input_text("é" * (1 << 19)),
    ],
)
def test_what_is_valid_passes_unchanged(good: Callable[[], str]) -> None:
    assert good()
