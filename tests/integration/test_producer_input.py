"""A producer's mistakes are refused at the door, on SQLite and on PostgreSQL: one InvalidInputError
that names the argument and the rule, never a driver's error, and nothing written."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from sqlalchemy import func, select

from orchestrator import Client, InvalidInputError, RunStatus
from orchestrator.settings import Settings
from orchestrator.store.tables import messages, runs
from tests.integration.producing import fail

AGENT = "door-agent"

#: (what the producer does, given a client and a run in ERROR, which takes new input) -> message
MISTAKES: dict[str, tuple[Callable[[Client, str], object], str]] = {
    "a NUL in the input": (lambda c, r: c.start(AGENT, input="a\x00b"), "NUL character at index 1"),
    "a lone surrogate in the input": (
        lambda c, r: c.start(AGENT, input="caf\udce9"),
        r"not valid UTF-8 text: a lone surrogate \(U\+DCE9\)",
    ),
    "an input over 1 MiB": (lambda c, r: c.start(AGENT, input="x" * (1 << 20) + "!"), "limit is 1048576 bytes"),
    "a run id longer than its column": (
        lambda c, r: c.start(AGENT, input="hi", run_id="r" * 65),
        r"\(65 characters\) is not a valid run id: use 1-64 characters of A-Z, a-z, 0-9",
    ),
    "a run id with a non-ASCII letter": (
        lambda c, r: c.start(AGENT, input="hi", run_id="rün-1"),
        "'rün-1' is not a valid run id",
    ),
    "a run id with a newline": (lambda c, r: c.start(AGENT, input="hi", run_id="run\n1"), "not a valid run id"),
    "a session id longer than its column": (
        lambda c, r: c.start(AGENT, input="hi", session_id="s" * 129),
        "session_id is 129 characters long; the limit is 128",
    ),
    "a session id with a NUL": (
        lambda c, r: c.start(AGENT, input="hi", session_id="s\x00"),
        r"control character \(U\+0000\)",
    ),
    "an agent name longer than its column": (
        lambda c, r: c.start("a" * 257, input="hi"),
        "agent is 257 characters long; the limit is 256",
    ),
    "an agent name with a lone surrogate": (lambda c, r: c.start("\udcff", input="hi"), "lone surrogate"),
    "continue with input=5": (lambda c, r: c.continue_run(r, input=5), "input must be a str .*, not int"),  # type: ignore[arg-type]
    "continue with an empty input": (lambda c, r: c.continue_run(r, input=""), "input is empty"),
    "continue with a NUL in the input": (lambda c, r: c.continue_run(r, input="\x00"), "NUL character"),
    "continue with a fork key that is not a str": (
        lambda c, r: c.continue_run(r, fork_key=7),  # type: ignore[arg-type]
        "fork_key must be a str, not int",
    ),
    "continue of a run id with a NUL": (lambda c, r: c.continue_run("r\x00"), "not a valid run id"),
    "cancel of a run id longer than its column": (lambda c, r: c.cancel("r" * 100), "not a valid run id"),
    "get_run of a run id with a NUL": (lambda c, r: c.get_run("r\x00"), "not a valid run id"),
    "get_run of a run id with a lone surrogate": (lambda c, r: c.get_run("r\udcff"), "not a valid run id"),
    "get_session of a session id with a NUL": (lambda c, r: c.get_session("s\x00"), "control character"),
    "get_session of a session id longer than its column": (
        lambda c, r: c.get_session("s" * 200),
        "session_id is 200 characters long",
    ),
    "wait on a run id with a newline": (lambda c, r: c.wait("r\n", timeout=1), "not a valid run id"),
}


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_a_producer_mistake_is_one_clear_error_and_writes_nothing(mistake: str, settings: Settings) -> None:
    client = Client(settings)
    run_id = client.start(AGENT, input="hello", session_id=f"s-{uuid.uuid4().hex[:8]}").run_id
    fail(client.store, run_id)
    before = counts(client)
    act, message = MISTAKES[mistake]

    with pytest.raises(InvalidInputError, match=message):
        act(client, run_id)

    assert counts(client) == before
    assert client.get_run(run_id).status == RunStatus.ERROR


def counts(client: Client) -> tuple[int, int]:
    """How many runs and messages the database holds."""
    with client.store.engine.connect() as conn:
        return (
            int(conn.execute(select(func.count()).select_from(runs)).scalar_one()),
            int(conn.execute(select(func.count()).select_from(messages)).scalar_one()),
        )
