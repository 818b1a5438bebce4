"""The lease heartbeat: a worker keeps the claims of the steps it runs for as long as it lives.

A claim's lease is short (RATCHET_LEASE_SECONDS) so that the runs of a worker that dies (killed,
out of memory, its node lost) are taken back by the sweeper within a lease and a sweep. While the
worker lives, this thread renews the lease of every step its process holds, every
RATCHET_HEARTBEAT_SECONDS, in one UPDATE guarded by each step's epoch and owner (`Store.renew_leases`),
so a long tool or a slow model keeps its claim.

Up to the hard time limit only: time limits bound a step, and a pool that enforces none (threads)
must not let a stuck step hold its run forever. Past the hard limit a step's lease is no longer
renewed; it expires and the sweeper takes the run back, fencing the stuck step.

One thread per process, started by the step runner's first claim (so in a prefork pool it starts in
the child, after the fork) and ended when the process holds no step. A renewal that finds its
step gone (fenced, cancelled) stops renewing that step; a database error is logged and the next
beat tries again: it never ends the thread while steps are held.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from orchestrator.settings import Settings
from orchestrator.store import Store
from orchestrator.store.transient import is_transient

log = logging.getLogger("ratchet.heartbeat")


class HeldStep(Protocol):
    """A step this process holds, as `orchestrator.steps.inflight` records it."""

    run_id: str
    epoch: int
    #: The claim's owner (host, pid, task id), as stored in `lease_owner`.
    owner: str
    #: When the claim was taken (the store's clock).
    claimed_at: float
    #: False once a renewal found the claim lost, or the step ran past the hard time limit.
    renewing: bool
    #: Odd while the step moves its claim to a new epoch; bumped again when `epoch` is the new one.
    moves: int


class Heartbeat:
    """Renews the leases of the steps `held()` returns, from a thread of its own."""

    def __init__(self, store: Store, settings: Settings, held: Callable[[], Sequence[HeldStep]]) -> None:
        self.store = store
        self.settings = settings
        self._held = held
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        """Whether the thread is running (it ends when the process holds no step)."""
        with self._lock:
            return self._thread is not None

    def wake(self) -> None:
        """Make sure the thread runs: call after registering a new claim."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ratchet-heartbeat", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(self.settings.heartbeat_seconds)
            with self._lock:
                # Checked under the lock `wake` takes: a claim registered after this check finds
                # no thread and starts one.
                if not self._held():
                    self._thread = None
                    return
            try:
                self.beat()
            except Exception as exc:
                every = self.settings.heartbeat_seconds
                if is_transient(exc):  # a failover, a dropped connection: expected, and short
                    log.warning("lease heartbeat failed (%s); retrying in %gs", type(exc).__name__, every)
                else:
                    log.exception("lease heartbeat failed; retrying in %gs", every)

    def beat(self) -> None:
        """One renewal of every held step's lease (the thread calls it every heartbeat)."""
        steps = [s for s in self._held() if s.renewing]
        if not steps:
            return
        now = self.store.clock()
        limit = self.settings.hard_time_limit
        due: list[HeldStep] = []
        for step in steps:
            if now - step.claimed_at < limit:
                due.append(step)
                continue
            step.renewing = False
            log.warning(
                "run %s: the step of epoch %s ran past the hard time limit (%gs); its lease is no longer "
                "renewed, so the sweeper will take the run back when it expires",
                step.run_id,
                step.epoch,
                limit,
            )
        moves = [s.moves for s in due]  # read before the epochs: see `lost`
        renewed = self.store.renew_leases(
            [(s.run_id, s.epoch, s.owner) for s in due], lease_seconds=self.settings.lease_seconds
        )
        for step, moved in zip(due, moves, strict=True):
            if step.owner not in renewed and lost(step, moved):
                # Fenced, cancelled or finished: the step's own next write says which.
                step.renewing = False
                log.info(
                    "run %s: the claim of epoch %s is gone; its lease is no longer renewed", step.run_id, step.epoch
                )


def lost(step: HeldStep, moves: int) -> bool:
    """Whether a renewal of `step` that found no claim means the claim is gone: not when the step
    was moving its claim to a new epoch (`moves` odd, as read before the renewal's epoch) or has
    moved it since (the renewal may have named the old epoch; the move renewed the lease itself)."""
    return moves % 2 == 0 and step.moves == moves
