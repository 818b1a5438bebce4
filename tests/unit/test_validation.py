"""The checks at the door: each mistake a producer can make gets one InvalidInputError that names
the argument and the rule, and never carries a character a terminal or an encoder chokes on."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from orchestrator import validation
from orchestrator.errors import ConfigurationError, InvalidInputError

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
