"""PostgreSQL: a team tree's writes take turns on the lock of its top run, so a member's fan-in
never deadlocks against a pause or a decision in the same tree.

The tree: top -> desk -> (broke, payer, writer). `broke` is in ERROR and its fan-in has not run
yet; it runs (as the sweeper runs it, or with `writer`'s final commit) while `payer` pauses (or,
paused already, is decided). Both writes move the desk and the top: were the fan-in to lock the
desk before the top, and the pause or the decision the top before the desk, each would wait for
the other (PostgreSQL would abort one of them as a deadlock). A third transaction holds the
payer's row (or its requirement's) until both are in flight, so they meet at that moment every
time. SQLite writers hold the database lock from BEGIN IMMEDIATE and cannot deadlock."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text

from orchestrator import Agent, Decision, RunStatus, Team
from orchestrator.delegation import commit_and_fan_in, fan_in_now
from orchestrator.messages import Message
from orchestrator.models import OpenAIChat
from orchestrator.store import Claim, Store
from orchestrator.store.paused import Asked
from orchestrator.testing.waiting import wait_until
from tests.support import delegate, waiting_team

pytestmark = pytest.mark.postgres
S = RunStatus
PAY = Asked(pause_type="confirmation", tool_call_id="call-pay", tool_name="pay", tool_args={"amount": 5})


class Tree:
    """top -> desk -> (broke, payer, writer), written through the code the tool step uses; `broke`
    in ERROR with no fan-in, `payer` and `writer` RUNNING under their claims."""

    def __init__(self, store: Store) -> None:
        t = uuid.uuid4().hex[:6]
        self.broke_agent = Agent(name=f"broke-{t}", model=OpenAIChat(id="broke"))
        self.payer_agent = Agent(name=f"payer-{t}", model=OpenAIChat(id="payer"))
        self.writer_agent = Agent(name=f"writer-{t}", model=OpenAIChat(id="writer"))
        members = [self.broke_agent, self.payer_agent, self.writer_agent]
        desk = Team(name=f"desk-{t}", model=OpenAIChat(id="desk"), members=members)
        self.top = waiting_team(store, Team(name=f"top-{t}", model=OpenAIChat(id="top"), members=[desk]), [desk])
        (desk_run,) = store.children(self.top)
        self.desk = desk_run.run_id
        delegate(store, self.desk, members)
        runs = {c.agent_name: c.run_id for c in store.children(self.desk)}
        self.broke, self.payer = runs[self.broke_agent.name], runs[self.payer_agent.name]
        store.move(self.broke, src=(S.QUEUED,), dst=S.ERROR, error_type="BadRequestError", error_message="bad")
        self.claim = self._claim(store, self.payer)
        self.writer_claim = self._claim(store, runs[self.writer_agent.name])
        self.store = store

    @staticmethod
    def _claim(store: Store, run_id: str) -> Claim:
        claim = store.claim(run_id, 0, "model", owner="w", lease_seconds=30, max_attempts=5)
        assert claim is not None
        return claim

    def fan_in(self, how: str) -> Callable[[], Any]:
        """The desk's fan-in: as the sweeper runs it, or with the writer's final commit."""
        if how == "sweeper":
            return lambda: fan_in_now(self.store, self.desk, publish_grace=30)
        answer = Message(role="assistant", content="written")
        claim = self.writer_claim
        return lambda: commit_and_fan_in(
            self.store, claim, [answer], status=S.COMPLETED, publish_grace=30, content="written"
        )


class Attempt(threading.Thread):
    """A write in a thread of its own, keeping what it returned or raised."""

    def __init__(self, write: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.write = write
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.write()
        except BaseException as exc:
            self.error = exc


@pytest.fixture
def admin(pg_url: str) -> Iterator[Engine]:
    engine = create_engine(pg_url)
    yield engine
    engine.dispose()


def blocked(admin: Engine) -> int:
    """How many sessions of this database wait for a lock."""
    with admin.connect() as conn:
        query = "select count(*) from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock'"
        return int(conn.execute(text(query)).scalar_one())


def race(admin: Engine, hold: str, key: str, first: Callable[[], Any], second: Callable[[], Any]) -> list[Attempt]:
    """Hold the row `key` of table `hold` while `first` starts (it waits for that row after the
    top's lock), then start `second` and wait until it waits too; then let both go."""
    attempts = [Attempt(first), Attempt(second)]
    with admin.connect() as holder:
        tx = holder.begin()
        column = "run_id" if hold == "ratchet_runs" else "id"
        holder.execute(text(f"select 1 from {hold} where {column} = :k for update"), {"k": key})
        attempts[0].start()
        wait_until(lambda: blocked(admin) == 1, timeout=20, what="the first write to wait for the held row")
        attempts[1].start()
        wait_until(lambda: blocked(admin) == 2, timeout=20, what="the second write to wait for a lock")
        tx.rollback()
    for attempt in attempts:
        attempt.join(30)
        assert not attempt.is_alive(), "a write of the race never finished"
    return attempts


FAN_INS = pytest.mark.parametrize("how", ["sweeper", "final commit"])


@FAN_INS
def test_a_members_fan_in_and_a_pause_in_its_tree_take_turns_without_a_deadlock(
    pg_url: str, admin: Engine, how: str
) -> None:
    store = Store.open(pg_url)
    tree = Tree(store)

    pause, fan_in = race(
        admin,
        "ratchet_runs",
        tree.payer,
        lambda: store.requirements.pause(tree.claim, [], [PAY], publish_grace=30),
        tree.fan_in(how),
    )

    # Then neither failed: the pause went first, and the fan-in then failed the desk (and the
    # top) for its broken member while the payer waits for its decision
    assert pause.error is None and fan_in.error is None, (pause.error, fan_in.error)
    assert pause.result.status == S.PAUSED
    assert [store.get_record(r).status for r in (tree.top, tree.desk, tree.payer)] == [S.ERROR, S.ERROR, S.PAUSED]
    assert tree.broke in (store.get_record(tree.desk).error_message or "")
    [req] = store.requirements.of_run(tree.payer)
    assert req.is_active


@FAN_INS
def test_a_members_fan_in_and_a_decision_in_its_tree_take_turns_without_a_deadlock(
    pg_url: str, admin: Engine, how: str
) -> None:
    # Given the payer paused (the desk and the top PAUSED with it) and its sibling in ERROR,
    # unfanned (a fan-in of a PAUSED team fails it, so this one moves the desk and the top)
    store = Store.open(pg_url)
    tree = Tree(store)
    store.requirements.pause(tree.claim, [], [PAY], publish_grace=30)
    [req] = store.requirements.of_run(tree.payer)
    assert [store.get_record(r).status for r in (tree.top, tree.desk)] == [S.PAUSED, S.PAUSED]

    decision, fan_in = race(
        admin,
        "ratchet_requirements",
        req.id,
        lambda: store.requirements.decide(tree.top, req.id, Decision(kind="confirm"), by="ann", publish_grace=30),
        tree.fan_in(how),
    )

    # Then neither failed: the decision queued the payer and moved the desk and the top back to
    # WAITING, and the fan-in then failed them for the broken member; the payer runs on
    assert decision.error is None and fan_in.error is None, (decision.error, fan_in.error)
    assert decision.result.resumed is not None and decision.result.resumed.status == S.QUEUED
    assert [t.run_id for t in decision.result.teams] == [tree.desk, tree.top]
    assert [store.get_record(r).status for r in (tree.top, tree.desk, tree.payer)] == [S.ERROR, S.ERROR, S.QUEUED]
