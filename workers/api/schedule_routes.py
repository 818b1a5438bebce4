"""The HTTP API's routes on schedules: agents run on a cron schedule (`orchestrator.schedules`).

    POST   /schedules                  store a schedule (201), with its first tick
    GET    /schedules                  every schedule (a user's token: its own), by id
    DELETE /schedules/{schedule_id}    delete one (the runs it started stay)

The sweeper fires the ticks; these routes only write and read the rows. A user's token creates
schedules for itself only, lists its own, and deletes its own: another user's is answered as an
unknown one (404), as a run is.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query
from pydantic import BaseModel, ConfigDict, Field

from orchestrator import schedules
from orchestrator import validation as v
from orchestrator.errors import ScheduleNotFoundError
from orchestrator.store.schedule_rows import Schedule
from workers.api.access import CallerDep, listed_user, starting_user
from workers.api.contract import INPUT_TEXT, name, pattern, refusals, text
from workers.api.deps import ClientDep, token_router

router = token_router()

#: A schedule id as the schema states it: the rule `schedules.schedule_id` checks.
SCHEDULE_ID = pattern(rf"^[A-Za-z0-9._-]{{1,{schedules.SCHEDULE_ID_MAX}}}$")
ScheduleId = Annotated[str, Path(description="a schedule's id"), text(SCHEDULE_ID)]


class ScheduleRequest(BaseModel):
    """The body of `POST /schedules`."""

    model_config = ConfigDict(extra="forbid")

    agent: str = Field(description="the agent or team each tick runs", json_schema_extra=name(v.AGENT_NAME_MAX))
    cron: str = Field(
        description='five fields, like "0 9 * * mon-fri", or @hourly, @daily, @weekly, @monthly, @yearly',
        json_schema_extra=name(128),
    )
    input: str = Field(description="the user message each run starts with", json_schema_extra=INPUT_TEXT)
    timezone: str = Field(
        default="UTC", description="the IANA zone the cron is read in, like Europe/Paris", json_schema_extra=name(64)
    )
    session_id: str | None = Field(
        default=None, description="every run in this session (default: a new one each)", json_schema_extra=name(128)
    )
    user_id: str | None = Field(
        default=None, description="who the runs are for (a user's token: its own)", json_schema_extra=name(128)
    )
    schedule_id: str | None = Field(
        default=None,
        description=f"the schedule's id: {schedules.SCHEDULE_ID_RULE} (default: a new one)",
        json_schema_extra=SCHEDULE_ID,
    )


class ScheduleBody(BaseModel):
    """A schedule as stored."""

    schedule_id: str
    agent_name: str
    cron: str
    timezone: str
    input: str
    session_id: str | None
    user_id: str | None
    created_at: float = Field(description="UNIX seconds")
    next_at: float = Field(description="the next tick due (UNIX seconds)")
    last_tick: float | None = Field(description="the last tick fired (UNIX seconds)")
    last_run_id: str | None = Field(description='the run of the last tick fired: "<schedule_id>:<tick, UTC>"')

    @classmethod
    def of(cls, schedule: Schedule) -> ScheduleBody:
        return cls(**schedule.to_dict())


class ScheduleList(BaseModel):
    """The answer of `GET /schedules`."""

    schedules: list[ScheduleBody] = Field(description="by id")


@router.post(
    "/schedules",
    operation_id="createSchedule",
    summary="Run an agent on a cron schedule",
    status_code=201,
    response_model=ScheduleBody,
    tags=["schedules"],
    responses=refusals(401, 404, 409, 422),
)
def create_schedule(body: ScheduleRequest, client: ClientDep, caller: CallerDep) -> ScheduleBody:
    """Store a schedule; its first tick is the first after now. 404 for an agent nothing here
    serves (as `POST /runs`), 409 if `schedule_id` is taken or `session_id` is another user's,
    422 for a cron, zone or input that cannot be taken (the message says which field)."""
    made = client.schedule(
        body.agent,
        cron=body.cron,
        input=body.input,
        timezone=body.timezone,
        session_id=body.session_id,
        user_id=starting_user(caller, body.user_id),
        schedule_id=body.schedule_id,
    )
    return ScheduleBody.of(made)


@router.get(
    "/schedules",
    operation_id="listSchedules",
    summary="List the schedules",
    response_model=ScheduleList,
    tags=["schedules"],
    responses=refusals(401, 422),
)
def list_schedules(
    client: ClientDep,
    caller: CallerDep,
    user_id: Annotated[str | None, Query(description="this user's schedules"), text(name(v.USER_ID_MAX))] = None,
) -> ScheduleList:
    """Every schedule (of `user_id`; a user's token: its own), with its next tick and last run."""
    found = client.schedules(user_id=listed_user(caller, user_id))
    return ScheduleList(schedules=[ScheduleBody.of(s) for s in found])


@router.delete(
    "/schedules/{schedule_id}",
    operation_id="deleteSchedule",
    summary="Delete a schedule",
    status_code=204,
    tags=["schedules"],
    responses=refusals(401, 404, 422),
)
def delete_schedule(schedule_id: ScheduleId, client: ClientDep, caller: CallerDep) -> None:
    """Delete a schedule: no pass that starts afterwards fires it; the runs it started stay."""
    found = client.store.schedules.get(schedules.schedule_id(schedule_id))
    if found is None or not (caller.admin or caller.sees(found.user_id)):
        raise ScheduleNotFoundError(f"no schedule {schedule_id!r}: GET /schedules lists them")
    client.unschedule(schedule_id)
