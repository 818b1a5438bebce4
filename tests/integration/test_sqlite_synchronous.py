"""SQLite's durability level is a setting (RATCHET_SQLITE_SYNCHRONOUS): FULL by default, so a
committed step survives an OS crash or a power loss, not only a crash of the process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.engine import Engine
from orchestrator.errors import ConfigurationError
from orchestrator.settings import Settings
from orchestrator.store import Store, forget_stores
from orchestrator.store.database import open_engine

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
    engine = Engine(Settings.from_env({"RATCHET_DATABASE_URL": f"sqlite:///{tmp_path / 'default.db'}"}))
    assert reported(engine.store) == (LEVELS["FULL"], LEVELS["FULL"])
    assert reported(Store.open(f"sqlite:///{tmp_path / 'plain.db'}")) == (LEVELS["FULL"], LEVELS["FULL"])


@pytest.mark.parametrize("level", ["normal", "EXTRA"])
def test_the_level_is_the_setting(tmp_path: Path, level: str) -> None:
    settings = Settings.from_env(
        {"RATCHET_DATABASE_URL": f"sqlite:///{tmp_path / 'set.db'}", "RATCHET_SQLITE_SYNCHRONOUS": level}
    )
    assert reported(Engine(settings).store) == (LEVELS[level.upper()],) * 2


def test_an_unknown_level_is_refused_with_the_levels_to_use(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="RATCHET_SQLITE_SYNCHRONOUS is 'OFF'; use one of FULL, NORMAL"):
        open_engine(f"sqlite:///{tmp_path / 'off.db'}", sqlite_synchronous="off")
