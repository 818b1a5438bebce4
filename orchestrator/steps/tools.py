"""The tool step: runs the calls the run's last assistant message still owes, and commits each
result; a team's delegation calls start member runs instead.

At most once: a tool marked `at_most_once` has its start recorded before it runs, so a call that
started and never reported (its worker died) is answered as interrupted, never run again
(`ToolInterruptedError`). Every other call whose result was not committed runs again on a
continue, so a result is kept (committed, or left in flight for the failure handler) as soon as
its call finishes.

Session state: what a call changed in its session's state (`orchestrator.state`) is kept beside
its result in flight and goes into the database in the same transaction as that result, whichever
write carries it (its own append, the step's commit, the failure handler's flush).
"""

from __future__ import annotations

import contextvars
import json
import logging
import time
from collections.abc import Collection
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from functools import partial
from typing import Any

from orchestrator import delegation, tracing
from orchestrator.agent import AgentDefinition, get_agent
from orchestrator.errors import ToolArgumentsError, ToolInterruptedError
from orchestrator.messages import Message, ToolCall, unanswered_calls
from orchestrator.routing import step_of
from orchestrator.state import CallState, StateError, Turn
from orchestrator.status import RunStatus
from orchestrator.steps import pausing
from orchestrator.steps.context import StepContext
from orchestrator.steps.inflight import InFlight
from orchestrator.store import Claim, Store
from orchestrator.store.transient import retry_transient
from orchestrator.tools import ToolContext
from orchestrator.untrusted import TOOL_NAME_MAX, clip, error_record, safe_str, shown, storable_name, storable_text
from orchestrator.usage import Metrics

log = logging.getLogger("ratchet.steps")
S = RunStatus
MAX_TOOL_THREADS = 8


class ToolStep:
    """Runs a batch of tool calls and commits their results, through its runner's step protocol."""

    def __init__(self, steps: StepContext) -> None:
        self.steps = steps
        self.settings = steps.settings
        self.store = steps.store

    def run(self, claim: Claim, flight: InFlight) -> str:
        """Run the calls the run still owes: "model" once their results are committed,
        "waiting" for a team whose batch delegated to its members, or "paused" when a call waits
        for a person (`pausing`)."""
        run_id = claim.run_id
        store = self.store
        agent = get_agent(claim.record.agent_name)
        pending = unanswered_calls(claim.messages)
        guarded = [c for c in pending if (t := agent.tool(c.name)) is not None and t.at_most_once]
        if guarded:
            started = store.started_tool_calls(run_id)
            interrupted = [c for c in guarded if c.id in started]
            if interrupted:
                flight.messages.extend(_interrupted_message(c) for c in interrupted)
                names = ", ".join(f"{c.name} ({c.id})" for c in interrupted)
                raise ToolInterruptedError(
                    f"at-most-once tool call {names} started and never finished; it was not run again. "
                    "Check whether it took effect, then continue the run (the model is told the outcome is unknown)."
                )
        pending, delegations = delegation.split(agent, pending)
        owed = pausing.sort(store, agent, claim.record, pending)
        flight.messages.extend(owed.answered)
        last = self._run_tools(claim, agent, owed.run, flight)
        changes = flight.changes_of(last)
        grace = self.settings.publish_grace_seconds
        if owed.paused:
            # A person decides these; the batch's delegations, if any, start once they did.
            asked = pausing.asked(agent, owed.paused, store.clock())
            self.steps.durably(
                claim,
                lambda: store.requirements.pause(claim, last, asked, publish_grace=grace, state_changes=changes),
            )
            self.steps.end(claim)
            return "paused"
        if delegations:
            # Members start as child runs in the commit that parks the team WAITING.
            steps = self.steps.durably(
                claim,
                lambda: delegation.start_members(
                    store, claim, last, delegations, publish_grace=grace, state_changes=changes
                ),
                # Landed with the commit: the members' outbox markers have the sweeper publish them.
                landed=lambda _: [],
            )
            self.steps.end(claim)
            for step in steps:
                self.steps.publish(step)
            return "waiting"
        committed = self.steps.durably(
            claim,
            lambda: store.commit_step(
                claim, last, status=S.QUEUED, next_step="model", publish_grace=grace, state_changes=changes
            ),
        )
        self.steps.end(claim)
        self.steps.publish(step_of(committed))
        return "model"

    def _run_tools(
        self, claim: Claim, agent: AgentDefinition, calls: list[ToolCall], flight: InFlight
    ) -> list[Message]:
        """Run the calls concurrently; commit each result as it finishes except the last, which
        the step's own commit carries (one transaction fewer for the common single-call batch).

        A result waits in `flight.messages` until it is committed, so a step that fails in
        between still flushes it onto the ERROR row: no finished call is run again by a continue.

        When the soft time limit ends the step (raised in this thread), calls not yet started are
        dropped (they never ran; a continue runs them) and calls already running are waited for
        and their results committed: a thread cannot be stopped, and a tool left running would
        take effect with its result lost, so continue would run it again. The hard time limit
        bounds that wait: it kills the process, and with it the calls, which then did not finish."""
        if not calls:  # the results of decisions only (`pausing`), if any
            return list(flight.messages)
        if len(calls) == 1 and not flight.messages:
            # In this thread: the soft limit is raised inside the tool, which so does not finish.
            flight.messages.append(self._call_tool(claim, agent, calls[0], flight, Batch(self.store, claim)))
            return list(flight.messages)
        batch = Batch(self.store, claim, Turn())
        pool = ThreadPoolExecutor(max_workers=min(MAX_TOOL_THREADS, len(calls)), thread_name_prefix="ratchet-tool")
        # Each call in a copy of this thread's context: its span is a child of the step's.
        pending: set[Future[Message]] = {
            pool.submit(contextvars.copy_context().run, self._call_tool, claim, agent, c, flight, batch) for c in calls
        }
        try:
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                _collect(finished, flight)
                while len(flight.messages) > (0 if pending else 1):
                    self._append_result(claim, flight.messages[0], flight, batch)
                    flight.messages.pop(0)
            return list(flight.messages)
        except BaseException:
            # The step ends here (its soft time limit, a lost claim, a call that failed outside
            # its tool) while other calls may be running in their threads, which cannot be stopped.
            running = [f for f in pending if not f.cancel()]
            if running:
                log.warning(
                    "run %s: the step is ending with %d tool call(s) still running; waiting for them so their "
                    "results are kept (the hard time limit ends the wait)",
                    claim.run_id,
                    len(running),
                )
            batch.end()  # no running call may wait for a turn that a result left uncommitted holds
            _collect(running, flight, first_error=False)
            self._keep(claim, flight, batch)
            raise
        finally:
            batch.end()
            pool.shutdown(wait=False, cancel_futures=True)

    def _keep(self, claim: Claim, flight: InFlight, batch: Batch) -> None:
        """Commit the finished results of a step that is failing, each on its own (one may have
        been committed already when the failure struck); what cannot be committed stays in
        flight for the failure handler's flush."""
        try:
            while flight.messages:
                message = flight.messages[0]
                if not self.store.has_tool_result(claim.run_id, message.tool_call_id or ""):
                    self._append_result(claim, message, flight, batch)
                flight.messages.pop(0)
        except Exception as exc:  # fenced, or the database is gone: the flush (if any) carries the rest
            log.warning(
                "run %s: %d finished tool result(s) left for the failure handler (%s)",
                claim.run_id,
                len(flight.messages),
                type(exc).__name__,
            )

    def _append_result(self, claim: Claim, message: Message, flight: InFlight, batch: Batch) -> None:
        """Commit a result with its call's change of the session's state, then hand the batch's
        turn on: the next call reads the state with that change in it."""
        store = self.store
        call_id = message.tool_call_id or ""
        change = flight.state_changes.get(call_id)
        retry_transient(
            lambda: store.append_tool_result(claim, message, change),
            landed=lambda: True if store.has_tool_result(claim.run_id, call_id) else None,
            within=self.settings.lease_seconds,
            what=f"run {claim.run_id} tool result {call_id}",
        )
        batch.release(call_id)

    def _call_tool(
        self, claim: Claim, agent: AgentDefinition, call: ToolCall, flight: InFlight, batch: Batch
    ) -> Message:
        with tracing.tool_call(call, claim.run_id) as span:  # nothing, unless a tracer provider is set
            started = time.monotonic()
            message = self._run_tool(claim, agent, call, flight, batch, span)
        if agent.tool(call.name) is None:  # timed only by a name the catalog bounds (metrics' label)
            return message
        return message.model_copy(update={"metrics": Metrics(duration=time.monotonic() - started)})

    def _run_tool(
        self, claim: Claim, agent: AgentDefinition, call: ToolCall, flight: InFlight, batch: Batch, span: tracing.Traced
    ) -> Message:
        """Run one call and return its result. An unknown tool, arguments its schema refuses, and
        whatever the tool raises are the model's to read, not the run's."""
        result = partial(_result, call, span)
        tool = agent.tool(call.name)
        if tool is None:
            known = ", ".join(t.name for t in agent.all_tools()) or "none"
            return result(f"unknown tool {clip(call.name, 300)!r}; available tools: {known}", failure="unknown_tool")
        try:
            args = tool.parse_arguments(call.arguments)
        except ToolArgumentsError as exc:
            return result(str(exc), failure=type(exc).__name__, args=call.arguments_dict())
        if tool.at_most_once:
            self._record_start(claim, call)
        context = ToolContext(
            run_id=claim.run_id,
            tool_call_id=call.id,
            session_id=claim.record.session_id,
            user_id=claim.record.user_id,
            state=batch.state_for(call.id),
        )
        try:
            value = tool.call(args, context)
        except self.steps.timeouts:  # the step's time is up: not the tool's error, the step's
            raise
        except BaseException as exc:
            if self.steps.stopping(exc):  # the process is going away: the call did not finish
                raise
            batch.release(call.id)  # a call that raised changes nothing
            text = _raised(claim, call, exc)
            return result(text, failure=type(exc).__name__, args=_jsonable(args, call))
        try:
            change = context.state.change()
        except StateError as exc:
            batch.release(call.id)
            text = f"{exc}; the call's changes to the session state were not kept"
            return result(text, failure=type(exc).__name__, args=_jsonable(args, call))
        if change is None:
            batch.release(call.id)
        else:
            flight.state_changes[call.id] = change
        return result(_render(value), args=_jsonable(args, call))

    def _record_start(self, claim: Claim, call: ToolCall) -> None:
        """Mark an at-most-once call as started before it runs (tried again through transient
        errors, unless the start landed): a call that never reports is then not run again."""
        store = self.store
        retry_transient(
            lambda: store.record_tool_start(claim, call.id, call.name),
            landed=lambda: True if call.id in store.started_tool_calls(claim.run_id) else None,
            within=self.settings.lease_seconds,
            what=f"run {claim.run_id} start of {call.id}",
        )


class Batch:
    """The calls of one tool step and their views of the session's state (`CallState`): with
    more than one call, they take turns (`Turn`) from a call's first use of the state until its
    result and change are committed."""

    def __init__(self, store: Store, claim: Claim, turn: Turn | None = None) -> None:
        self._store = store
        self._run = claim.record
        self._turn = turn
        self._states: dict[str, CallState] = {}

    def state_for(self, call_id: str) -> CallState:
        """The view of the call `call_id`, read from the store when the call first uses it."""
        view = self._states[call_id] = CallState(lambda: self._store.run_state(self._run), self._turn)
        return view

    def release(self, call_id: str) -> None:
        """The call's change is committed, or there is none: the next call may take its turn."""
        view = self._states.get(call_id)
        if view is not None:
            view.release()

    def end(self) -> None:
        """The batch is over: nobody waits for a turn from now on."""
        if self._turn is not None:
            self._turn.end()


def not_run(call: ToolCall, why: str) -> Message:
    """The result of a call that was not run, and why (the model reads it; the run owes nothing)."""
    return Message(
        role="tool",
        tool_call_id=call.id,
        tool_name=storable_name(call.name, TOOL_NAME_MAX),
        tool_args=call.arguments_dict(),
        tool_call_error=True,
        content=f"this call was not run: {why}",
    )


def _interrupted_message(call: ToolCall) -> Message:
    return Message(
        role="tool",
        tool_call_id=call.id,
        tool_name=storable_name(call.name, TOOL_NAME_MAX),
        tool_args=call.arguments_dict(),
        tool_call_error=True,
        content="this call was interrupted before it reported a result and was not run again "
        "(at-most-once); its outcome is unknown",
    )


def _result(
    call: ToolCall,
    span: tracing.Traced,
    content: str,
    *,
    failure: str | None = None,
    args: dict[str, Any] | None = None,
) -> Message:
    """The call's result as the store will hold it; `failure` names what failed (also on its span)."""
    if failure is not None:
        span.failed(failure)
    return Message(
        role="tool",
        tool_call_id=call.id,
        tool_name=storable_name(call.name, TOOL_NAME_MAX),
        content=storable_text(content),
        tool_call_error=failure is not None,
        tool_args=args,
    )


def _raised(claim: Claim, call: ToolCall, exc: BaseException) -> str:
    """What the model reads of an exception its tool raised. A tool's failure is the model's to
    read, not the run's; SystemExit included (a tool wrapping argparse exits 2), which would
    otherwise end the pool process and have the tool run again on every re-claim. Nothing here
    may raise: the tool ran."""
    text = safe_str(exc)
    if not isinstance(exc, Exception):
        text = f"the tool raised {type(exc).__name__}({text})"
    log.info("run %s: tool %s raised %s: %s", claim.run_id, call.name, type(exc).__name__, clip(text, 500))
    return text


def _jsonable(args: dict[str, Any], call: ToolCall) -> dict[str, Any]:
    """Validated arguments as JSON can carry them (they may hold dates, enums or models); the
    model's own text when they cannot be (a value whose `__str__` raises)."""
    try:
        value: dict[str, Any] = json.loads(json.dumps(args, default=str))
    except Exception:
        return call.arguments_dict()
    return value


def _collect(futures: Collection[Future[Message]], flight: InFlight, *, first_error: bool = True) -> None:
    """Every finished call's result into `flight.messages`, waiting for each; then the first
    call's failure (a lost claim, a database error recording an at-most-once start) is raised
    (`first_error`) or, on a step already failing, logged."""
    failure: BaseException | None = None
    for future in futures:
        try:
            flight.messages.append(future.result())
        except BaseException as exc:
            if failure is None:
                failure = exc
            if not first_error:
                log.warning("a tool call of a failing step failed too: %s", error_record(exc)["message"])
    if failure is not None and first_error:
        raise failure


def _render(result: Any) -> str:
    """A tool's return value as the text the model reads; a value that cannot be shown says so."""
    if result is None:
        return ""
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result, default=str)
    except Exception:
        return shown(result)
