"""SQLite's durability level is a setting (RATCHET_SQLITE_SYNCHRONOUS): FULL by default, so a
committed step survives an OS crash or a power loss, not only a crash of the process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.errors import ConfigurationError
from orchestrator.runtime import build
from orchestrator.settings import Settings
from orchestrator.steps import StepRunner
from orchestrator.store import Store, forget_stores
from orchestrator.store.database import open_engine
from tests.support import new_run

#: What `PRAGMA synchronous` reports for each level.
LEVELS = {"NORMAL": 1, "FULL": 2, "EXTRA": 3}


@pytest.fixture(autouse=True)
def _fresh_stores() -> Iterator[None]:
    forget_stores()
    yield
    forget_stores()


def reported(store: Store) -> tuple[int, int]:
    """`PRAGMA synchronous` on a connection of the store's write engine and of its read engine."""
    with store.engine.connect() as conn:
        write = conn.exec_driver_sql("PRAGMA synchronous").scalar()
    with store.quick_engine.connect() as conn:
        read = conn.exec_driver_sql("PRAGMA synchronous").scalar()
    return int(write), int(read)  # type: ignore[arg-type]


def test_by_default_every_sqlite_commit_is_synced(tmp_path: Path) -> None:
    engine = StepRunner(build(Settings.from_env({"RATCHET_DATABASE_URL": f"sqlite:///{tmp_path / 'default.db'}"})))
    assert reported(engine.store) == (LEVELS["FULL"], LEVELS["FULL"])
    assert reported(Store.open(f"sqlite:///{tmp_path / 'plain.db'}")) == (LEVELS["FULL"], LEVELS["FULL"])


@pytest.mark.parametrize("level", ["normal", "EXTRA"])
def test_the_level_is_the_setting(tmp_path: Path, level: str) -> None:
    settings = Settings.from_env(
        {"RATCHET_DATABASE_URL": f"sqlite:///{tmp_path / 'set.db'}", "RATCHET_SQLITE_SYNCHRONOUS": level}
    )
    assert reported(StepRunner(build(settings)).store) == (LEVELS[level.upper()],) * 2


def test_an_unknown_level_is_refused_with_the_levels_to_use(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="RATCHET_SQLITE_SYNCHRONOUS is 'OFF'; use one of FULL, NORMAL"):
        open_engine(f"sqlite:///{tmp_path / 'off.db'}", sqlite_synchronous="off")


def test_a_claim_commits_without_its_fsync_and_the_steps_commit_with_it(tmp_path: Path) -> None:
    # Given a store at FULL that records the level each of its UPDATEs ran at
    from sqlalchemy import event

    from orchestrator.messages import Message
    from orchestrator.status import RunStatus

    store = Store.open(f"sqlite:///{tmp_path / 'lazy.db'}")
    seen: list[tuple[str, int]] = []

    def level(conn: object, cursor: object, statement: str, *args: object) -> None:
        if statement.lstrip().upper().startswith("UPDATE RATCHET_RUNS"):
            dbapi = conn.connection.dbapi_connection  # type: ignore[attr-defined]
            seen.append((statement.split("SET", 1)[1][:40], dbapi.execute("PRAGMA synchronous").fetchone()[0]))

    event.listen(store.engine, "before_cursor_execute", level)
    event.listen(store.lazy_engine, "before_cursor_execute", level)
    run_id = new_run(store, text="hi")

    # When a step is claimed and committed
    claim = store.claim(run_id, 0, "model", owner="w1", lease_seconds=30, max_attempts=5)
    assert claim is not None
    store.commit_step(
        claim, [Message(role="assistant", content="hello")], status=RunStatus.COMPLETED, next_step=None,
        publish_grace=60, content="hello",
    )  # fmt: skip

    # Then the claim ran at NORMAL (no fsync; the next commit flushes it) and the commit at FULL
    assert [lvl for _, lvl in seen] == [LEVELS["NORMAL"], LEVELS["FULL"]], seen
