"""The API key: read for a call and checked, which keys a header cannot carry, and redaction of every
form a key is echoed in."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import quote, quote_plus

import pytest

from orchestrator.errors import ModelCallError
from orchestrator.models import OpenAIChat
from orchestrator.models._keys import call_key, key_problem, redact

KEY = "sk-proj-Ab3dEf6hIj9kLm2nOp5q/r+s=t"


@pytest.mark.parametrize(
    "form",
    [
        KEY,
        KEY.removeprefix("sk-"),
        KEY.removeprefix("sk-proj-"),
        KEY.upper(),
        KEY.lower(),
        KEY.removeprefix("sk-proj-").upper(),
        quote(KEY),
        quote(KEY, safe=""),
        quote_plus(KEY),
        quote_plus(KEY).lower(),
        quote(KEY.removeprefix("sk-proj-"), safe=""),
        KEY.replace("/", "\\/"),
        KEY.removeprefix("sk-proj-").replace("/", "\\/"),
    ],
    ids=[
        "as-is", "without-sk", "without-sk-proj", "upper", "lower", "bare-upper", "quote", "quote-safe-none",
        "quote-plus", "quote-plus-lower", "bare-quoted", "json-escaped", "bare-json-escaped",
    ],
)  # fmt: skip
def test_every_form_a_key_is_echoed_in_is_masked(form: str) -> None:
    text = f"Incorrect API key provided: {form}. Check it."
    out = redact(text, KEY)
    assert out == "Incorrect API key provided: ***. Check it."


GATEWAY = "gw-Q7rT2vX9zB4nM6kP/8dF=wY3hJ5c"


@pytest.mark.parametrize("key", [KEY, GATEWAY], ids=["openai-key", "gateway-token"])
@pytest.mark.parametrize(
    "form",
    [
        lambda k: k[-10:],
        lambda k: k[-10:].upper(),
        lambda k: quote(k[-10:], safe=""),
        lambda k: f"{k[:6]}{'*' * 30}{k[-4:]}",
        lambda k: f"{k[:3]}***{k[-4:]}".lower(),
        lambda k: f"{k[:8]}****",
        lambda k: f"****{k[-6:]}",
        lambda k: f"{k[:3]}...{k[-10:]}",
    ],
    ids=["last-ten", "last-ten-upper", "last-ten-quoted", "masked", "masked-lower", "head-masked", "tail-masked",
         "elided"],
)  # fmt: skip
def test_the_forms_a_provider_quotes_a_refused_key_in_are_masked_with_or_without_sk(
    key: str, form: Callable[[str], str]
) -> None:
    text = f"Incorrect API key provided: ({form(key)}). Check it."
    out = redact(text, key)
    assert out.startswith("Incorrect API key provided: (") and out.endswith("). Check it.")
    assert key[-4:].lower() not in out.lower() and key[3:8].lower() not in out.lower(), out


def test_a_gateway_token_is_masked_without_its_prefix_as_an_openai_key_is() -> None:
    assert redact("got Q7rT2vX9zB4nM6kP/8dF=wY3hJ5c", GATEWAY) == "got ***"
    assert redact("got gsk_0123456789abcdef", "gsk_0123456789abcdef") == "got ***"
    assert redact("got 0123456789abcdef", "gsk_0123456789abcdef") == "got ***"


def test_asterisks_that_mask_no_part_of_the_key_are_left_as_they_are() -> None:
    text = "a ***bold*** word, a rating of ***, p***s, and 3*** 4"
    assert redact(text, GATEWAY) == text
    assert redact(text, KEY) == text


def test_an_openai_style_echo_is_masked_even_without_the_secret_and_with_url_characters() -> None:
    assert redact("provided: sk-abc***Op5q/r+s=t here") == "provided: sk-*** here"
    assert redact("provided: sk-proj-Ab%2Fc***xyz") == "provided: sk-***"


def test_a_long_text_with_asterisks_costs_no_more_than_its_asterisks() -> None:
    # Read only as far from each run of asterisks as the key is long: no quadratic scan.
    text = ("x" * 50_000 + "***") * 20 + f" {GATEWAY[:6]}***{GATEWAY[-4:]}"
    assert redact(text, GATEWAY).endswith(" ***")


def test_a_key_that_is_not_ascii_is_masked_in_its_url_encoded_forms_too() -> None:
    key = "sk-caf\u00e9-0123456789"
    for form in (key, quote(key), quote_plus(key).lower(), key.upper(), quote(key.removeprefix("sk-caf\u00e9-"))):
        assert redact(f"[{form}]", key) == "[***]", form


def test_a_gateway_token_quoted_in_a_json_string_is_masked_whole() -> None:
    body = '{"error": {"message": "invalid token ' + GATEWAY.replace("/", "\\/") + '"}}'
    assert redact(body, GATEWAY) == '{"error": {"message": "invalid token ***"}}'
    assert redact('{"m": "' + KEY.replace("/", "\\/") + '"}') == '{"m": "sk-***"}'


def test_any_sk_token_is_masked_even_without_the_secret() -> None:
    assert redact("key sk-abc123***wxyz rejected") == "key sk-*** rejected"


def test_short_parts_of_a_key_are_not_masked_on_their_own() -> None:
    # A prefix-less part this short would match ordinary words; the whole key still goes.
    assert redact("a test of sk-test-1", "sk-test-1") == "a test of ***"
    assert redact("test-1 passed", "sk-test-1") == "test-1 passed"


def test_text_without_the_key_is_unchanged() -> None:
    assert redact("HTTP 500: overloaded", KEY) == "HTTP 500: overloaded"


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("sk-caf\u00e9", "not ASCII"),
        ("sk-abc\n", "line break"),
        ("sk-a bc", "whitespace"),
        ("sk-a\tbc", "whitespace"),
        ("sk-a\x00bc", "control character"),
    ],
)
def test_a_key_a_header_cannot_carry_is_named_by_its_problem_never_by_its_characters(key: str, problem: str) -> None:
    said = key_problem(key)
    assert said is not None and problem in said and key not in said


def test_a_printable_ascii_key_has_no_problem() -> None:
    assert key_problem(KEY) is None


MODEL = OpenAIChat("gpt-test", api_key="unused")
VARIABLES = ("RATCHET_TEST_KEY_A", "RATCHET_TEST_KEY_B")


def refused(passed: str | None = None) -> ModelCallError:
    with pytest.raises(ModelCallError) as caught:
        call_key(MODEL, passed, VARIABLES)
    assert (caught.value.retryable, caught.value.kind) == (False, "AuthenticationError")
    assert str(caught.value).startswith(f"{MODEL.describe()}: ")
    return caught.value


def test_a_call_s_key_is_the_one_passed_else_the_first_variable_set_read_at_each_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for variable in VARIABLES:
        monkeypatch.delenv(variable, raising=False)
        monkeypatch.delenv(f"{variable}_FILE", raising=False)
    monkeypatch.setenv("RATCHET_TEST_KEY_B", "key-b")
    assert call_key(MODEL, None, VARIABLES) == "key-b"
    monkeypatch.setenv("RATCHET_TEST_KEY_A", "key-a")
    assert call_key(MODEL, None, VARIABLES) == "key-a"
    # The first one set wins, and the others are not read: a broken later one does not matter.
    monkeypatch.setenv("RATCHET_TEST_KEY_B_FILE", "/nonexistent/key")
    assert call_key(MODEL, None, VARIABLES) == "key-a"
    assert call_key(MODEL, "passed", VARIABLES) == "passed"


def test_no_key_says_every_variable_and_the_file_it_may_be_given_as(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in VARIABLES:
        monkeypatch.delenv(variable, raising=False)
        monkeypatch.delenv(f"{variable}_FILE", raising=False)

    said = str(refused())

    assert "set RATCHET_TEST_KEY_A (or RATCHET_TEST_KEY_B; or RATCHET_TEST_KEY_A_FILE, a file holding it)" in said
    assert "workers" in said and "no restart" in said


def test_a_key_no_header_can_carry_says_where_it_came_from_and_never_quotes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RATCHET_TEST_KEY_A", raising=False)
    monkeypatch.delenv("RATCHET_TEST_KEY_A_FILE", raising=False)
    monkeypatch.setenv("RATCHET_TEST_KEY_B", "key-0123456789\n")

    from_env = str(refused())
    passed = str(refused("key-caf\u00e9-0123456789"))

    assert "the API key in RATCHET_TEST_KEY_B has" in from_env and "set RATCHET_TEST_KEY_B again" in from_env
    assert "the API key passed as api_key= has" in passed and "not ASCII" in passed
    assert "0123456789" not in from_env + passed


def test_a_key_file_that_cannot_be_read_fails_the_call_saying_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RATCHET_TEST_KEY_A", raising=False)
    monkeypatch.setenv("RATCHET_TEST_KEY_A_FILE", "/nonexistent/key")

    assert "RATCHET_TEST_KEY_A_FILE" in str(refused())
