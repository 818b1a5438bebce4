"""PostgreSQL: Ratchet's transactions run READ COMMITTED whatever the database's default, because
the fan-in must see, after it waited for the team's lock, what the member that held it committed.

Each test gets a database of its own whose `default_transaction_isolation` is stricter."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text

from orchestrator import Agent, RunStatus, Team
from orchestrator.delegation import decide
from orchestrator.messages import Message
from orchestrator.models import OpenAIChat
from orchestrator.store import Store, forget_stores
from tests.isolation import PgDatabases
from tests.support import new_run, waiting_team

pytestmark = pytest.mark.postgres
S = RunStatus


@pytest.fixture(params=["repeatable read", "serializable"])
def strict_db(request: pytest.FixtureRequest, pg_databases: PgDatabases) -> Iterator[str]:
    """A database of this test's own whose sessions default to a stricter isolation level."""
    url, drop = pg_databases.create()
    name = url.rsplit("/", 1)[1]
    with pg_databases.admin.connect() as conn:
        conn.execute(text(f"ALTER DATABASE \"{name}\" SET default_transaction_isolation = '{request.param}'"))
    yield url
    forget_stores()
    drop()


def test_every_transaction_of_the_store_runs_read_committed(strict_db: str) -> None:
    store = Store.open(strict_db)
    with store.engine.connect() as conn:
        default = conn.exec_driver_sql("SHOW default_transaction_isolation").scalar()
    assert default in ("repeatable read", "serializable")

    # Single statements (a new run, the claim, the step's commit) and transactions alike
    run_id = new_run(store)
    claim = store.claim(run_id, 0, "model", owner="w", lease_seconds=30, max_attempts=5)
    assert claim is not None
    store.commit_step(claim, [Message(role="assistant", content="hi")], status=S.COMPLETED, next_step=None,
                      publish_grace=30, content="hi")  # fmt: skip
    for engine in (store.engine, store.quick_engine):
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW transaction_isolation").scalar() == "read committed"
    with store.engine.begin() as conn:
        assert conn.exec_driver_sql("SHOW transaction_isolation").scalar() == "read committed"
    # ...and what they wrote was committed
    fresh = create_engine(strict_db)
    with fresh.connect() as conn:
        row = conn.execute(text("select status, n_messages from ratchet_runs where run_id = :r"), {"r": run_id}).one()
    fresh.dispose()
    assert tuple(row) == ("COMPLETED", 2)


def test_two_members_finishing_at_the_same_time_fan_in_their_team_once(strict_db: str) -> None:
    # Given a team waiting on two running members
    store = Store.open(strict_db)
    t = uuid.uuid4().hex[:6]
    a, b = Agent(name=f"a-{t}", model=OpenAIChat(id="a")), Agent(name=f"b-{t}", model=OpenAIChat(id="b"))
    team = Team(name=f"team-{t}", model=OpenAIChat(id="leader"), members=[a, b])
    team_id = waiting_team(store, team, [a, b])
    claims = {
        c.agent_name: store.claim(c.run_id, c.seq, "model", owner=f"w-{c.agent_name}", lease_seconds=30, max_attempts=5)
        for c in store.children(team_id)
    }

    def finish(name: str, conn: object) -> None:
        claim = claims[name]
        assert claim is not None
        store.commit_step(
            claim, [Message(role="assistant", content=f"answer of {name}")], status=S.COMPLETED, next_step=None,
            publish_grace=30, content=f"answer of {name}", conn=conn,  # type: ignore[arg-type]
        )  # fmt: skip

    # When both commit their final answer at once: a's fan-in sees b still running; b's transaction
    # has begun before a commits, and its fan-in runs after (as it would, waiting on a's team lock)
    with store.engine.connect() as conn_a, store.engine.connect() as conn_b:
        tx_a = conn_a.begin()
        finish(a.name, conn_a)
        assert store.teams.fan_in_within(conn_a, team_id, decide, publish_grace=30) is None
        tx_b = conn_b.begin()
        finish(b.name, conn_b)
        tx_a.commit()
        woken = store.teams.fan_in_within(conn_b, team_id, decide, publish_grace=30)
        tx_b.commit()

    # Then b's fan-in saw a's answer and moved the team on, with each answer once
    assert woken is not None and woken.status == S.QUEUED
    results = sorted(m.content or "" for m in store.get_messages(team_id) if m.role == "tool")
    assert results == [f"answer of {a.name}", f"answer of {b.name}"]
