"""Each message row records the step (seq) and the epoch that wrote it, so an audit can tell
which attempt of a step produced it; rows older than the columns keep NULL."""

from __future__ import annotations

from importlib import resources

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, select, text

from orchestrator.messages import Message, ToolCall
from orchestrator.settings import Settings
from orchestrator.status import RunStatus
from orchestrator.store import Store
from orchestrator.store.database import open_engine
from orchestrator.store.tables import messages
from tests.support import new_run

S = RunStatus


def stamps(store: Store, run_id: str) -> list[tuple[str | None, int | None, int | None]]:
    """(content, seq, epoch) of each of the run's message rows, in order."""
    query = select(messages.c.content, messages.c.seq, messages.c.epoch).where(messages.c.run_id == run_id)
    with store.engine.connect() as conn:
        return [(r.content, r.seq, r.epoch) for r in conn.execute(query.order_by(messages.c.idx))]


def result(call_id: str) -> Message:
    return Message(role="tool", tool_call_id=call_id, tool_name="lookup", content=f"result of {call_id}")


def test_every_message_row_records_the_step_and_the_attempt_that_wrote_it(settings: Settings) -> None:
    # Given a run whose first step (seq 0, claimed at epoch 1) asked for two tool calls
    store = Store.open(settings.database_url)
    run_id = new_run(store, text="question")
    model = store.claim(run_id, 0, "model", owner="w1", lease_seconds=30, max_attempts=5)
    assert model is not None and model.epoch == 1
    calls = [ToolCall(id=c, name="lookup").to_openai() for c in ("c1", "c2")]
    store.commit_step(
        model, [Message(role="assistant", content="calling", tool_calls=calls)],
        status=S.QUEUED, next_step="tools", publish_grace=60,
    )  # fmt: skip

    # When the tool step's first attempt commits one result and loses its lease to the sweeper,
    first = store.claim(run_id, 1, "tools", owner="w2", lease_seconds=30, max_attempts=5)
    assert first is not None
    store.append_tool_result(first, result("c1"))
    taken = store.move(run_id, src=(S.RUNNING,), dst=S.QUEUED, epoch=first.epoch, bump_epoch=True, publish_grace=60)
    assert taken is not None
    # and the second attempt commits the other result, then fails with a message in flight
    second = store.claim(run_id, 1, "tools", owner="w3", lease_seconds=30, max_attempts=5)
    assert second is not None and second.epoch == first.epoch + 2
    store.append_tool_result(second, result("c2"))
    failed = store.fail(
        run_id, epoch=second.epoch, owner="w3", error={"type": "X", "message": "boom"},
        inflight=[Message(role="assistant", content="in flight")],
    )  # fmt: skip
    assert failed is not None and failed.status == S.ERROR
    # and a user continues it with a new message
    resumed = store.move(
        run_id, src=(S.ERROR,), dst=S.QUEUED, epoch=failed.epoch, bump_epoch=True, publish_grace=60,
        new_messages=[Message(role="user", content="go on")], seq=failed.seq + 1, next_step="model",
    )  # fmt: skip
    assert resumed is not None

    # Then each row names the step and the attempt that wrote it: the two results of step 1 tell
    # their attempts apart, the flushed message is the failed attempt's, and a write outside a
    # step carries the seq and epoch it left the run at
    assert stamps(store, run_id) == [
        ("question", 0, 0),
        ("calling", 0, model.epoch),
        ("result of c1", 1, first.epoch),
        ("result of c2", 1, second.epoch),
        ("in flight", 1, second.epoch),
        ("go on", resumed.seq, resumed.epoch),
    ]
    assert (resumed.seq, resumed.epoch) == (2, second.epoch + 1)


# ---------------------------------------------------------------- the migration

BEFORE = "0002_parent_tool_call"


def upgrade(engine: Engine, revision: str) -> None:
    config = Config()
    config.set_main_option("script_location", str(resources.files("orchestrator.store") / "migrations"))
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, revision)


def test_the_migration_leaves_older_messages_unstamped_and_new_writes_stamped(old_database: str) -> None:
    # Given a database at the revision before the columns, holding a run and its first message
    engine = open_engine(old_database)
    try:
        upgrade(engine, BEFORE)
        with engine.begin() as conn:
            conn.execute(text("insert into ratchet_sessions (session_id, created_at) values ('s-old', 1.0)"))
            conn.execute(
                text(
                    "insert into ratchet_runs (run_id, session_id, agent_name, kind, status, epoch, seq, next_step,"
                    " n_messages, attempts, retries, publish_after, created_at, updated_at)"
                    " values ('old', 's-old', 'nobody', 'agent', 'QUEUED', 0, 0, 'model', 1, 0, 0, 2.0, 1.0, 1.0)"
                )
            )
            conn.execute(
                text(
                    "insert into ratchet_messages (run_id, idx, role, content, tool_call_error, created_at)"
                    " values ('old', 0, 'user', 'from before', false, 1.0)"
                )
            )
    finally:
        engine.dispose()

    # When the store opens it (and migrates it to the newest revision) and the run takes a step
    store = Store.open(old_database)
    claim = store.claim("old", 0, "model", owner="w1", lease_seconds=30, max_attempts=5)
    assert claim is not None and [m.content for m in claim.messages] == ["from before"]
    store.commit_step(
        claim, [Message(role="assistant", content="from after")], status=S.COMPLETED, next_step=None,
        publish_grace=60, content="from after",
    )  # fmt: skip

    # Then the older row reads as written by an unknown step, and the new one names its step
    assert stamps(store, "old") == [("from before", None, None), ("from after", 0, claim.epoch)]
    assert [m.content for m in store.get_output("old").messages] == ["from before", "from after"]
