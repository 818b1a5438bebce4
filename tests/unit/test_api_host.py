"""Where `ratchet api` may listen (beyond this machine only with tokens), and which Host and Origin
headers name this machine and the request's own origin (`workers/api/loopback.py`)."""

from __future__ import annotations

import pytest

from orchestrator.errors import ConfigurationError
from orchestrator.settings import Settings
from workers.api.loopback import loopback_host, same_origin
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
    # so with JWTs only: every request needs a token then too
    check_host(Settings.from_env({"RATCHET_JWT_JWKS_URL": "https://id.example/jwks"}), "0.0.0.0")


@pytest.mark.parametrize(
    "host",
    ["localhost", "localhost:8000", "LocalHost.", "ui.localhost:3", "127.0.0.1", "127.9.9.9:80", "[::1]", "[::1]:8000",
     "[::ffff:127.0.0.1]:8000"],
)  # fmt: skip
def test_a_host_naming_this_machine_is_loopback(host: str) -> None:
    assert loopback_host(host)


@pytest.mark.parametrize(
    "host",
    ["", "evil.example", "localhost.evil.example:8000", "127.0.0.1.nip.io", "10.0.0.1:8000", "[::2]", "[::1",
     "[::1]x", "localhost:http", "0.0.0.0", "127.1"],
)  # fmt: skip
def test_any_other_host_is_not(host: str) -> None:
    assert not loopback_host(host)


@pytest.mark.parametrize(
    ("origin", "scheme", "host", "same"),
    [
        ("http://127.0.0.1:8000", "http", "127.0.0.1:8000", True),
        ("http://LOCALHOST", "http", "localhost:80", True),
        ("http://[::1]:8000", "http", "[::1]:8000", True),
        ("http://localhost:8000", "http", "127.0.0.1:8000", False),
        ("https://127.0.0.1:8000", "http", "127.0.0.1:8000", False),
        ("http://127.0.0.1:8001", "http", "127.0.0.1:8000", False),
        ("http://127.0.0.1:8000/ui", "http", "127.0.0.1:8000", False),
        ("null", "http", "127.0.0.1:8000", False),
        ("http://127.0.0.1:99999", "http", "127.0.0.1:8000", False),
    ],
)
def test_an_origin_is_the_requests_own_only_if_scheme_host_and_port_all_match(
    origin: str, scheme: str, host: str, same: bool
) -> None:
    assert same_origin(origin, scheme, host) is same
