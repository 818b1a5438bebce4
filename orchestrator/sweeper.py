"""The sweeper: recovers what Celery cannot — killed workers, hard time limits, lost messages.

One pass (`Sweeper.sweep_once`, run by the workers' sweeper under the fleet's sweep lease
(`orchestrator.sweeping`), by beat's `ratchet.sweep` where beat runs, and by `ratchet sweep`):

- first, a run still going (or PAUSED) past its own deadline (`run_timeout=`) is stopped, with
  every run under it that has not ended, in ERROR with RunTimeoutError, each step in progress
  fenced (`orchestrator.deadlines.stop`), so that nothing below requeues or republishes it;
- a RUNNING run whose lease expired (its worker died, froze, or hit the hard limit) goes back to
  QUEUED with a new epoch, which fences the old holder, and its step is published again; after
  RATCHET_MAX_STEP_ATTEMPTS claims of the same step it goes to ERROR as a poison step instead;
- a QUEUED run whose step was not claimed by its `publish_after` time (a crash between commit
  and publish, a message the broker lost, a retry parked longer than a countdown may wait, a
  broker that was down at enqueue) is published again;
- a WAITING team whose members have all ended (or one failed) but whose fan-in never ran (a
  worker killed between a member's ERROR row and the fan-in) is fanned in now;
- a PAUSED run's requirement whose deadline passed (`pause_timeout=`) gets its `on_timeout`
  policy (`orchestrator.deadlines`): rejected or approved (the run resumes once nothing of it is
  pending), its tree cancelled, or the run in ERROR. So a deadline acts within one sweep interval
  (RATCHET_SWEEP_SECONDS) of passing, whether or not anyone continues the run;
- with RATCHET_MAX_RUNS_PER_KEY set, a place among a key's runs still held by a run that ended
  (its release could not reach the limiter's Redis, or its worker died between the final commit
  and the release) is freed, and given to the run waiting for it: within a sweep of Redis
  answering again, not RATCHET_RUN_SLOT_SECONDS later. The limiter lists the places, the store
  says which runs ended; a place renewed since it was listed is kept (a run continued meanwhile),
  and one whose run this database does not hold is left to expire (a Redis may serve several);
- a run of a serialized session whose turn came but was not given (`orchestrator.store.turns`:
  the process that stopped the run ahead of it died before it woke the session, or the run
  stopped outside a step, in a team's fan-in) is given its turn and its step published;
- a schedule whose next tick passed starts the run of its latest tick, its id derived from the
  schedule and the tick, so two sweepers at once start one (`orchestrator.schedules`).
- the webhook deliveries due (a run's stop, a retry whose backoff passed) are POSTed, one at a
  time, at most `webhooks.BATCH` a pass, each bounded by RATCHET_WEBHOOK_TIMEOUT_SECONDS
  (`orchestrator.webhooks`). Steps never wait for them: only the sweeper's pass does.

Every write is a guarded move, so two sweepers at once, or a sweeper racing a worker, are safe.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, fields

from orchestrator import schedules
from orchestrator.agent import get_agent
from orchestrator.deadlines import fire, stop
from orchestrator.delegation import fan_in_now, wake_step
from orchestrator.errors import PoisonStepError
from orchestrator.ports import Limiter, Place
from orchestrator.requirements import RunRequirement
from orchestrator.routing import owed, step_of
from orchestrator.run import RunRecord
from orchestrator.status import RunStatus
from orchestrator.steps import StepRunner
from orchestrator.store.schedule_rows import Schedule
from orchestrator.untrusted import storable_text
from orchestrator.webhooks import deliver_due

log = logging.getLogger("ratchet.sweeper")
S = RunStatus


@dataclass
class SweepReport:
    """What one pass did (run ids)."""

    requeued: list[str] = field(default_factory=list)
    republished: list[str] = field(default_factory=list)
    poisoned: list[str] = field(default_factory=list)
    #: Teams left WAITING by a crash after their members ended, moved on (QUEUED or ERROR).
    fanned_in: list[str] = field(default_factory=list)
    #: Runs that had ended and still held a place among their key's runs, now freed.
    freed: list[str] = field(default_factory=list)
    #: Requirements whose deadline passed and whose on_timeout policy acted (requirement ids).
    timed_out: list[str] = field(default_factory=list)
    #: Runs stopped by their own deadline (run_timeout), each with its tree (the top runs' ids).
    stopped: list[str] = field(default_factory=list)
    #: Runs of serialized sessions given the turn a stopped run's waker did not give.
    turns: list[str] = field(default_factory=list)
    #: Runs started by schedules whose tick passed (run ids: "<schedule id>:<tick>").
    scheduled: list[str] = field(default_factory=list)
    #: Webhook deliveries tried (delivered, failed or to be tried again).
    webhooks: int = 0
    #: Runs whose handling raised (logged with the error); the next pass tries them again.
    failed: list[str] = field(default_factory=list)

    def acted(self) -> dict[str, list[str]]:
        """What the pass acted on, by kind (every list above, in its order), for the programs
        that report a pass: `ratchet sweep`, beat's `ratchet.sweep` task."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "webhooks"}

    def __bool__(self) -> bool:
        done = (self.requeued, self.republished, self.poisoned, self.fanned_in, self.freed, self.timed_out)
        return any(done) or bool(self.stopped or self.scheduled or self.turns or self.failed)


class Sweeper:
    """Finds stuck runs and moves them on."""

    def __init__(self, runner: StepRunner) -> None:
        self.runner = runner
        self.store = runner.store
        self.settings = runner.settings

    def sweep_once(self) -> SweepReport:
        """One pass over expired leases, due QUEUED runs, teams whose fan-in a crash left undone,
        pause deadlines that passed and schedules due.

        Each run is handled on its own: one that raises (a database error on its row, an agent
        that fails to load) is logged with its run id and the pass goes on with the others."""
        report = SweepReport()
        now = self.store.clock()
        for record in self.store.endings.past_deadline(now):  # first: what it stops is not taken back below
            self._each(report, record.run_id, self._stop, record)
        expired, due = self.store.due_runs(now=now)
        for record in expired:
            self._each(report, record.run_id, self._expired, record)
        for record in due:
            if record.next_step is not None:
                self._each(report, record.run_id, self._due, record)
        for team_id in self.store.teams.to_fan_in():
            self._each(report, team_id, self._fan_in, team_id)
        for requirement in self.store.requirements.due(now):
            self._each(report, requirement.run_id, self._deadline, requirement)
        for session_id in self.store.turns.owed():
            self._each(report, session_id, self._turn, session_id)
        self._free_places(report)
        for schedule in self.store.schedules.due(now):
            self._each(report, schedule.schedule_id, self._schedule, schedule, now)
        try:
            report.webhooks = deliver_due(self.store, self.settings)
        except Exception:
            log.exception("sweep: webhook deliveries could not be read or settled; the next pass tries again")
        if report:
            log.info(
                "sweep: requeued %s, republished %s, poisoned %s, fanned in %s, freed %s, timed out %s, "
                "stopped %s, scheduled %s, turns %s, failed %s",
                report.requeued,
                report.republished,
                report.poisoned,
                report.fanned_in,
                report.freed,
                report.timed_out,
                report.stopped,
                report.scheduled,
                report.turns,
                report.failed,
            )
        return report

    @staticmethod
    def _each(report: SweepReport, run_id: str, handle: Callable[..., None], *args: object) -> None:
        try:
            handle(report, *args)
        except Exception:
            report.failed.append(run_id)
            log.exception("sweep: run %s could not be handled; the next pass tries again", run_id)

    def _stop(self, report: SweepReport, record: RunRecord) -> None:
        """A run past its deadline: it and its tree in ERROR, each followed up as any run that
        ends (its place among its key's runs freed)."""
        stopped = stop(self.store, record)
        if not stopped:
            return
        log.warning(
            "run %s: passed its deadline; stopped in ERROR with %d run(s) of its tree", record.run_id, len(stopped)
        )
        report.stopped.append(record.run_id)
        for ended in stopped:
            self.runner.after_final(ended.run_id, ended)

    def _expired(self, report: SweepReport, record: RunRecord) -> None:
        """A RUNNING run whose lease expired: back to QUEUED with a new epoch, or a poison step."""
        if record.attempts >= self.settings.max_step_attempts:
            error = PoisonStepError(
                f"step {record.seq} ({record.next_step}) was claimed {record.attempts} times and never finished: "
                "its worker died each time (killed, out of memory, or past the hard time limit). "
                "Fix the cause, then continue the run."
            )
            failed = self.store.fail(
                record.run_id, epoch=record.epoch, error=error.to_record(), system_message=self._system(record)
            )
            if failed is not None:
                report.poisoned.append(failed.run_id)
                self.runner.after_final(failed.run_id, failed)
            return
        moved = self.store.move(
            record.run_id,
            src=(S.RUNNING,),
            dst=S.QUEUED,
            epoch=record.epoch,
            bump_epoch=True,
            event="lease_expired",
            lease_owner=None,
            lease_expires_at=None,
            publish_grace=self.settings.publish_grace_seconds,
        )
        if moved is not None:
            report.requeued.append(moved.run_id)
            self.runner.publish(step_of(moved, calls=owed(self.store, moved.run_id)))

    def _due(self, report: SweepReport, record: RunRecord) -> None:
        """A QUEUED step nobody claimed in time: publish it again."""
        if self.store.mark_due(record.run_id, epoch=record.epoch, publish_grace=self.settings.publish_grace_seconds):
            report.republished.append(record.run_id)
            self.runner.publish(step_of(record, calls=owed(self.store, record.run_id)))

    def _fan_in(self, report: SweepReport, team_id: str) -> None:
        """A WAITING team whose members all ended: the fan-in a crash left undone."""
        team = fan_in_now(self.store, team_id, publish_grace=self.settings.publish_grace_seconds)
        if team is None:
            return
        log.warning("run %s: finished a fan-in a crash left undone (now %s)", team.run_id, team.status)
        report.fanned_in.append(team.run_id)
        if (step := wake_step(team)) is not None:
            self.runner.publish(step)

    def _deadline(self, report: SweepReport, requirement: RunRequirement) -> None:
        """A pause's deadline passed: its policy acts (`deadlines.fire`), then the run it queued
        is published and the runs it ended are followed up as any run that ends."""
        fired = fire(self.store, requirement, publish_grace=self.settings.publish_grace_seconds)
        if fired is None:
            return
        log.info("run %s: requirement %s's deadline passed: %s", requirement.run_id, requirement.id, fired.policy)
        report.timed_out.append(requirement.id)
        if fired.resumed is not None:
            self.runner.publish(step_of(fired.resumed, calls=owed(self.store, fired.resumed.run_id)))
        for ended in fired.ended:
            self.runner.after_final(ended.run_id, ended)

    def _turn(self, report: SweepReport, session_id: str) -> None:
        """A run that stopped is still marked as one a run of its session waits behind: the
        turn its stopper did not give (it died after the move, or a stop made outside a step)."""
        woken = self.store.turns.wake_session(session_id, publish_grace=self.settings.publish_grace_seconds)
        if woken is not None:
            log.warning(
                "session %s: run %s takes the turn a stopped run's waker did not give", session_id, woken.run_id
            )
            report.turns.append(woken.run_id)
            self.runner.publish(step_of(woken))

    def _schedule(self, report: SweepReport, schedule: Schedule, now: float) -> None:
        """A schedule whose next tick passed: the run of its latest tick, started once."""
        fired = schedules.fire(self.store, self.settings, self.runner.publish, schedule, now=now)
        if fired is not None:
            report.scheduled.append(fired.run_id)

    def _free_places(self, report: SweepReport) -> None:
        """The places among their key's runs that runs which ended still hold: freed."""
        if self.settings.max_runs_per_key is None:
            return
        limiter = self.runner.admission.limiter
        try:
            places = limiter.held()
            statuses = self.store.statuses(sorted({p.run_id for p in places})) if places else {}
        except Exception:
            log.exception("sweep: could not check the places held among keys' runs; the next pass tries again")
            return
        for place in places:
            status = statuses.get(place.run_id)
            if status is not None and status.is_final:
                self._each(report, place.run_id, self._free, limiter, place)

    def _free(self, report: SweepReport, limiter: Limiter, place: Place) -> None:
        assert self.settings.max_runs_per_key is not None
        freed, step = limiter.free(place, self.settings.max_runs_per_key)
        if not freed:
            return
        log.warning("run %s: had ended and still held a place among the runs of its key; freed", place.run_id)
        report.freed.append(place.run_id)
        if step is not None:
            self.runner.publish(step)

    @staticmethod
    def _system(record: RunRecord) -> str | None:
        """The system message a poison step's first model call would have stored, if any."""
        if record.system_message is not None:
            return None  # stored already
        try:
            text = get_agent(record.agent_name).render_system_message()
            return storable_text(text) if text is not None else None
        except Exception:  # an agent that cannot render must not keep its run out of ERROR
            log.warning("run %s: could not render the system message of %s", record.run_id, record.agent_name)
            return None
