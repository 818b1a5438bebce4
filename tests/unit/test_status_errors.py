"""An HTTP error status becomes one `ModelCallError` whatever the provider (`status_error`, which the
OpenAI, Claude and Gemini adapters all use): retryable or final by status, final when the
conversation does not fit, and a refused key naming the variables to check."""

from __future__ import annotations

import pytest

from orchestrator.models import OpenAIChat
from orchestrator.models.failures import kind_for_status, status_error

MODEL = OpenAIChat("gpt-test", api_key="sk-test", base_url="http://127.0.0.1:9/v1")


@pytest.mark.parametrize(
    ("status", "retryable"),
    [
        (408, True),
        (409, True),
        (429, True),
        (500, True),
        (503, True),
        (529, True),
        (400, False),
        (404, False),
        (422, False),
    ],
)
def test_a_status_is_retryable_when_a_retry_may_succeed_and_final_otherwise(status: int, retryable: bool) -> None:
    error = status_error(MODEL, kind_for_status(status), status, "no", retry_after=2.5, key_vars=("OPENAI_API_KEY",))

    assert (error.retryable, error.status_code, error.retry_after) == (retryable, status, 2.5)
    assert str(error) == f"{MODEL.describe()}: {kind_for_status(status)} (HTTP {status}): no"


def test_a_conversation_that_does_not_fit_is_final_whatever_its_status() -> None:
    error = status_error(MODEL, "RateLimitError", 429, "too long", retry_after=None, key_vars=("K",), overflow=True)

    assert (error.retryable, error.context_overflow) == (False, True)


@pytest.mark.parametrize(("status", "bad_key"), [(401, False), (403, False), (400, True)])
def test_a_refused_key_says_which_variables_to_check(status: int, bad_key: bool) -> None:
    error = status_error(
        MODEL, "AuthenticationError", status, "no", retry_after=None, key_vars=("A_KEY", "B_KEY"), bad_key=bad_key
    )

    assert "(check A_KEY or B_KEY in the environment of the workers)" in str(error)
    assert error.retryable is False


def test_the_providers_own_name_of_a_status_follows_its_number() -> None:
    error = status_error(
        MODEL, "RateLimitError", 429, "slow down", retry_after=None, key_vars=("K",), status_name="RESOURCE_EXHAUSTED"
    )

    assert "(HTTP 429 RESOURCE_EXHAUSTED): slow down" in str(error)
