"""Settings: one typed object from RATCHET_* variables."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import ConfigurationError
from orchestrator.settings import Settings
from workers.celery.app import celery_config


def test_with_nothing_set_ratchet_runs_embedded() -> None:
    s = Settings.from_env({})
    assert s.database_url.startswith("sqlite:///") and s.is_embedded_broker


def test_variables_map_to_fields_and_are_typed() -> None:
    s = Settings.from_env({"RATCHET_LEASE_SECONDS": "600.5", "RATCHET_MAX_STEP_ATTEMPTS": "7", "OTHER": "x"})
    assert s.lease_seconds == 600.5 and s.max_step_attempts == 7


def test_a_misspelt_variable_is_an_error_that_lists_the_known_ones() -> None:
    with pytest.raises(ConfigurationError, match="unknown setting RATCHET_LEASE_SECOND;.*RATCHET_LEASE_SECONDS"):
        Settings.from_env({"RATCHET_LEASE_SECOND": "5"})


def test_limits_must_nest_soft_under_hard_under_visibility() -> None:
    with pytest.raises(
        ConfigurationError, match="RATCHET_SOFT_TIME_LIMIT .* must be less than RATCHET_HARD_TIME_LIMIT"
    ):
        Settings.from_env({"RATCHET_SOFT_TIME_LIMIT": "600"})
    with pytest.raises(ConfigurationError, match="RATCHET_HARD_TIME_LIMIT .* must be less than RATCHET_VISIBILITY"):
        Settings.from_env({"RATCHET_VISIBILITY_TIMEOUT": "500"})


def test_the_lease_no_longer_has_to_outlast_the_time_limits_but_must_outlast_a_few_heartbeats() -> None:
    # The heartbeat keeps a long step's claim, so the lease is short by default.
    s = Settings.from_env({})
    assert s.lease_seconds < s.soft_time_limit and s.lease_seconds >= 3 * s.heartbeat_seconds
    assert Settings.from_env({"RATCHET_LEASE_SECONDS": "6", "RATCHET_HEARTBEAT_SECONDS": "2"}).lease_seconds == 6
    with pytest.raises(ConfigurationError, match=r"RATCHET_LEASE_SECONDS \(5.0\) must be at least 3 times"):
        Settings.from_env({"RATCHET_LEASE_SECONDS": "5", "RATCHET_HEARTBEAT_SECONDS": "2"})
    with pytest.raises(ConfigurationError, match="RATCHET_HEARTBEAT_SECONDS must be positive"):
        Settings.from_env({"RATCHET_HEARTBEAT_SECONDS": "0"})


def test_the_default_lease_heartbeat_and_sweep_recover_a_dead_workers_run_well_within_30_s() -> None:
    s = Settings.from_env({})
    assert s.lease_seconds + s.sweep_seconds <= 20


def test_sqlite_synchronous_defaults_to_full_and_takes_the_three_safe_levels_only() -> None:
    assert Settings.from_env({}).sqlite_synchronous == "FULL"
    assert Settings.from_env({"RATCHET_SQLITE_SYNCHRONOUS": "normal"}).sqlite_synchronous == "NORMAL"
    assert Settings.from_env({"RATCHET_SQLITE_SYNCHRONOUS": "EXTRA"}).sqlite_synchronous == "EXTRA"
    with pytest.raises(ConfigurationError, match="(?s)sqlite_synchronous.*'FULL', 'NORMAL' or 'EXTRA'"):
        Settings.from_env({"RATCHET_SQLITE_SYNCHRONOUS": "OFF"})


def test_a_countdown_may_not_outlive_the_visibility_timeout() -> None:
    with pytest.raises(ConfigurationError, match="RATCHET_MAX_COUNTDOWN .* must not exceed RATCHET_VISIBILITY"):
        Settings.from_env({"RATCHET_MAX_COUNTDOWN": "7200"})


def test_api_tokens_are_a_comma_separated_secret_never_shown() -> None:
    settings = Settings.from_env({"RATCHET_API_TOKENS": " tok-a , tok-b,, "})
    assert settings.api_token_values == ("tok-a", "tok-b")
    assert "tok-a" not in repr(settings) and "tok-a" not in str(settings.model_dump())
    assert Settings().api_token_values == ()
    assert Settings.from_env({"RATCHET_API_TOKENS": " , "}).api_token_values == ()


def test_the_api_body_limit_must_be_positive() -> None:
    with pytest.raises(ConfigurationError, match="RATCHET_API_MAX_BODY_BYTES"):
        Settings.from_env({"RATCHET_API_MAX_BODY_BYTES": "0"})


def test_a_streamed_runs_deltas_must_be_kept_a_while_and_some_of_them() -> None:
    # A TTL of 0 would have the table sink delete live runs' deltas at every step start.
    for bad in ({"RATCHET_STREAM_TTL": "0"}, {"RATCHET_STREAM_MAXLEN": "0"}):
        with pytest.raises(ConfigurationError, match="RATCHET_STREAM_TTL and RATCHET_STREAM_MAXLEN must be positive"):
            Settings.from_env(bad)


def test_workers_send_task_events_unless_told_not_to() -> None:
    # On for Flower by default; off, a monitor turns them on in each worker (test_native_workers)
    assert celery_config(Settings.from_env({}))["worker_send_task_events"] is True
    assert celery_config(Settings.from_env({"RATCHET_TASK_EVENTS": "false"}))["worker_send_task_events"] is False


def test_the_settings_as_printed_hide_every_url_password_and_the_api_tokens() -> None:
    """repr() and str() reach logs and tracebacks: no credential may be in them."""
    settings = Settings(
        database_url="postgresql://ratchet:db-pw-1@db:5432/ratchet",
        broker_url="redis://:broker-pw-2@redis:6379/0",
        limiter_url="rediss://user:lim-pw-3@limiter:6380/1",
        api_tokens="tok-4",
    )
    for text in (repr(settings), str(settings)):
        for secret in ("db-pw-1", "broker-pw-2", "lim-pw-3", "tok-4"):
            assert secret not in text
        assert "postgresql://ratchet:***@db:5432/ratchet" in text
        assert "redis://:***@redis:6379/0" in text and "rediss://user:***@limiter:6380/1" in text
    assert settings.database_url == "postgresql://ratchet:db-pw-1@db:5432/ratchet", "the value itself is kept"
    assert "sqlite:///" in repr(Settings()), "a URL without a password is shown as it is"
    in_query = Settings(database_url="postgresql+psycopg://app@db/ratchet?password=hunter2&sslmode=require")
    assert "hunter2" not in repr(in_query) and "password=***&sslmode=***" in str(in_query)


PEM = "-----BEGIN PUBLIC KEY-----\nMFkw...\n-----END PUBLIC KEY-----"
SECRET = "s" * 32


def test_a_jwt_key_picks_its_algorithm_is_a_secret_and_is_read_from_a_file(tmp_path: Path) -> None:
    assert Settings(jwt_key=PEM).jwt_algorithm_values == ("RS256",)
    assert Settings(jwt_key=SECRET).jwt_algorithm_values == ("HS256",)
    assert Settings(jwt_jwks_url="https://id.example/jwks").jwt_algorithm_values == ("RS256",)
    assert Settings(jwt_key=PEM, jwt_algorithms="ES256, EdDSA").jwt_algorithm_values == ("ES256", "EdDSA")
    assert Settings(jwt_key=SECRET).api_auth and not Settings().api_auth and Settings().jwt_algorithm_values == ()
    key_file = tmp_path / "key.pem"
    key_file.write_text(PEM + "\n")
    read = Settings.from_env({"RATCHET_JWT_KEY_FILE": str(key_file)})
    assert read.jwt_key is not None and read.jwt_key.get_secret_value() == PEM
    assert SECRET not in repr(Settings(jwt_key=SECRET)) and SECRET not in str(Settings(jwt_key=SECRET))


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"jwt_key": PEM, "jwt_jwks_url": "https://id.example/jwks"}, "both set"),
        ({"jwt_key": PEM, "jwt_algorithms": "HS256"}, "HMAC"),
        ({"jwt_jwks_url": "https://id.example/jwks", "jwt_algorithms": "HS256"}, "HMAC"),
        ({"jwt_key": SECRET, "jwt_algorithms": "RS256"}, "not a PEM public key"),
        ({"jwt_key": "short"}, "32 bytes or more"),
        ({"jwt_key": PEM, "jwt_algorithms": "none"}, "RATCHET_JWT_ALGORITHMS: none"),
        ({"jwt_audience": "api"}, "need RATCHET_JWT_KEY or RATCHET_JWT_JWKS_URL"),
        ({"jwt_jwks_url": "file:///etc/keys"}, "https:// URL"),
    ],
)
def test_a_jwt_setting_that_could_not_verify_or_would_verify_too_much_is_refused(
    values: dict[str, str], says: str
) -> None:
    with pytest.raises(ConfigurationError, match=says) as refused:
        Settings(**values)  # type: ignore[arg-type]
    assert SECRET not in str(refused.value) and "short" not in str(refused.value).replace("32 bytes", "")
