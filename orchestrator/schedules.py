"""Schedules: an agent run on a cron schedule in a time zone, one run per tick.

A schedule (`ratchet_schedules`, `store/schedule_rows.py`) names an agent, an input, a cron
expression read in an IANA time zone (`orchestrator.cron`: the fields, and what a clock change
does), and optionally a session (every run of the schedule goes on the same conversation) and a
user. It is created, listed and deleted through `Client.schedule`, `Client.schedules` and
`Client.unschedule`, `ratchet schedule add|list|rm`, and the API's `/schedules`.

Firing: every sweeper pass (`Sweeper.sweep_once`: the workers' sweeper, or beat's
`ratchet.sweep`, or `ratchet sweep`) fires the schedules whose next tick (`next_at`) passed, so
a tick fires within one RATCHET_SWEEP_SECONDS of its time while anything sweeps.

Exactly one run per tick: the run's id is derived from the schedule and the tick
(`run_id_for`: "<schedule id>:<tick, UTC>"), and a start under a run id that exists, with the
same request, returns that run and publishes nothing (`orchestrator.idempotency`). The run is
started first, then the schedule moved on by one guarded UPDATE on the `next_at` read. So two
sweepers firing the same tick at once (two beats, beat and a worker) start one run between
them; a sweeper killed between the start and the move (a beat restarted mid-tick) leaves the
tick due, and the next pass starts the same run id again: the run that exists.

A tick whose start a bound on QUEUED runs refuses (QueueFullError: its agent's or user's runs
wait for workers already) is skipped, logged, and the schedule moves on to its next tick.

Missed ticks (nothing swept for a while: every worker and beat down, a database outage): the
next pass fires only the latest tick that passed, once, and skips the older ones, logged as
skipped ("skip to latest", as cron and most schedulers do): an outage of a day on an hourly
schedule starts one run, not 24. The next tick is then the first one after now.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.exc import IntegrityError

from orchestrator import catalog, cron, starting, validation
from orchestrator.errors import (
    AgentNotFoundError,
    InvalidInputError,
    QueueFullError,
    RunConflictError,
    ScheduleConflictError,
    ScheduleNotFoundError,
)
from orchestrator.idempotency import StartRequest
from orchestrator.ports import StepRef
from orchestrator.settings import Settings
from orchestrator.store import Store
from orchestrator.store.schedule_rows import Schedule
from orchestrator.store.sessions import refused

log = logging.getLogger("ratchet.schedules")

SCHEDULE_ID_MAX = 40
SCHEDULE_ID_RULE = f"1-{SCHEDULE_ID_MAX} characters of A-Z, a-z, 0-9, '.', '_' and '-'"
_SCHEDULE_ID = re.compile(rf"[A-Za-z0-9._-]{{1,{SCHEDULE_ID_MAX}}}")
#: How a tick is written in a run id: UTC, to the minute.
TICK_FORMAT = "%Y%m%dT%H%MZ"


@dataclass(frozen=True, kw_only=True)
class Fired:
    """One tick a pass fired: the schedule, the tick (UNIX seconds), its run, and whether older
    ticks that passed unfired were skipped (the missed-tick policy)."""

    schedule_id: str
    tick: float
    run_id: str
    skipped_older: bool


def schedule_id(value: object) -> str:
    """A schedule id as given, or InvalidInputError naming the rule."""
    if not isinstance(value, str) or _SCHEDULE_ID.fullmatch(value) is None:
        raise InvalidInputError(f"schedule_id {value!r} is not a valid schedule id: use {SCHEDULE_ID_RULE}")
    return value


def run_id_for(schedule: str, tick: float) -> str:
    """The id of the run a schedule's tick starts: the same for every sweeper that fires it."""
    return f"{schedule}:{dt.datetime.fromtimestamp(tick, dt.UTC).strftime(TICK_FORMAT)}"


def create(
    store: Store,
    agent: str,
    *,
    cron_text: str,
    timezone: str,
    input: str,
    session_id: str | None = None,
    user_id: str | None = None,
    new_id: str | None = None,
) -> Schedule:
    """Check and store a schedule; its first tick is the first after now. InvalidInputError for
    an argument that cannot be taken, ScheduleConflictError if `new_id` is taken. Refused before
    anything is written, as each tick's start would fail: AgentNotFoundError for an agent that
    nothing here defines and no worker ever served (`catalog.known`), SessionOwnedError for a
    session of another user than `user_id`."""
    expression, tz = cron.parse(cron_text), cron.zone(timezone)
    now = store.clock()
    schedule = Schedule(
        schedule_id=schedule_id(new_id) if new_id is not None else f"sch-{uuid.uuid4().hex[:12]}",
        agent_name=validation.agent_name(agent),
        cron=expression.text,
        timezone=timezone,
        input=validation.input_text(input),
        session_id=None if session_id is None else validation.session_id(session_id),
        user_id=None if user_id is None else validation.user_id(user_id),
        created_at=now,
        next_at=cron.next_tick(expression, tz, now),
    )
    _runnable(store, schedule)
    try:
        store.schedules.add(schedule)
    except IntegrityError:
        raise ScheduleConflictError(
            f"schedule {schedule.schedule_id} exists already: delete it first (ratchet schedule rm), or give another id"
        ) from None
    return schedule


def _runnable(store: Store, schedule: Schedule) -> None:
    """Refuse a schedule whose every tick would start a run that fails or is refused: an agent
    nothing serves (a run erroring under a made-up name each tick), or a session another user
    owns (a session is its first run's user's: each tick would be SessionOwnedError)."""
    if not catalog.known(store, schedule.agent_name):
        raise AgentNotFoundError(
            f"no agent or team named {schedule.agent_name!r} is known here: no module this process imported defines "
            "it and no worker has served it (`ratchet agents` lists those that have); start a worker whose module "
            "defines it, then add the schedule; nothing was written"
        )
    if schedule.session_id is not None:
        session = store.get_session(schedule.session_id)
        if session is not None and session.user_id != schedule.user_id:
            raise refused(schedule.session_id)


def delete(store: Store, schedule: str) -> None:
    """Delete a schedule (the runs it started stay); ScheduleNotFoundError if there is none."""
    if not store.schedules.delete(schedule_id(schedule)):
        raise ScheduleNotFoundError(f"no schedule {schedule!r}: `ratchet schedule list` shows them")


def fire(
    store: Store, settings: Settings, publish: Callable[[StepRef], None], schedule: Schedule, *, now: float
) -> Fired | None:
    """Fire the latest tick of `schedule` that passed by `now` (skipping older ones): write its
    run as a start would (`orchestrator.starting`) and `publish` its first step, then move the
    schedule on to its first tick after `now`. None if another sweeper moved it on first."""
    expression, tz = cron.parse(schedule.cron), cron.zone(schedule.timezone)
    tick = cron.latest_tick(expression, tz, now, not_before=schedule.next_at) or schedule.next_at
    run_id = run_id_for(schedule.schedule_id, tick)
    request = StartRequest.checked(
        agent=schedule.agent_name,
        input=schedule.input,
        session_id=schedule.session_id,
        user_id=schedule.user_id,
        stream=False,
        priority=None,
        session_state=None,
    )
    try:
        record = starting.write(store, settings, request, run_id)
    except RunConflictError as exc:  # a run of another request holds the id (a schedule deleted and made again)
        log.warning("schedule %s: tick %s not started: %s", schedule.schedule_id, run_id, exc)
        record = None
    except QueueFullError as exc:  # the agent's (or user's) runs wait already: this tick is skipped, not piled on
        log.warning("schedule %s: tick %s skipped: %s", schedule.schedule_id, run_id, exc)
        record = None
    if record is not None:  # None: this tick's run exists (another sweeper, or a pass cut short)
        publish(starting.first_step(store, settings, record))
    following = cron.next_tick(expression, tz, max(now, tick))
    moved = store.schedules.advance(
        schedule.schedule_id, read_next_at=schedule.next_at, next_at=following, tick=tick, run_id=run_id
    )
    if not moved:
        return None
    skipped = tick > schedule.next_at
    if skipped:
        log.warning(
            "schedule %s: ticks from %s to before %s were missed (nothing swept); fired the latest only",
            schedule.schedule_id,
            run_id_for(schedule.schedule_id, schedule.next_at),
            run_id,
        )
    return Fired(schedule_id=schedule.schedule_id, tick=tick, run_id=run_id, skipped_older=skipped)


__all__ = ["Fired", "Schedule", "create", "delete", "fire", "run_id_for", "schedule_id"]
