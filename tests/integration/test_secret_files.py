"""Secrets from files: RATCHET_<NAME>_FILE for each setting that may hold a credential, and
OPENAI_API_KEY_FILE for the provider's key, read where and when the variable itself is read.

A file's trailing line break is dropped (an editor's, or `echo`'s); both the variable and its
_FILE set, a file that cannot be read, or an empty one, is an error that names the variable and
the file and never the value."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.errors import ConfigurationError, ModelCallError
from orchestrator.messages import Message
from orchestrator.models.base import CallContext
from orchestrator.models.openai_chat import OpenAIChat
from orchestrator.settings import SECRET_SETTINGS, Settings
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.server import ScriptedServer

GOOD_KEY = "sk-from-a-file-0123456789abcdef"
BAD_KEY = "sk-refused-0123456789abcdef"
URL = "postgresql://ratchet:s3cret-pw@db.internal:5432/ratchet"


def secret(tmp_path: Path, value: str, name: str = "secret") -> str:
    path = tmp_path / name
    path.write_text(value)
    return str(path)


# Ratchet's settings


@pytest.mark.parametrize(
    ("name", "value", "read"),
    [
        ("DATABASE_URL", URL, lambda s: s.database_url),
        ("BROKER_URL", "redis://:s3cret-pw@redis.internal:6379/0", lambda s: s.broker_url),
        ("REDIS_URL", "redis://:s3cret-pw@events.internal:6379/1", lambda s: s.redis_url),
        ("LIMITER_URL", "redis://:s3cret-pw@limits.internal:6379/2", lambda s: s.limiter_url),
        ("API_TOKENS", "tok-a, tok-b", lambda s: s.api_token_values),
        ("WEBHOOK_SECRET", "whsec-0123456789", lambda s: s.webhook_secret.get_secret_value()),
    ],
)
def test_each_setting_that_may_hold_a_credential_is_read_from_its_file(
    tmp_path: Path, name: str, value: str, read: object
) -> None:
    from_file = Settings.from_env({f"RATCHET_{name}_FILE": secret(tmp_path, value + "\n")})
    from_env = Settings.from_env({f"RATCHET_{name}": value})
    assert read(from_file) == read(from_env) and read(from_file) not in (None, ())  # type: ignore[operator]


def test_the_settings_read_from_files_are_those_that_may_hold_a_credential() -> None:
    assert set(SECRET_SETTINGS) == {
        "database_url", "broker_url", "redis_url", "limiter_url", "api_tokens", "jwt_key", "webhook_secret",
    }  # fmt: skip
    with pytest.raises(ConfigurationError, match="unknown setting RATCHET_APP_FILE;.*read from a file: .*"):
        Settings.from_env({"RATCHET_APP_FILE": "agents.txt"})


def test_only_the_last_line_break_of_a_file_goes_and_a_windows_one_too(tmp_path: Path) -> None:
    s = Settings.from_env({"RATCHET_API_TOKENS_FILE": secret(tmp_path, "tok-a,tok-b\r\n")})
    assert s.api_token_values == ("tok-a", "tok-b")
    assert Settings.from_env({"RATCHET_DATABASE_URL_FILE": secret(tmp_path, URL)}).database_url == URL


def test_a_tokens_file_holds_one_token_a_line_or_several_separated_by_commas(tmp_path: Path) -> None:
    # One a line, as a secret manager writes them; read as one token 'tok-a\ntok-b', every request
    # was refused while the API said it had a token.
    s = Settings.from_env({"RATCHET_API_TOKENS_FILE": secret(tmp_path, "tok-a\n  tok-b \r\n\ntok-c, tok-d\n")})
    assert s.api_token_values == ("tok-a", "tok-b", "tok-c", "tok-d")
    assert Settings.from_env({"RATCHET_API_TOKENS": "tok-a\ntok-b"}).api_token_values == ("tok-a", "tok-b")


@pytest.mark.parametrize("value", ["tok-a tok-b", "tok-a,tok\tb", "tok-a\x00b"])
def test_a_token_with_whitespace_inside_is_refused_without_showing_it(tmp_path: Path, value: str) -> None:
    for env in ({"RATCHET_API_TOKENS": value}, {"RATCHET_API_TOKENS_FILE": secret(tmp_path, value)}):
        with pytest.raises(ConfigurationError) as caught:
            Settings.from_env(env)
        said = str(caught.value)
        assert "RATCHET_API_TOKENS (or RATCHET_API_TOKENS_FILE): a token holds whitespace" in said
        assert "tok-a" not in said


def test_a_value_and_its_file_both_set_is_refused_without_either_value(tmp_path: Path) -> None:
    path = secret(tmp_path, URL)
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_env({"RATCHET_DATABASE_URL": "sqlite:///other.db", "RATCHET_DATABASE_URL_FILE": path})
    said = str(caught.value)
    assert "RATCHET_DATABASE_URL and RATCHET_DATABASE_URL_FILE are both set: set one of them" in said
    assert "s3cret" not in said and "other.db" not in said


def test_a_file_that_cannot_be_read_or_is_empty_is_refused_naming_the_variable_and_the_file(tmp_path: Path) -> None:
    cases = {
        str(tmp_path / "missing"): "cannot read .*missing'.*No such file or directory",
        str(tmp_path): "cannot read .*Is a directory",
        secret(tmp_path, "\n", "empty"): "empty'? is empty: write the value of RATCHET_BROKER_URL in it",
    }
    (tmp_path / "latin1").write_bytes("redis://:mot-de-passe-\xe9@r/0".encode("latin-1"))
    cases[str(tmp_path / "latin1")] = "latin1' is not UTF-8 text"
    for path, why in cases.items():
        with pytest.raises(ConfigurationError, match=f"^RATCHET_BROKER_URL_FILE: .*{why}"):
            Settings.from_env({"RATCHET_BROKER_URL_FILE": path})


# The provider's key, read at each call


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ScriptedServer]:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY_FILE", raising=False)
    with ScriptedServer() as running:
        running.configure(ScriptConfig(reject_keys=[BAD_KEY]))
        yield running


def ask(model: OpenAIChat) -> object:
    return model.invoke([Message(role="user", content="find cats")], [], context=CallContext(run_id="r", seq=1))


def failure(model: OpenAIChat) -> ModelCallError:
    with pytest.raises(ModelCallError) as caught:
        ask(model)
    assert not caught.value.retryable
    return caught.value


def test_the_key_comes_from_OPENAI_API_KEY_FILE_read_again_at_each_call(
    server: ScriptedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = OpenAIChat("gpt-test", base_url=server.url)
    key_file = tmp_path / "openai_api_key"
    key_file.write_text(GOOD_KEY + "\n")
    monkeypatch.setenv("OPENAI_API_KEY_FILE", str(key_file))
    assert ask(model)
    # The secret rotated (to a key the provider refuses): the next call reads the file again
    key_file.write_text(BAD_KEY)
    assert failure(model).kind == "AuthenticationError"
    assert [r["status"] for r in server.requests] == [200, 401]


def test_the_key_and_its_file_both_set_or_an_unreadable_file_fail_the_call_saying_why(
    server: ScriptedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = OpenAIChat("gpt-test", base_url=server.url)
    monkeypatch.setenv("OPENAI_API_KEY", GOOD_KEY)
    monkeypatch.setenv("OPENAI_API_KEY_FILE", secret(tmp_path, BAD_KEY))
    both = str(failure(model))
    assert "OPENAI_API_KEY and OPENAI_API_KEY_FILE are both set" in both
    assert GOOD_KEY not in both and BAD_KEY not in both
    monkeypatch.delenv("OPENAI_API_KEY")
    monkeypatch.setenv("OPENAI_API_KEY_FILE", str(tmp_path / "gone"))
    assert "OPENAI_API_KEY_FILE: cannot read" in str(failure(model))
    assert server.requests == []  # nothing was sent with either
