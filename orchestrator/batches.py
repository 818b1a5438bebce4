"""Many runs continued or cancelled at once: which runs, and what was done to each, on its own.

A batch names its runs by id (at most BATCH_MAX), or by a filter with a status (`status="ERROR"`,
and the other filters `Client.list_runs` takes), which selects a page of at most BATCH_MAX of the
top-level runs it matches, newest first, with the cursor of the next page: never every run by
accident, and never more than a bound a request can answer in time.

Each run is acted on alone, as `Client.continue_run` and `Client.cancel` act on one: a run refused
(its status does not allow it, it is another user's, it is gone) is reported with the error's
type and text, and the others go on. A refusal that is not Ratchet's own (a database error) is
reported by its type only, and logged with its text.

A batch continue resumes runs in place only: an ERROR run, and a RUNNING one whose worker died.
A COMPLETED run is refused, since its continue forks it and asks the model again (continue it on
its own to fork it), and so is a PAUSED one, whose continue needs a person's decisions. A QUEUED
or WAITING run is going already: reported as it is, as a continue of one leaves it. A run a
deploy stopped (DefinitionChangedError) is continued as any ERROR run, and while no live worker
serves its definition stops again the same way: `ok` says the continue was done, not that the
run will finish (a batch takes no `accept_definition`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Literal, TypedDict

from orchestrator import validation
from orchestrator.control import RunControl
from orchestrator.errors import InvalidInputError, RatchetError, RunNotContinuableError, RunNotFoundError
from orchestrator.run import RunPage, RunRecord
from orchestrator.status import RunStatus
from orchestrator.store import Store

log = logging.getLogger("ratchet.control")
S = RunStatus
#: The most runs one batch acts on: ids given, or a filter's page.
BATCH_MAX = 100
Action = Literal["continue", "cancel"]
#: A time a filter takes: UNIX seconds, a datetime, ISO 8601 text, or how long ago ("6h").
Moment = float | datetime | str


class Selection(TypedDict, total=False):
    """The runs a batch acts on when no ids are given: a filter as `Client.list_runs` takes it,
    with a status; `limit` (1 to BATCH_MAX, default BATCH_MAX) and `cursor` (a batch's
    `next_cursor`) page through what it matches."""

    status: RunStatus | str | Sequence[RunStatus | str]
    agent: str
    session_id: str
    user_id: str
    since: Moment
    until: Moment
    limit: int
    cursor: str


@dataclass(frozen=True, kw_only=True)
class RunActed:
    """What a batch did to one run."""

    run_id: str
    #: Whether the continue or cancel was done (or found done: a run cancelled already, a run going already).
    ok: bool
    #: The run's status afterwards (None for a run this database does not hold, or the caller may not reach).
    status: RunStatus | None = None
    #: Why it was refused: the error's type name ("RunNotContinuableError") and its text.
    error: str | None = None
    reason: str | None = None


@dataclass(frozen=True, kw_only=True)
class Batch:
    """What a batch continue or cancel did, run by run, in the order the runs were named (a
    filter's: newest first)."""

    action: Action
    results: list[RunActed] = field(default_factory=list)
    #: A filter matched more runs than the batch took: pass it as `cursor` for the next ones.
    next_cursor: str | None = None

    @property
    def done(self) -> list[str]:
        """The runs continued or cancelled."""
        return [r.run_id for r in self.results if r.ok]

    @property
    def refused(self) -> list[RunActed]:
        """The runs refused, each with why."""
        return [r for r in self.results if not r.ok]


def named(
    run_ids: Sequence[str] | None, selection: Selection, list_runs: Callable[..., RunPage]
) -> tuple[list[str], str | None]:
    """The runs a batch acts on: the ids given (repeats dropped), or the page of runs the
    selection matches, with the cursor of the next page. InvalidInputError, and nothing done,
    for both or neither, a filter without a status, or more than BATCH_MAX runs."""
    if run_ids is not None and selection:
        raise InvalidInputError("give run ids or a filter, not both")
    if run_ids is not None:
        ids = list(dict.fromkeys([run_ids] if isinstance(run_ids, str) else run_ids))
        if not ids:
            raise InvalidInputError("no run ids given: name at least one run, or give a filter with a status")
        if len(ids) > BATCH_MAX:
            raise InvalidInputError(f"{len(ids)} run ids given; a batch takes at most {BATCH_MAX}: split them")
        return ids, None
    if not validation.statuses(selection.get("status")):
        raise InvalidInputError(
            "name the runs: run ids, or a filter with a status (status=ERROR, say), never every run at once"
        )
    limit = selection.get("limit", BATCH_MAX)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= BATCH_MAX:
        raise InvalidInputError(f"limit is {limit!r}: a batch takes a whole number of runs from 1 to {BATCH_MAX}")
    page = list_runs(**{**selection, "limit": limit})
    return [r.run_id for r in page.runs], page.next_cursor


def act(
    control: RunControl,
    store: Store,
    action: Action,
    run_ids: Sequence[str],
    *,
    next_cursor: str | None = None,
    reaches: Callable[[RunRecord], bool] = lambda record: True,
) -> Batch:
    """Continue or cancel each of `run_ids` (`named`) on its own; `reaches`: whether the caller
    may act on a run (one it may not is refused as unknown, as a run of another user is for a
    user's token)."""
    results: list[RunActed] = []
    for given in run_ids:
        try:
            run_id = validation.known_run_id(given)
            record = store.get_record(run_id)
            if not reaches(record):
                raise RunNotFoundError(f"no run with run_id {run_id!r} in this database")
            status = _continue(control, record) if action == "continue" else control.cancel(run_id).status
            results.append(RunActed(run_id=run_id, ok=True, status=status))
        except RatchetError as exc:
            results.append(RunActed(run_id=given, ok=False, error=type(exc).__name__, reason=str(exc)))
        except Exception as exc:  # the database or the broker: this run's outcome, not the batch's
            log.exception("a batch %s of run %s failed", action, given)
            reason = "an unexpected error; the server's log has its text"
            results.append(RunActed(run_id=given, ok=False, error=type(exc).__name__, reason=reason))
    return Batch(action=action, results=_with_statuses(store, results), next_cursor=next_cursor)


def _continue(control: RunControl, record: RunRecord) -> RunStatus | None:
    """Continue one run of a batch in place (see above); its status after, read with the others."""
    if record.status == S.COMPLETED:
        raise RunNotContinuableError(
            f"run {record.run_id} is COMPLETED: a continue would fork it and ask the model again; a batch "
            "continues runs in place only (continue it on its own to fork it)"
        )
    if record.status == S.PAUSED:
        raise RunNotContinuableError(
            f"run {record.run_id} is PAUSED: it goes on once a person decides what it asks (GET /approvals, "
            "`ratchet pending`), which a batch does not"
        )
    control.continue_run(record.run_id)
    return None


def _with_statuses(store: Store, results: list[RunActed]) -> list[RunActed]:
    """Each run's status now (one read for the batch), for the runs a continue left unread, and
    for refused runs the caller may reach."""
    unread = [r.run_id for r in results if r.status is None and r.error != RunNotFoundError.__name__]
    if not unread:
        return results
    found = store.statuses(unread)
    return [r if r.status is not None or r.run_id not in found else replace(r, status=found[r.run_id]) for r in results]
