"""Where `ratchet api` may listen: beyond this machine only with tokens."""

from __future__ import annotations

import pytest

from orchestrator.errors import ConfigurationError
from orchestrator.settings import Settings
from workers.api.serve import check_host


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1"])
def test_without_tokens_a_loopback_address_is_allowed(host: str) -> None:
    check_host(Settings(), host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "localhost", "api.example"])
def test_without_tokens_any_other_host_is_refused_saying_what_to_set(host: str) -> None:
    with pytest.raises(ConfigurationError, match="without authentication: set RATCHET_API_TOKENS"):
        check_host(Settings(), host)


def test_with_tokens_any_host_is_allowed() -> None:
    check_host(Settings.from_env({"RATCHET_API_TOKENS": "tok"}), "0.0.0.0")
