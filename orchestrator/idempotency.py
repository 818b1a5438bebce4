"""One key, one request: a start sent again under a run id that exists.

Every producer can send a start again under the same run id: a retried `Client.start` or
`ratchet run --run-id`, a redelivered `ratchet.start_run` task, an HTTP client repeating its
`Idempotency-Key` (from which the API derives the run id). The same request again is the same
start: the run is returned, nothing is published and the session's state is not merged again.
Any other request under that id is RunConflictError saying what differs: a reused key never
quietly returns a run its caller did not ask for.

What a start asks for is compared with what the run's row holds: its user, always (no user_id
is a user too), and a run of another user is named by nothing but its id, so a key or run id
that leaks shows nothing of the run; its agent, stream flag, priority and webhook, and its
run_timeout when the repeat gives one; its session when the repeat names one (a first start
that named no session got a new one, whose id its caller may never have seen); and
`request_digest`, a SHA-256
of the input and the session_state, which the row does not keep as given (the input is its
first message, the state was merged into the session's). A run whose row has no digest (written
before migration 0012, or not by a start: a fork, a team's member) is compared by its input.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator import validation
from orchestrator.run import RunRecord


@dataclass(frozen=True, kw_only=True)
class StartRequest:
    """What one start asks for, its arguments checked already (`orchestrator.validation`)."""

    agent: str
    input: str
    session_id: str | None = None
    user_id: str | None = None
    stream: bool = False
    priority: int | None = None
    session_state: Mapping[str, Any] | None = None
    #: Checked by the caller (`webhooks.check_url`, which needs the settings).
    webhook: str | None = None
    #: The run's deadline in seconds, as given (None: its agent's, if it has one).
    run_timeout: float | None = None

    @classmethod
    def checked(
        cls,
        *,
        agent: str,
        input: str,
        session_id: str | None,
        user_id: str | None,
        stream: bool,
        priority: int | None,
        session_state: Mapping[str, Any] | None,
        webhook: str | None = None,
        run_timeout: object = None,
    ) -> StartRequest:
        """A producer's start, each argument checked at the door (InvalidInputError)."""
        return cls(
            agent=validation.agent_name(agent),
            input=validation.input_text(input),
            session_id=None if session_id is None else validation.session_id(session_id),
            user_id=None if user_id is None else validation.user_id(user_id),
            stream=validation.flag(stream, what="stream"),
            priority=None if priority is None else validation.priority(priority),
            session_state=None if session_state is None else validation.session_state(session_state),
            webhook=webhook,
            run_timeout=None if run_timeout is None else validation.run_timeout(run_timeout),
        )

    @property
    def digest(self) -> str:
        """SHA-256 (hex) of the input and the session_state: an empty state is no state, as the
        store merges it (keys sorted: the same object in another order is the same request)."""
        given = {"input": self.input, "session_state": dict(self.session_state or {}) or None}
        return hashlib.sha256(json.dumps(given, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def conflict(self, run: RunRecord, first_input: Callable[[], str | None]) -> str | None:
        """Why this request is not the one that started `run` (None: it is the same start).
        `first_input` reads the run's input; it is called only when the digest cannot tell."""
        if run.user_id != self.user_id:  # another user's run (no user is a user): nothing of it is said
            return f"run_id {run.run_id!r} is taken by another run; this run needs a run_id of its own"
        if run.agent_name != self.agent or self.session_id not in (None, run.session_id):
            where = "" if self.session_id is None else f" in session {self.session_id!r}"
            return (
                f"run_id {run.run_id!r} is already a run of agent {run.agent_name!r} in session {run.session_id!r}; "
                f"a run of agent {self.agent!r}{where} needs a run_id of its own"
            )
        compared: list[tuple[str, object, object]] = [
            ("stream", run.stream, self.stream),
            ("priority", run.priority, self.priority),
            ("webhook", run.webhook, self.webhook),
        ]
        if self.run_timeout is not None:  # a repeat without one takes the run's, whatever it is
            compared.append(("run_timeout", run.run_timeout, self.run_timeout))
        for name, stored, given in compared:
            if stored != given:
                return _another(run, f"{name}={stored!r}", f"{name}={given!r}")
        if run.request_digest == self.digest:
            return None
        if first_input() != self.input:
            return _another(run, "another input", "this input")
        if run.request_digest is not None:  # the input is the same: the state is not
            return _another(run, "another session_state", "this session_state")
        return None


def _another(run: RunRecord, stored: str, given: str) -> str:
    return (
        f"run_id {run.run_id!r} is already a run started with {stored}; a start with {given} is another request and "
        "needs a run_id of its own (the same request again returns the run)"
    )
