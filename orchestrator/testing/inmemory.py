"""`InMemoryDispatcher`: steps run inline in the calling process, for unit tests of agents.

Procrastinate's `InMemoryConnector` is the model: only the broker is replaced. Steps go through
the engine a Celery worker runs, against a real store (a SQLite file), so a test sees the rows,
retries, fan-ins and errors a worker would leave; the broker, the worker process and the waits
are gone.

    from orchestrator.testing import in_memory

    def test_my_agent_answers() -> None:
        with in_memory():
            out = my_agent.run("hi")  # every step has run when start() returns
        assert out.status == RunStatus.COMPLETED

- **A queue and a drain loop.** `publish` queues the step and, unless a drain is under way,
  drains the queue in the publishing thread until it is empty. A step published by a step (the
  next model call, a member's first step, a retry) joins the queue and runs after that step
  returns, never inside it, so the stack stays flat however long the run. `Client.start`
  therefore returns with the run (and its members) final and `wait()` reads it at once. With
  `autorun=False` publish only queues: the test runs steps one by one (`run_next`) or all
  (`run_until_idle`), to look at a run between steps or cancel it there.
- **Countdowns on a virtual clock.** A step published with a countdown (a retry's backoff, a
  provider's Retry-After) is due at `now + countdown` on the dispatcher's own clock, which jumps
  to the next due step when none is ready: nothing sleeps, and a delayed step still runs after
  every step that was ready before it was due, as on a broker. The store keeps wall time.
- **Priorities as on a broker.** Of the steps due, a higher priority runs first (a step of a
  run without one is as 0), then the order they were published in. Queues are not kept apart:
  every step runs here, whichever queue its agent or tool names (`StepRef.queue` shows it).
- **Limits on the virtual clock.** The dispatcher's runtime has a `LocalLimiter` of its own
  (`orchestrator.limits`) whose clock runs on by the countdowns waited: a step parked for a
  model's rate runs again once its countdown is due, with the rate's window that much further
  on, and nothing sleeps. A test may give it another (`in_memory(limiter=...)`).
- **One version of each agent.** The dispatcher serves the definitions this process defines, as
  a worker does: a step a deploy's check handed on to a worker of another definition of its
  agent (`StepRef.definition`, `orchestrator.deploys`) is not run but kept in `unserved`, as on
  a version queue no worker consumes, until the run's outbox marker has the sweeper publish it
  again (`sweep()`).
- **Failures as on a worker.** A step that raises goes to `StepRunner.fail_step` with its claim's
  owner, as `StepTask.on_failure` does; a fenced step (cancelled while it ran) is dropped, as
  the Celery task drops it.

Limits: a step that waits for another run (a tool calling `agent.run()`) waits forever, since
the other run's steps queue behind it. A retry parked longer than RATCHET_MAX_COUNTDOWN is the
sweeper's to publish: `in_memory()` raises that setting to RATCHET_MAX_RETRY_AFTER, so every
retry gets a countdown, and `sweep()` runs a pass by hand. Crashes, leases and time limits need
real workers (`workers.celery.embedded`, the chaos tests).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from functools import cached_property
from pathlib import Path

from orchestrator.agent import registered
from orchestrator.catalog import describe, write_served
from orchestrator.client import Client
from orchestrator.errors import FencedError
from orchestrator.limits import LocalLimiter
from orchestrator.ports import Delivery, Limiter, StepRef
from orchestrator.producer import use_client
from orchestrator.runtime import Runtime, build, install, uninstall
from orchestrator.settings import Settings
from orchestrator.steps import StepRunner
from orchestrator.store import Store
from orchestrator.store.database import migrate, open_engine
from orchestrator.sweeper import Sweeper, SweepReport

log = logging.getLogger("ratchet.inmemory")


class InMemoryDispatcher:
    """A Dispatcher that runs each published step in this process, on `store`.

    Also usable by name: RATCHET_DISPATCHER=orchestrator.testing:InMemoryDispatcher makes every
    producer of the process run its runs inline, on the store RATCHET_DATABASE_URL names (the
    process's runtime for those settings is then this dispatcher's `runtime`)."""

    def __init__(
        self,
        settings: Settings,
        *,
        store: Store | None = None,
        autorun: bool = True,
        limiter: Limiter | None = None,
    ) -> None:
        self.settings = settings
        #: Drain the queue on publish (False: the test calls `run_next` / `run_until_idle`).
        self.autorun = autorun
        #: Every step published, in order, with its countdown (what a test asserts a backoff on).
        self.published: list[StepRef] = []
        #: The steps handed on to a definition of their agent this process does not serve: not run.
        self.unserved: list[StepRef] = []
        #: The virtual clock: the seconds of countdown the steps so far would have waited.
        self.now = 0.0
        self._queue: list[tuple[float, int, int, StepRef]] = []
        self._order = itertools.count()
        self._draining = False
        self._lock = threading.Lock()
        #: The limits: by default on wall time plus the countdowns waited (see above).
        self.limiter = limiter or LocalLimiter(
            slot_seconds=settings.run_slot_seconds, clock=lambda: time.monotonic() + self.now
        )
        #: The parts the steps run with: `store` (default: the process's for the settings), this
        #: dispatcher, `limiter`, and the delta sink and final channel the settings name.
        self.runtime: Runtime = build(settings, store=store, dispatcher=self, limiter=self.limiter)
        self.store = self.runtime.store
        #: The step runner a Celery worker would run the steps with, on `runtime`.
        self.runner = StepRunner(self.runtime)
        self._served: tuple[int, ...] = ()

    @cached_property
    def client(self) -> Client:
        """A producer client on this dispatcher's runtime."""
        return Client(runtime=self.runtime)

    @property
    def pending(self) -> list[StepRef]:
        """The steps queued and not run yet, in the order they will run."""
        with self._lock:
            return [step for *_, step in sorted(self._queue)]

    def publish(self, step: StepRef) -> None:
        """Queue the step; with `autorun`, run the queue now unless a drain is under way."""
        with self._lock:
            self.published.append(step)
            due = self.now + (step.countdown or 0.0)
            heapq.heappush(self._queue, (due, -(step.priority or 0), next(self._order), step))
        if self.autorun:
            self.run_until_idle()

    def run_until_idle(self) -> int:
        """Run queued steps, and the steps they publish, until none is left; returns how many
        ran. Returns 0 at once inside a step or another drain: the steps are that drain's to run."""
        with self._lock:
            if self._draining:
                return 0
            self._draining = True
        ran = 0
        try:
            while True:
                with self._lock:
                    if not self._queue:
                        # Under the lock: a step published from now on finds no drain and runs itself.
                        self._draining = False
                        return ran
                    step = self._pop()
                self._run(step)
                ran += 1
        except BaseException:  # a KeyboardInterrupt in a step: the next publish drains again
            with self._lock:
                self._draining = False
            raise

    def run_next(self) -> StepRef | None:
        """Run the next step due (the virtual clock moves to it) and return it; None if none is
        queued, or inside a step or a drain. The steps it publishes are queued, not run."""
        with self._lock:
            if self._draining or not self._queue:
                return None
            step = self._pop()
            self._draining = True
        try:
            self._run(step)
        finally:
            with self._lock:
                self._draining = False
        return step

    def _pop(self) -> StepRef:
        """The next step due, off the queue (the caller holds the lock)."""
        due, *_, step = heapq.heappop(self._queue)
        self.now = max(self.now, due)
        return step

    # ---------------------------------------------------------------- the runner, in one place

    def sweep(self) -> SweepReport:
        """One sweeper pass (as a worker's sweeper runs it); what it publishes runs as usual."""
        return Sweeper(self.runner).sweep_once()

    def _serve(self) -> None:
        """Write the agents this process defines into the agent catalog, as a worker does when it
        boots, and again once more are defined (`orchestrator.catalog`)."""
        agents = registered()
        served = tuple(id(a) for a in agents)
        if served != self._served:
            write_served(self.store, agents)
            self._served = served

    def _run(self, step: StepRef) -> None:
        """Run one delivery as a Celery worker's step task does: the step, then the failure
        handler if it raised."""
        self._serve()
        if step.definition is not None and step.definition not in {describe(a).hash for a in registered()}:
            self.unserved.append(step)
            return
        owner = f"{socket.gethostname()}:{os.getpid()}:{step.run_id}.{step.seq}.{step.kind}.{next(self._order)}"
        run = self.runner.model_step if step.kind == "model" else self.runner.tool_step
        queue = step.queue or (self.settings.model_queue if step.kind == "model" else self.settings.tools_queue)
        delivery = Delivery(system="inline", queue=queue, message_id=owner.rsplit(":", 1)[-1])
        try:
            outcome = run(step.run_id, step.seq, owner=owner, delivery=delivery)
        except FencedError as exc:
            log.info("%s", exc)
            return
        except Exception as exc:
            try:
                self.runner.fail_step(step.run_id, step.seq, exc, owner=owner)
            except Exception:  # as on a worker: logged, and the run is left to the sweeper
                log.exception("run %s step %s: the failure handler could not record the error", step.run_id, step.seq)
            return
        log.debug("run %s step %s (%s): %s", step.run_id, step.seq, step.kind, outcome)


@contextmanager
def in_memory(
    database: str | Path | Settings | None = None, *, autorun: bool = True, limiter: Limiter | None = None
) -> Iterator[InMemoryDispatcher]:
    """Run every step inline for the block, on a real store; yields the dispatcher.

    `database`: a SQLite file (made and migrated if new) or a database URL, whole Settings (used
    as they are), or None: a SQLite file in a temporary folder removed afterwards.
    Within the block, agents built without a client (`agent.run`, `start`, `continue_run`) and
    any `Client` built with the dispatcher's `settings` use its runtime (installed as the
    process's for those settings); `dispatcher.client` is one. The store is the block's own and
    is closed on exit. `limiter`: flow control's, instead of one on the virtual clock."""
    with ExitStack() as stack:
        if isinstance(database, Settings):
            settings = database
        else:
            if database is None:
                database = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ratchet-test-"))) / "runs.db"
            settings = _settings_for(database)
        engine = open_engine(settings.database_url, sqlite_synchronous=settings.sqlite_synchronous)
        if settings.auto_migrate:
            migrate(engine)
        store = Store(engine)
        stack.callback(store.dispose)
        dispatcher = InMemoryDispatcher(settings, store=store, autorun=autorun, limiter=limiter)
        stack.callback(uninstall, dispatcher.runtime, install(dispatcher.runtime))
        stack.callback(use_client, use_client(dispatcher.client))
        yield dispatcher


def _settings_for(database: str | Path) -> Settings:
    """The settings `in_memory` uses for a SQLite file or a URL. Every retry a provider's
    Retry-After allows gets a countdown (which costs nothing on the virtual clock) instead of
    waiting for a sweep; commits skip SQLite's fsync, since a test's database need not survive a
    power cut."""
    url = str(database)
    return Settings(
        database_url=url if "://" in url else f"sqlite:///{url}",
        sqlite_synchronous="NORMAL",
        max_countdown=Settings.model_fields["max_retry_after"].default,
        dispatcher=f"{__name__}:InMemoryDispatcher",
    )
