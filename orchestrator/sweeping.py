"""The fleet's sweeping: every worker runs the sweeper, and one of them acts at a time.

Recovery needs no process of its own. Each worker's main process runs a `SweeperThread` (the
worker step `workers.celery.worker.SweeperStep`; RATCHET_WORKER_SWEEPS=false turns it off). Every
RATCHET_SWEEP_SECONDS it takes, or renews, the database lease "sweeper" (`Store.hold_lease`) for
`LEASE_SWEEPS` intervals, sweeps (`Sweeper.sweep_once`) only if it holds it, and renews it again
after the pass. So the worker that holds it keeps sweeping and the others only try the lease, one
guarded UPDATE a tick each:

- a worker that stops (a warm shutdown, a deploy) lets the lease go, and another takes it at its
  next tick;
- one that dies (killed, out of memory) stops renewing it: another takes it over once it expires,
  within `LEASE_SWEEPS + 1` intervals (15 to 20 s by default, alongside the step leases of the
  dead worker's runs, which expire in RATCHET_LEASE_SECONDS);
- one that froze past its lease and wakes finds the lease another's at its next tick and stops.

`ratchet beat`'s sweep task takes the same lease (`FleetSweeper` under an owner of the pass's own,
let go at its end), so beat and the workers never sweep at once either. Two sweeps at once stay
safe (every write of a pass is a guarded move): the lease saves the work, not the data. A pass
longer than the lease (thousands of stuck runs on a slow database) lets another sweeper start
beside it before the holder renews; the next tick settles who holds it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from orchestrator.forks import unforked
from orchestrator.settings import Settings
from orchestrator.steps import StepRunner
from orchestrator.sweeper import Sweeper, SweepReport

log = logging.getLogger("ratchet.sweeper")

#: The name of the sweeper's lease (`ratchet_leases.name`).
SWEEP_LEASE = "sweeper"
#: A holder keeps the lease this many sweep intervals past its last renewal.
LEASE_SWEEPS = 3


def lease_seconds(settings: Settings) -> float:
    """How long the sweeper's lease lasts past its holder's last renewal."""
    return LEASE_SWEEPS * settings.sweep_seconds


class FleetSweeper:
    """A sweeper that acts only while it holds the fleet's sweep lease, under `owner`."""

    def __init__(self, runner: StepRunner, owner: str, *, announce: bool = True) -> None:
        self.sweeper = Sweeper(runner)
        self.store = runner.store
        self.owner = owner
        self.seconds = lease_seconds(runner.settings)
        #: Whether to log when this sweeper takes the lease or loses it (a worker's: once each).
        self.announce = announce
        #: Whether this sweeper held the lease after its last pass or try.
        self.holding = False

    def sweep(self) -> SweepReport | None:
        """One pass if this sweeper holds the lease or can take it (renewed after the pass too),
        else None: another sweeper acts."""
        self._hold()
        if not self.holding:
            return None
        report = self.sweeper.sweep_once()
        self._hold()
        return report

    def _hold(self) -> None:
        held, self.holding = self.holding, self.store.hold_lease(SWEEP_LEASE, self.owner, seconds=self.seconds)
        if self.announce and self.holding != held:
            change = "took the sweep lease, and sweeps" if self.holding else "lost the sweep lease, and stops"
            log.info("sweeper %s: %s", self.owner, change)

    def release(self) -> None:
        """Let the lease go if this sweeper holds it, so another takes over at its next tick."""
        if self.holding:
            self.store.hold_lease(SWEEP_LEASE, self.owner, seconds=0)
            self.holding = False


class SweeperThread:
    """A worker's sweeper: a `FleetSweeper` pass every RATCHET_SWEEP_SECONDS, in a thread.

    The step runner is built by `runner()` in the thread, at its first tick: a worker does not
    wait on the database to start, and one that cannot reach it yet sweeps once it can. A fork of
    the process (a prefork pool replacing a child) waits for the pass in progress (`orchestrator.forks`)."""

    def __init__(self, runner: Callable[[], StepRunner], owner: str, *, every: float) -> None:
        self.owner = owner
        self.every = every
        self.fleet: FleetSweeper | None = None
        self._runner = runner
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start sweeping (the first try one interval from now)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ratchet-sweeper", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop after the pass in progress, if any, and let the lease go."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout)
        if thread.is_alive():
            log.warning("sweeper %s: a pass still runs after %gs; its lease expires", self.owner, timeout)
            return
        try:
            if self.fleet is not None:
                with unforked():
                    self.fleet.release()
        except Exception:  # the lease expires by itself
            log.exception("sweeper %s: could not let the sweep lease go; it expires by itself", self.owner)

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            try:
                with unforked():
                    if self.fleet is None:
                        self.fleet = FleetSweeper(self._runner(), self.owner)
                    self.fleet.sweep()
            except Exception:  # a database hiccup must not end the loop; the next tick tries again
                log.exception("sweeper %s: the sweep failed; the next one tries again", self.owner)
