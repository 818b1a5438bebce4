"""Small helpers several test files share: a clock the test moves, a run written straight into
the store (no producer, no broker) for tests of the store's own moves, a scripted model that
counts its calls, and a database migrated only so far (rows as an older Ratchet wrote them)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence

from sqlalchemy import Connection

from orchestrator import Agent, Team
from orchestrator.delegation import Delegation, start_members
from orchestrator.messages import Message, ToolCall
from orchestrator.models.base import CallContext, ModelReply, ToolSpec
from orchestrator.ports import StepRef
from orchestrator.settings import Settings
from orchestrator.status import RunStatus as S
from orchestrator.store import Store
from orchestrator.team import TO_MEMBER
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.scripted_model import ScriptedModel
from orchestrator.usage import Prices


class Clock:
    """Wall time plus an offset the test moves forward (a lease is a time the store reads)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


class RecordingDispatcher:
    """The broker port, keeping the steps it is asked to publish; `down` refuses them all."""

    def __init__(self) -> None:
        self.steps: list[StepRef] = []
        self.down = False

    def publish(self, step: StepRef) -> None:
        if self.down:
            raise ConnectionError("the broker is down")
        self.steps.append(step)


def clocked_store(settings: Settings, clock: Clock) -> Store:
    """The test's store (migrated), reading time from `clock`."""
    return Store(Store.open(settings.database_url).engine, clock=clock)


def new_run(store: Store, agent: str = "nobody", kind: str = "agent", text: str = "hello") -> str:
    """A QUEUED run with one user message, written directly; returns its id."""
    run_id = str(uuid.uuid4())
    store.create_run(
        run_id=run_id, session_id=f"s-{run_id[:8]}", agent_name=agent, kind=kind,
        input_messages=[Message(role="user", content=text)], publish_grace=60,
    )  # fmt: skip
    return run_id


class CountingModel(ScriptedModel):
    """The scripted model, remembering the (run_id, seq) of every call it answered or failed."""

    def __init__(self, id: str = "scripted", script: ScriptConfig | None = None, prices: Prices | None = None) -> None:
        super().__init__(id=id, script=script, prices=prices)
        self.calls: list[tuple[str, int]] = []

    def invoke(self, messages: Sequence[Message], tools: Sequence[ToolSpec], *, context: CallContext) -> ModelReply:
        self.calls.append((context.run_id, context.seq))
        return super().invoke(messages, tools, context=context)

    def calls_for(self, run_id: str) -> list[int]:
        """The seqs of the calls made for one run, in order."""
        return [seq for rid, seq in self.calls if rid == run_id]


def migrate_to(url: str, revision: str, rows: Callable[[Connection], None]) -> None:
    """Migrate the database at `url` up to `revision` only and write `rows` there, as a Ratchet of
    that revision would have: the store's next open applies the migrations after it to them."""
    from importlib import resources

    from alembic import command
    from alembic.config import Config

    from orchestrator.store.database import open_engine

    engine = open_engine(url)
    config = Config()
    config.set_main_option("script_location", str(resources.files("orchestrator.store") / "migrations"))
    try:
        with engine.begin() as conn:
            config.attributes["connection"] = conn
            command.upgrade(config, revision)
            rows(conn)
    finally:
        engine.dispose()


def waiting_team(store: Store, team: Team, members: list[Agent]) -> str:
    """A team run that delegated one call per member, through the code the tool step uses."""
    run_id = new_run(store, team.name, "team")
    delegate(store, run_id, members)
    return run_id


def delegate(store: Store, run_id: str, members: list[Agent]) -> None:
    """The QUEUED team run `run_id` delegates one call per member (its model step, its tool step)."""
    claim = store.claim(run_id, 0, "model", owner="test", lease_seconds=30, max_attempts=5)
    assert claim is not None
    calls = [ToolCall(id=f"call-{m.name}", name=TO_MEMBER, arguments="{}") for m in members]
    store.commit_step(
        claim, [Message(role="assistant", tool_calls=[c.to_openai() for c in calls])],
        status=S.QUEUED, next_step="tools", publish_grace=30,
    )  # fmt: skip
    claim = store.claim(run_id, 1, "tools", owner="test", lease_seconds=30, max_attempts=5)
    assert claim is not None
    delegations = [Delegation(call=c, task="t", members=(m,)) for c, m in zip(calls, members, strict=True)]
    start_members(store, claim, [], delegations, publish_grace=30)
