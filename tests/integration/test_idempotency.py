"""One key, one request (`orchestrator.idempotency`), on SQLite and PostgreSQL: a start sent
again under a run id that exists returns the run only if it is the same request; any other
request under that id is RunConflictError saying what differs, and writes and publishes
nothing. The HTTP API's Idempotency-Key: tests/integration/test_api.py."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import update

from orchestrator import Client
from orchestrator.errors import RunConflictError
from orchestrator.settings import Settings
from orchestrator.store.tables import runs
from tests.support import RecordingDispatcher


def keyed() -> tuple[str, str]:
    return f"order-{uuid.uuid4().hex[:8]}", f"s-{uuid.uuid4().hex[:8]}"


def test_the_same_request_again_is_the_same_start_and_publishes_nothing(settings: Settings) -> None:
    broker = RecordingDispatcher()
    client = Client(settings, dispatcher=broker)
    run_id, session_id = keyed()
    request: dict[str, Any] = dict(
        input="hello", session_id=session_id, user_id="ada", stream=True, priority=4,
        session_state={"cart": {"items": 2, "total": 5}, "seen": True},
    )  # fmt: skip
    client.start("shop", run_id=run_id, **request)

    # The state's keys in another order are the same state; the session may be left out (the
    # user may not: no user_id is a user too, see the conflicts below)
    again = {**request, "session_state": {"seen": True, "cart": {"total": 5, "items": 2}}}
    assert client.start("shop", run_id=run_id, **again).run_id == run_id
    unnamed = {k: v for k, v in request.items() if k != "session_id"}
    assert client.start("shop", run_id=run_id, **unnamed).run_id == run_id
    assert [s.run_id for s in broker.steps] == [run_id]


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"input": "goodbye"}, "started with another input; a start with this input is another request"),
        ({"priority": 5}, "started with priority=4; a start with priority=5"),
        ({"priority": None}, "started with priority=4; a start with priority=None"),
        ({"stream": False}, "started with stream=True; a start with stream=False"),
        ({"session_state": {"cart": 1}}, "started with another session_state"),
        ({"session_state": None}, "started with another session_state"),
        # Another user's run, no user included, is named by nothing but its id
        ({"user_id": "bob", "session_id": None}, "is taken by another run; this run needs a run_id of its own"),
        ({"user_id": None, "session_id": None}, "is taken by another run; this run needs a run_id of its own"),
        ({"session_id": "s-other"}, "in session 's-other' needs a run_id of its own"),
    ],
)
def test_another_request_under_a_taken_run_id_is_a_conflict_that_writes_and_publishes_nothing(
    settings: Settings, change: dict[str, Any], says: str
) -> None:
    broker = RecordingDispatcher()
    client = Client(settings, dispatcher=broker)
    run_id, session_id = keyed()
    request: dict[str, Any] = dict(
        input="hello", session_id=session_id, user_id="ada", stream=True, priority=4, session_state={"cart": 2}
    )
    client.start("shop", run_id=run_id, **request)

    with pytest.raises(RunConflictError, match=f"run_id '{run_id}' .*{says}"):
        client.start("shop", run_id=run_id, **{**request, **change})

    run = client.get_run(run_id)
    assert (run.priority, run.session_state, [m.content for m in run.messages]) == (4, {"cart": 2}, ["hello"])
    assert client.get_session("s-other") is None
    assert [s.run_id for s in broker.steps] == [run_id]


def test_a_run_written_without_a_digest_is_compared_by_its_input(settings: Settings) -> None:
    # Given a run as written before migration 0012: no digest of its request
    client = Client(settings)
    run_id, session_id = keyed()
    client.start("shop", input="hello", session_id=session_id, run_id=run_id, session_state={"cart": 2})
    with client.store.engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.run_id == run_id).values(request_digest=None))

    # Its input still tells another request; its state, not stored as given, cannot
    with pytest.raises(RunConflictError, match="started with another input"):
        client.start("shop", input="goodbye", run_id=run_id)
    assert client.start("shop", input="hello", run_id=run_id, session_state={"cart": 2}).run_id == run_id
