"""How the `ratchet` command ends: its exit status, and what it says when it fails.

    0    it did what was asked
    1    a runtime failure: what was asked is well formed, and could not be done
    2    a usage error: what was asked cannot be taken as given; nothing was done
    75   try again later (EX_TEMPFAIL): a start refused because its agent's or user's runs wait
         already (QueueFullError); nothing was done
    130  interrupted (Ctrl-C); 141: stdout's reader went away, as a shell reports SIGPIPE

`status_of` is the one place that maps an error to its status; `report` prints it: one line,
`ratchet: error: ...`, on stderr, or with --json the HTTP API's error body, `{"detail": ...,
"error": {"type": ..., "message": ...}}` (`detail` the message again, and `run_id` in `error`
where a run is concerned), on stderr as well: stdout holds only what a command answers. An
error that is none of these (a fault of Ratchet's) keeps its traceback, and Python's status, 1.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy.exc import InterfaceError, OperationalError

from orchestrator.errors import (
    ConfigurationError,
    DecisionConflictError,
    DecisionKindError,
    PausedToolChangedError,
    QueueFullError,
    RatchetError,
)

OK, FAILURE, USAGE = 0, 1, 2
#: sysexits.h's EX_TEMPFAIL: the same command may succeed later (a start refused by a full queue).
TEMPFAIL = 75
#: The exit status when stdout's reader went away: what a shell reports for a command ended by SIGPIPE.
SIGPIPE_EXIT = 141
INTERRUPTED = 130

#: What `ratchet --help` says of the exit status, below the commands.
EPILOG = """\
exit status:
  0    success
  1    a runtime failure: no such run, session, agent or requirement (AgentNotFoundError,
       RunNotFoundError, RequirementNotFoundError, ...), a run in a state that refuses it
       (RunConflictError, RunBusyError, RunNotPausedError, ...), a decision that came second
       (DecisionConflictError) or late (DecisionExpiredError) or for a tool a deploy changed
       (PausedToolChangedError), a database or a broker that cannot be
       reached, a wait that timed out (RunWaitTimeout); and a run that ended in ERROR for the
       commands that report how a run ended (show, stream, run or continue with --wait or --stream)
  2    a usage error, and nothing was done: arguments argparse refuses, a value Ratchet cannot take
       (InvalidInputError: a malformed run id, an empty input; DecisionKindError: a decision that
       does not answer what is asked), a setting or an --app module that is wrong
       (ConfigurationError)
  75   try again later, and nothing was done: a start refused because its agent's (or its
       user's) runs already wait for workers (QueueFullError)
  130  interrupted; 141: stdout's reader went away

With --json, an error is the HTTP API's error body on stderr:
  {"detail": <message>, "error": {"type": ..., "message": <message>}}."""


class UsageError(Exception):
    """What argparse refuses, with the usage line of the (sub)command it refused."""

    def __init__(self, message: str, *, prog: str, usage: str) -> None:
        super().__init__(message)
        self.prog = prog
        self.usage = usage


class CommandFailure(Exception):
    """A runtime failure the command reports itself, typed as the HTTP API types the same
    failure: not one of Ratchet's errors (those are all in orchestrator/errors.py), only how the
    command line says one."""

    type = "CommandFailure"

    def to_record(self) -> dict[str, str]:
        return {"type": self.type, "message": str(self)}


class Refusal(CommandFailure):
    """A failure the command finds itself (a session that is not there), typed as the HTTP API
    types the same failure (`SessionNotFound`)."""

    def __init__(self, message: str, *, type: str) -> None:
        super().__init__(message)
        self.type = type


class AboutRun(CommandFailure):
    """A Ratchet error that concerns a run the command started or found: reported as that
    error, naming the run (`run_id`), so that `ratchet run --wait --json` that gives up says
    which run goes on."""

    def __init__(self, error: RatchetError, run_id: str) -> None:
        super().__init__(str(error))
        self.error = error
        self.run_id = run_id

    def to_record(self) -> dict[str, str]:
        return self.error.to_record()


class DatabaseUnavailable(CommandFailure):
    """The database cannot be reached (a connection refused, a file that cannot be opened)."""

    type = "DatabaseUnavailable"


@contextmanager
def about(run_id: str) -> Iterator[None]:
    """A Ratchet error raised inside names the run `run_id` (unless it names one already)."""
    try:
        yield
    except RatchetError as exc:
        if getattr(exc, "run_id", None) is not None:
            raise
        raise AboutRun(exc, run_id) from exc


def status_of(exc: BaseException) -> int | None:
    """The exit status for `exc`; None for an error that is a fault (its traceback is shown)."""
    if isinstance(exc, AboutRun):
        return status_of(exc.error)
    if isinstance(exc, PausedToolChangedError):  # what is served changed, not what was asked
        return FAILURE
    if isinstance(exc, UsageError | ConfigurationError | DecisionKindError):
        return USAGE
    if isinstance(exc, QueueFullError):
        return TEMPFAIL
    if isinstance(exc, RatchetError | CommandFailure | OperationalError | InterfaceError):
        return FAILURE
    return None


def _known(exc: BaseException) -> RatchetError | CommandFailure | UsageError:
    """`exc` as an error the command reports (a database's driver error as DatabaseUnavailable)."""
    if isinstance(exc, RatchetError | CommandFailure | UsageError):
        return exc
    return DatabaseUnavailable(
        f"cannot reach the database at {_database()}: {_first_line(getattr(exc, 'orig', None) or exc)}; check that "
        "it is up and that RATCHET_DATABASE_URL names it (`ratchet health --check database`)"
    )


def _database() -> str:
    """The configured database's URL, its password hidden."""
    from orchestrator.settings import Settings
    from orchestrator.store.database import shown_url

    try:
        return shown_url(Settings.from_env().database_url)
    except RatchetError:
        return "RATCHET_DATABASE_URL"


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def error_body(exc: RatchetError | CommandFailure | UsageError) -> dict[str, Any]:
    """The error as the HTTP API's error body: `{"detail": message, "error": {"type", "message", ...}}`."""
    if isinstance(exc, UsageError):
        return {"detail": str(exc), "error": {"type": "UsageError", "message": str(exc), "usage": exc.usage}}
    body: dict[str, Any] = dict(exc.to_record())
    run_id = getattr(exc, "run_id", None)
    if run_id is not None:
        body["run_id"] = run_id
    if isinstance(exc, DecisionConflictError):  # who decided first, as the HTTP API's 409 says
        body.update(decided_by=exc.decided_by, decided_at=exc.decided_at)
    return {"detail": body["message"], "error": body}


def report(exc: BaseException, *, as_json: bool) -> int | None:
    """Print `exc` on stderr and return its exit status; None (nothing printed) for a fault."""
    status = status_of(exc)
    if status is None:
        return None
    known = _known(exc)
    if as_json:
        print(json.dumps(error_body(known), ensure_ascii=True), file=sys.stderr)
    elif isinstance(known, UsageError):
        print(f"{known.usage}\n{known.prog}: error: {printable(str(known))}", file=sys.stderr)
    else:
        print(f"ratchet: error: {printable(str(known))}", file=sys.stderr)
    return status


def printable(text: str) -> str:
    """One line that any terminal encoding can print: newlines folded, and characters the
    encoding cannot take (a lone surrogate from invalid UTF-8 in argv) escaped."""
    encoding = getattr(sys.stderr, "encoding", None) or "utf-8"
    line = " ".join(text.splitlines())
    return line.encode(encoding, "backslashreplace").decode(encoding, "replace")


def wants_json(words: Sequence[str]) -> bool:
    """Whether the command line asks for JSON, as argparse reads it: `--json` before any `--`."""
    given = list(words)
    return "--json" in (given[: given.index("--")] if "--" in given else given)
