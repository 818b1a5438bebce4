"""The step protocol, and `StepRunner`, which applies it to every step a process runs.

The protocol (docs/guarantees.md, "How a step works"): claim (guarded, bumps the epoch, sets the
lease), checked against the worker's definition of the run's agent (`steps.versions`: nothing
read unless a deploy put the run on another); work outside any transaction; commit fenced by
the epoch, tried again through transient database errors (`durably`); publish the next step
after the commit. A step that raises is aborted here (a fenced one leaves only a trace); the
task's failure handler then calls `fail_step`, which flushes the step's in-flight messages onto
the run's ERROR row.

What a step does between its claim and its commit is the business of a step object
(`ModelStep`, `ToolStep`), which the runner owns and gives its parts of the protocol
(`steps.context.StepContext`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from orchestrator import delegation, tracing
from orchestrator.errors import FencedError, RunNotFoundError, StepTimeoutError
from orchestrator.heartbeat import Heartbeat
from orchestrator.messages import Message
from orchestrator.ports import Delivery, DeltaSink, Dispatcher, StepKind, StepRef
from orchestrator.routing import owed, step_of
from orchestrator.run import RunRecord
from orchestrator.runtime import Runtime
from orchestrator.settings import Settings
from orchestrator.status import RunStatus
from orchestrator.steps.admission import Admission
from orchestrator.steps.context import StepContext
from orchestrator.steps.inflight import InFlight, InFlightSteps
from orchestrator.steps.model import ModelStep
from orchestrator.steps.tools import ToolStep
from orchestrator.steps.versions import Versions
from orchestrator.store import Claim, Store
from orchestrator.store.transient import is_transient, retry_transient
from orchestrator.untrusted import error_record

log = logging.getLogger("ratchet.steps")
T = TypeVar("T")


class StepRunner:
    """Runs steps for one process, on its runtime's store, dispatcher, delta sink and limiter.
    Thread-safe: an embedded worker may run several at once."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        timeouts: tuple[type[BaseException], ...] = (),
        stopping: Callable[[BaseException], bool] = lambda exc: False,
    ) -> None:
        self.runtime = runtime
        self.settings: Settings = runtime.settings
        self.store: Store = runtime.store
        #: Where next steps are published.
        self.dispatcher: Dispatcher = runtime.dispatcher
        #: What the task runner raises in a step that ran past its soft time limit (Celery's
        #: SoftTimeLimitExceeded; the domain does not import Celery). It ends the step even inside
        #: a tool, where any other exception is the model's to read, and fails it as StepTimeoutError.
        self.timeouts = timeouts
        #: Whether an exception is the worker stopping (Celery's WorkerShutdown, or the SystemExit
        #: a pool process raises on SIGTERM, as at the hard time limit): never a tool's error.
        self.stopping = stopping
        self.inflight = InFlightSteps()
        #: Renews the leases of the steps in `inflight`; started by the first claim.
        self.heartbeat = Heartbeat(self.store, self.settings, self.inflight.held)
        steps = StepContext(
            settings=self.settings,
            store=self.store,
            durably=self.durably,
            end=self.end,
            publish=self.publish,
            timeouts=timeouts,
            stopping=stopping,
        )
        #: The limits (`orchestrator.limits`): the limiter's verdicts, parks and releases.
        self.admission = Admission(steps, runtime.limiter)
        self._model = ModelStep(steps, self.admission, lambda: self.delta_sink)
        self._tools = ToolStep(steps)
        #: Which definition each claimed step runs on, across a deploy (`orchestrator.deploys`).
        self.versions = Versions(steps)

    @property
    def delta_sink(self) -> DeltaSink:
        """Where streamed runs' live events go (RATCHET_REDIS_URL's streams, or the store's table)."""
        return self.runtime.deltas

    def model_step(self, run_id: str, seq: int, *, owner: str, delivery: Delivery | None = None) -> str:
        """One model call for the run. Returns what happened (for logs and tests). `delivery`:
        how its message came, for its span."""
        return self._run(run_id, seq, "model", owner, self._model.run, delivery)

    def tool_step(self, run_id: str, seq: int, *, owner: str, delivery: Delivery | None = None) -> str:
        """Run the tool calls the last assistant message still owes, committing each result."""
        return self._run(run_id, seq, "tools", owner, self._tools.run, delivery)

    def _run(
        self,
        run_id: str,
        seq: int,
        kind: StepKind,
        owner: str,
        body: Callable[[Claim, InFlight], str],
        delivery: Delivery | None,
    ) -> str:
        claim = self._claim(run_id, seq, kind, owner)
        if claim is None:
            return "dropped"
        flight = self.inflight.begin(claim)
        self.heartbeat.wake()
        with tracing.step(claim.record, kind, delivery) as span:  # nothing, unless a tracer provider is set
            try:
                # Stamped with this worker's definition: no read unless the run is on another.
                checked = self.versions.checked(claim, kind, flight)
                outcome = body(checked, flight) if checked is not None else "handed_on"
            except BaseException as exc:
                self._abort(claim, flight, exc)
                raise
            span.outcome(outcome)
            if outcome == "paused":
                self._paused(claim)
            return outcome

    # ---------------------------------------------------------------- claim and commit

    def _claim(self, run_id: str, seq: int, kind: str, owner: str) -> Claim | None:
        claim = self.store.claim(
            run_id,
            seq,
            kind,
            owner=owner,
            lease_seconds=self.settings.lease_seconds,
            max_attempts=self.settings.max_step_attempts,
        )
        if claim is None:
            self._dropped(run_id, seq, kind)
        return claim

    def _dropped(self, run_id: str, seq: int, kind: str) -> None:
        """A delivery the claim refused. A duplicate or stale one is routine; a run this database
        has never seen means this worker and the producer disagree on RATCHET_DATABASE_URL (or
        share a broker across deployments), which must not look healthy while it eats steps."""
        try:
            self.store.get_record(run_id)
        except RunNotFoundError:
            log.warning(
                "run %s step %s (%s): no such run in this worker's database %s; the task was dropped. "
                "Check that producers and workers use the same RATCHET_DATABASE_URL and broker",
                run_id,
                seq,
                kind,
                self.store.display_url,
            )
            return
        log.info("run %s step %s (%s): dropped (a duplicate or stale delivery)", run_id, seq, kind)

    def durably(self, claim: Claim, write: Callable[[], T], *, landed: Callable[[RunRecord], T] | None = None) -> T:
        """A write of the claimed step, tried again through transient database errors (a failover,
        a dropped connection, SQLite busy) for as long as the lease lasts. `landed` turns the run,
        found moved on by a write that committed before its connection dropped, into the result."""

        def found() -> T | None:
            record = self.store.step_landed(claim)
            if record is None:
                return None
            return landed(record) if landed is not None else record  # type: ignore[return-value]

        return retry_transient(write, landed=found, within=self.settings.lease_seconds, what=f"run {claim.run_id}")

    def end(self, claim: Claim) -> None:
        """The step committed: nothing of it is left in flight for a failure handler to flush."""
        self.inflight.end(claim)

    def publish(self, step: StepRef) -> None:
        """Publish a step after its commit. If the broker fails now, the run's outbox marker
        (publish_after) lets the sweeper publish it later: log, do not fail the committed step."""
        try:
            self.dispatcher.publish(step)
        except Exception as exc:
            log.warning(
                "run %s: publishing step %s failed (%s); the sweeper will publish it", step.run_id, step.seq, exc
            )

    def reroute(self, run_id: str, seq: int, kind: str) -> bool:
        """For a step published unrouted (by a producer that does not define its agent, on the
        default queue of its kind): publish it to its agent's queue if that names one, and say
        so; False when it belongs here (or is stale: the claim drops it). One read of the run,
        paid only by such steps."""
        try:
            record = self.store.get_record(run_id)
        except RunNotFoundError:
            return False
        if record.status != RunStatus.QUEUED or record.seq != seq or record.next_step != kind:
            return False
        step = step_of(record, calls=owed(self.store, run_id))
        if not step.routed or step.queue is None:
            return False
        log.info("run %s step %s (%s): sent on to queue %s", run_id, seq, kind, step.queue)
        self.publish(step)
        return True

    # ---------------------------------------------------------------- failure

    def _abort(self, claim: Claim, flight: InFlight, exc: BaseException) -> None:
        """Keep why the step failed for `fail_step`; a fenced step only leaves a trace."""
        if isinstance(exc, FencedError):
            # Another holder owns the run now: nothing of this step may be written, and no
            # failure handler runs. The event shows operators a worker that came back too late.
            self.end(claim)
            try:
                self.store.record_fenced(claim)
            except Exception:
                log.exception("run %s: could not record that epoch %s was fenced", claim.run_id, claim.epoch)
            return
        if isinstance(exc, self.timeouts):
            exc = StepTimeoutError(
                f"the step ran past its soft time limit ({self.settings.soft_time_limit:g}s); raise "
                "RATCHET_SOFT_TIME_LIMIT or make the step faster, then continue the run"
            )
        flight.error = exc

    def fail_step(self, run_id: str, seq: int, exc: BaseException, *, owner: str) -> bool:
        """The failure handler: flush the step's in-flight messages and put the run in ERROR.

        `owner` is the failed delivery's claim owner (as passed to `model_step`/`tool_step`).
        Only a step that holds the claim may fail the run (fenced by its epoch): an error before
        the claim, or from a worker whose lease was taken over, changes nothing."""
        flight = self.inflight.take(owner[:255])
        exc = flight.error if flight is not None and flight.error is not None else exc
        error = error_record(exc)
        if flight is None or isinstance(exc, FencedError):
            log.warning(
                "run %s step %s: %s not recorded (no claim held): %s", run_id, seq, error["type"], error["message"]
            )
            return False
        record = self._flush(run_id, flight, error)
        if record is None:
            return False
        log.warning("run %s step %s: ERROR %s: %s", run_id, seq, error["type"], error["message"])
        self.after_final(run_id, record)
        return True

    def _flush(self, run_id: str, flight: InFlight, error: dict[str, str]) -> RunRecord | None:
        """Write the ERROR row with the in-flight messages, and what the tool calls whose results
        are among them changed in the session's state: their results are stored, so a continue
        does not run them again, and their changes must not be lost either. Their content cannot
        fail the write (`Message.to_row` makes it storable); if the database refuses them anyway,
        the run still goes to ERROR, without them (and without their changes: a continue runs
        those calls again), and the error says so: never left RUNNING for the sweeper."""

        def fail(inflight: list[Message], error: dict[str, str]) -> RunRecord | None:
            return retry_transient(
                lambda: self.store.fail(
                    run_id,
                    epoch=flight.epoch,
                    owner=flight.owner or None,
                    error=error,
                    inflight=inflight,
                    system_message=flight.system_message,
                    state_changes=flight.changes_of(inflight),
                    definition_hash=flight.definition_hash,
                ),
                landed=lambda: None,  # a failed fail() left the run RUNNING at this epoch; the move is guarded
                within=self.settings.lease_seconds,
                what=f"run {run_id} failure handler",
            )

        try:
            return fail(flight.messages, error)
        except Exception as exc:
            if not flight.messages or is_transient(exc):  # down, not refusing: keep them in flight
                raise
            why = error_record(exc)
            log.error("run %s: the in-flight messages could not be stored (%s); failing without them", run_id, why)
            lost = f" [{len(flight.messages)} in-flight message(s) could not be stored: {why['message']}]"
            return fail([], {**error, "message": error["message"] + lost})

    def _paused(self, claim: Claim) -> None:
        """A step paused its run: free its place among its key's runs, unless a decision resumed it
        since (a resumed run that took its place again keeps it). Its teams moved with the pause."""
        if self.settings.max_runs_per_key is None:
            return
        record = self.store.get_record(claim.run_id)
        if record.status == RunStatus.PAUSED:
            self.admission.release(record)

    def after_final(self, run_id: str, record: RunRecord | None = None) -> None:
        """Called when a run reaches ERROR: it frees its place among its key's runs and gives the
        next run of its session its turn, and a member that failed moves its team (a completed
        member fans in with its final commit instead). `record`, the run as just committed,
        saves reading it again."""
        record = record or self.store.get_record(run_id)
        self.admission.release(record)
        team = delegation.after_member_final(
            self.store, run_id, publish_grace=self.settings.publish_grace_seconds, record=record
        )
        if team is not None:
            self.admission.turn(team)  # a team its member's failure stopped
        if (step := delegation.wake_step(team)) is not None:
            self.publish(step)
