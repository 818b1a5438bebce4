"""The step engine: what one task does to a run. No Celery here; `workers.tasks` calls it.

Each step follows the protocol in DESIGN.md: claim (guarded, bumps the epoch, sets the lease),
work outside any transaction, commit fenced by the epoch, publish the next step after the commit.
A step that fails for good raises; the task's failure handler then calls `fail_step`, which
flushes the step's in-flight messages onto the run's ERROR row.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Collection
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, TypeVar

from orchestrator import delegation
from orchestrator.agent import Agent, get_agent
from orchestrator.errors import (
    FencedError,
    ModelCallError,
    RunNotFoundError,
    StepTimeoutError,
    ToolArgumentsError,
    ToolBatchLimitError,
    ToolInterruptedError,
)
from orchestrator.heartbeat import Heartbeat
from orchestrator.messages import Message, ToolCall, unanswered_calls
from orchestrator.models.base import CallContext, ModelReply
from orchestrator.ports import Dispatcher, StepRef, get_dispatcher
from orchestrator.run import RunRecord
from orchestrator.settings import Settings
from orchestrator.status import RunStatus
from orchestrator.store import Claim, Store
from orchestrator.store.transient import is_transient, retry_transient
from orchestrator.tools import ToolContext
from orchestrator.untrusted import TOOL_NAME_MAX, clip, error_record, safe_str, shown, storable_name, storable_text

log = logging.getLogger("ratchet.engine")
S = RunStatus
T = TypeVar("T")
MAX_TOOL_THREADS = 8
#: Room left in the 128-character call-id column for the suffix that makes an id unique.
CALL_ID_BASE_MAX = 96


@dataclass
class InFlight:
    """What a step built but has not committed: flushed onto the ERROR row if the step fails.
    Also the claim the heartbeat renews while the step runs (`orchestrator.heartbeat`)."""

    epoch: int
    run_id: str = ""
    #: The claim's owner, as stored in the run's `lease_owner`.
    owner: str = ""
    claimed_at: float = 0.0
    #: False once the heartbeat found the claim lost or the step past its hard time limit.
    renewing: bool = True
    system_message: str | None = None
    messages: list[Message] = field(default_factory=list)
    #: The step's own exception: Celery hands the failure handler a copy rebuilt from JSON,
    #: which loses the error's attributes.
    error: BaseException | None = None


class Engine:
    """Runs steps for one process. Thread-safe: an embedded worker may run several at once."""

    def __init__(
        self,
        settings: Settings,
        store: Store | None = None,
        dispatcher: Dispatcher | None = None,
        *,
        timeouts: tuple[type[BaseException], ...] = (),
        stopping: Callable[[BaseException], bool] = lambda exc: False,
    ) -> None:
        self.settings = settings
        self.store = store or Store.open(
            settings.database_url, auto_migrate=settings.auto_migrate, sqlite_synchronous=settings.sqlite_synchronous
        )
        self._dispatcher = dispatcher
        #: What the task runner raises in a step that ran past its soft time limit (Celery's
        #: SoftTimeLimitExceeded; the domain does not import Celery). It ends the step even inside
        #: a tool, where any other exception is the model's to read, and fails it as StepTimeoutError.
        self.timeouts = timeouts
        #: Whether an exception is the worker stopping (Celery's WorkerShutdown, or the SystemExit
        #: a pool process raises on SIGTERM, as at the hard time limit): never a tool's error.
        self.stopping = stopping
        # Keyed by the claim's owner (host, pid, task id), not by (run_id, seq): under the threads
        # pool one process may hold a stale and a live attempt of the same step at once.
        self._inflight: dict[str, InFlight] = {}
        self._lock = threading.Lock()
        #: Renews the leases of the steps in `_inflight`; started by the first claim.
        self.heartbeat = Heartbeat(self.store, settings, self.held)

    @property
    def dispatcher(self) -> Dispatcher:
        if self._dispatcher is None:
            self._dispatcher = get_dispatcher(self.settings)
        return self._dispatcher

    # ---------------------------------------------------------------- model step

    def model_step(self, run_id: str, seq: int, *, owner: str) -> str:
        """One model call for the run. Returns what happened (for logs and tests)."""
        claim = self._claim(run_id, seq, "model", owner)
        if claim is None:
            return "dropped"
        flight = self._begin(claim)
        try:
            return self._model_step(claim, flight)
        except BaseException as exc:
            self._abort(claim, flight, exc)
            raise

    def _model_step(self, claim: Claim, flight: InFlight) -> str:
        record = claim.record
        run_id = claim.run_id
        agent = get_agent(record.agent_name)
        if record.kind != agent.kind:
            # Started by a producer that does not import the agents: only the worker knows a team.
            self.store.set_kind(claim, agent.kind)
        # Rendered once, on the first step, then stored with the run and reused as-is (as Agno does).
        new_system = _system_message(agent) if record.system_message is None else None
        flight.system_message = new_system
        system = record.system_message if record.system_message is not None else new_system
        prompt = ([Message(role="system", content=system)] if system else []) + claim.messages
        batches = claim.transcript.tool_batches
        context = CallContext(run_id=run_id, seq=record.seq, timeout=self.settings.model_timeout)
        try:
            reply = agent.model.invoke(prompt, agent.tool_specs(), context=context)
        except ModelCallError as exc:
            if self._retry(claim, agent, exc):
                self._end(claim)
                return "retry"
            raise
        message = _assistant_message(reply, claim.transcript.call_ids, record.seq)
        # Kept for the failure handler until committed: a commit that fails for good must not
        # lose a paid-for reply (its calls, flushed onto the ERROR row, are what continue runs).
        flight.messages.append(message)
        if message.tool_calls and batches >= agent.max_tool_batches:
            # The calls are answered as not run, so the run owes nothing and a new user message
            # can continue it (the count starts again at each user message).
            flight.messages.extend(_not_run(c, "the run reached the agent's max_tool_batches") for c in message.calls)
            raise ToolBatchLimitError(
                f"{agent.name} asked for tool batch {batches + 1} since the user's last message; max_tool_batches "
                f"is {agent.max_tool_batches}. Its calls were not run. Continue the run with a new user message, "
                "or raise max_tool_batches on the agent, restart the workers and continue it"
            )
        done = not message.tool_calls
        grace = self.settings.publish_grace_seconds
        status, next_step = (S.COMPLETED, None) if done else (S.QUEUED, "tools")
        content = message.content if done else None
        team = record.parent_run_id if done else None
        woken = None
        if team is None:
            committed = self._durably(
                claim,
                lambda: self.store.commit_step(
                    claim, [message], status=status, next_step=next_step, publish_grace=grace, content=content,
                    system_message=new_system,
                ),
            )  # fmt: skip
        else:

            def commit_and_fan_in() -> tuple[RunRecord, RunRecord | None]:
                # A member's final answer reaches its team in the same transaction: no crash between.
                with self.store.engine.begin() as conn:
                    done_record = self.store.commit_step(
                        claim, [message], status=status, next_step=next_step, publish_grace=grace,
                        content=content, system_message=new_system, conn=conn,
                    )  # fmt: skip
                    return done_record, delegation.fan_in(self.store, conn, team, publish_grace=grace)

            # If a retry finds the commit landed, its fan-in landed with it; the team's outbox
            # marker then has the sweeper publish the leader's step.
            committed, woken = self._durably(claim, commit_and_fan_in, landed=lambda r: (r, None))
            self.store.remember(committed, [message])
        self._end(claim)
        if done:
            # A member's completion already reached its team in the commit (fan_in above).
            if (step := delegation.wake_step(woken)) is not None:
                self.publish(step)
            return "completed"
        self.publish(StepRef.of(committed))
        return "tools"

    def _durably(self, claim: Claim, write: Callable[[], T], *, landed: Callable[[RunRecord], T] | None = None) -> T:
        """A write of the claimed step, tried again through transient database errors (a failover,
        a dropped connection, SQLite busy) for as long as the lease lasts. `landed` turns the run,
        found moved on by a write that committed before its connection dropped, into the result."""

        def found() -> T | None:
            record = self.store.step_landed(claim)
            if record is None:
                return None
            return landed(record) if landed is not None else record  # type: ignore[return-value]

        return retry_transient(write, landed=found, within=self.settings.lease_seconds, what=f"run {claim.run_id}")

    def _retry(self, claim: Claim, agent: Agent, exc: ModelCallError) -> bool:
        cap = self.settings.max_retry_after
        if exc.retryable and exc.retry_after is not None and exc.retry_after > cap:
            # A provider must not park a run for an hour out of sight: stop, say why, let the user decide.
            raise ModelCallError(
                f"{exc}; the provider asked to wait {exc.retry_after:.0f}s before trying again, longer than "
                f"RATCHET_MAX_RETRY_AFTER ({cap:g}s): continue the run later, or raise that setting",
                retryable=False, status_code=exc.status_code, retry_after=exc.retry_after, kind=exc.kind,
            ) from None  # fmt: skip
        decision = agent.retry_policy.decide(
            retries_so_far=claim.record.retries,
            limit=agent.retries,
            retryable=exc.retryable,
            retry_after=exc.retry_after,
        )
        if not decision.retry:
            return False
        short = decision.delay <= self.settings.max_countdown
        record = self._durably(
            claim,
            lambda: self.store.park_for_retry(
                claim,
                delay=decision.delay,
                published=short,
                error=exc.to_record(),
                publish_grace=self.settings.publish_grace_seconds,
            ),
        )
        log.info(
            "run %s step %s: %s; retry %d in %.2fs", claim.run_id, record.seq, exc.kind, record.retries, decision.delay
        )
        if short:
            self.publish(StepRef(run_id=claim.run_id, seq=record.seq, kind="model", countdown=decision.delay or None))
        return True

    # ---------------------------------------------------------------- tool step

    def tool_step(self, run_id: str, seq: int, *, owner: str) -> str:
        """Run the tool calls the last assistant message still owes, committing each result."""
        claim = self._claim(run_id, seq, "tools", owner)
        if claim is None:
            return "dropped"
        flight = self._begin(claim)
        try:
            return self._tool_step(claim, flight)
        except BaseException as exc:
            self._abort(claim, flight, exc)
            raise

    def _tool_step(self, claim: Claim, flight: InFlight) -> str:
        run_id = claim.run_id
        agent = get_agent(claim.record.agent_name)
        pending = unanswered_calls(claim.messages)
        guarded = [c for c in pending if (t := agent.tool(c.name)) is not None and t.at_most_once]
        if guarded:
            started = self.store.started_tool_calls(run_id)
            interrupted = [c for c in guarded if c.id in started]
            if interrupted:
                flight.messages.extend(_interrupted_message(c) for c in interrupted)
                names = ", ".join(f"{c.name} ({c.id})" for c in interrupted)
                raise ToolInterruptedError(
                    f"at-most-once tool call {names} started and never finished; it was not run again. "
                    "Check whether it took effect, then continue the run (the model is told the outcome is unknown)."
                )
        pending, delegations = delegation.split(agent, pending)
        last = self._run_tools(claim, agent, pending, flight)
        grace = self.settings.publish_grace_seconds
        if delegations:
            # Members start as child runs in the commit that parks the team WAITING.
            steps = self._durably(
                claim,
                lambda: delegation.start_members(self.store, claim, last, delegations, publish_grace=grace),
                # Landed with the commit: the members' outbox markers have the sweeper publish them.
                landed=lambda _: [],
            )
            self._end(claim)
            for step in steps:
                self.publish(step)
            return "waiting"
        committed = self._durably(
            claim, lambda: self.store.commit_step(claim, last, status=S.QUEUED, next_step="model", publish_grace=grace)
        )
        self._end(claim)
        self.publish(StepRef.of(committed))
        return "model"

    def _run_tools(self, claim: Claim, agent: Agent, calls: list[ToolCall], flight: InFlight) -> list[Message]:
        """Run the calls concurrently; commit each result as it finishes except the last, which
        the step's own commit carries (one transaction fewer for the common single-call batch).

        A result waits in `flight.messages` until it is committed, so a step that fails in
        between still flushes it onto the ERROR row: no finished call is run again by a continue.

        When the soft time limit ends the step (raised in this thread), calls not yet started are
        dropped (they never ran; a continue runs them) and calls already running are waited for
        and their results committed: a thread cannot be stopped, and a tool left running would
        take effect with its result lost, so continue would run it again. The hard time limit
        bounds that wait: it kills the process, and with it the calls, which then did not finish."""
        if not calls:
            return []
        session = claim.record.session_id
        if len(calls) == 1:
            # In this thread: the soft limit is raised inside the tool, which so does not finish.
            flight.messages.append(self._call_tool(claim, agent, calls[0], session))
            return list(flight.messages)
        pool = ThreadPoolExecutor(max_workers=min(MAX_TOOL_THREADS, len(calls)), thread_name_prefix="ratchet-tool")
        pending: set[Future[Message]] = {pool.submit(self._call_tool, claim, agent, c, session) for c in calls}
        try:
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                _collect(finished, flight)
                while len(flight.messages) > (0 if pending else 1):
                    self._append_result(claim, flight.messages[0])
                    flight.messages.pop(0)
            return list(flight.messages)
        except BaseException:
            # The step ends here (its soft time limit, a lost claim, a call that failed outside
            # its tool) while other calls may be running in their threads, which cannot be stopped.
            running = [f for f in pending if not f.cancel()]
            if running:
                log.warning(
                    "run %s: the step is ending with %d tool call(s) still running; waiting for them so their "
                    "results are kept (the hard time limit ends the wait)", claim.run_id, len(running),
                )  # fmt: skip
            _collect(running, flight, first_error=False)
            self._keep(claim, flight)
            raise
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _keep(self, claim: Claim, flight: InFlight) -> None:
        """Commit the finished results of a step that is failing, each on its own (one may have
        been committed already when the failure struck); what cannot be committed stays in
        flight for the failure handler's flush."""
        try:
            while flight.messages:
                message = flight.messages[0]
                if not self.store.has_tool_result(claim.run_id, message.tool_call_id or ""):
                    self._append_result(claim, message)
                flight.messages.pop(0)
        except Exception as exc:  # fenced, or the database is gone: the flush (if any) carries the rest
            log.warning("run %s: %d finished tool result(s) left for the failure handler (%s)",
                        claim.run_id, len(flight.messages), type(exc).__name__)  # fmt: skip

    def _append_result(self, claim: Claim, message: Message) -> None:
        call_id = message.tool_call_id or ""
        retry_transient(
            lambda: self.store.append_tool_result(claim, message),
            landed=lambda: True if self.store.has_tool_result(claim.run_id, call_id) else None,
            within=self.settings.lease_seconds,
            what=f"run {claim.run_id} tool result {call_id}",
        )

    def _call_tool(self, claim: Claim, agent: Agent, call: ToolCall, session_id: str) -> Message:
        tool = agent.tool(call.name)

        def result(content: str, *, error: bool = False, args: dict[str, Any] | None = None) -> Message:
            return Message(
                role="tool", tool_call_id=call.id, tool_name=storable_name(call.name, TOOL_NAME_MAX),
                content=storable_text(content), tool_call_error=error, tool_args=args,
            )  # fmt: skip

        if tool is None:
            known = ", ".join(t.name for t in agent.all_tools()) or "none"
            return result(f"unknown tool {clip(call.name, 300)!r}; available tools: {known}", error=True)
        try:
            args = tool.parse_arguments(call.arguments)
        except ToolArgumentsError as exc:
            return result(str(exc), error=True, args=call.arguments_dict())
        if tool.at_most_once:
            retry_transient(
                lambda: self.store.record_tool_start(claim, call.id, call.name),
                landed=lambda: True if call.id in self.store.started_tool_calls(claim.run_id) else None,
                within=self.settings.lease_seconds,
                what=f"run {claim.run_id} start of {call.id}",
            )
        try:
            value = tool.call(args, ToolContext(run_id=claim.run_id, tool_call_id=call.id, session_id=session_id))
        except self.timeouts:  # the step's time is up: not the tool's error, the step's
            raise
        except BaseException as exc:
            if self.stopping(exc):  # the process is going away: the call did not finish
                raise
            # A tool's failure is the model's to read, not the run's; SystemExit included (a tool
            # wrapping argparse exits 2), which would otherwise end the pool process and have
            # the tool run again on every re-claim. Nothing below may raise: the tool ran.
            text = safe_str(exc)
            if not isinstance(exc, Exception):
                text = f"the tool raised {type(exc).__name__}({text})"
            log.info("run %s: tool %s raised %s: %s", claim.run_id, call.name, type(exc).__name__, clip(text, 500))
            return result(text, error=True, args=_jsonable(args, call))
        return result(_render(value), args=_jsonable(args, call))

    # ---------------------------------------------------------------- claim and failure

    def _claim(self, run_id: str, seq: int, kind: str, owner: str) -> Claim | None:
        claim = self.store.claim(
            run_id, seq, kind, owner=owner, lease_seconds=self.settings.lease_seconds,
            max_attempts=self.settings.max_step_attempts,
        )  # fmt: skip
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
                run_id, seq, kind, self.store.engine.url.render_as_string(hide_password=True),
            )  # fmt: skip
            return
        log.info("run %s step %s (%s): dropped (a duplicate or stale delivery)", run_id, seq, kind)

    def _abort(self, claim: Claim, flight: InFlight, exc: BaseException) -> None:
        """Keep why the step failed for `fail_step`; a fenced step only leaves a trace."""
        if isinstance(exc, FencedError):
            # Another holder owns the run now: nothing of this step may be written, and no
            # failure handler runs. The event shows operators a worker that came back too late.
            self._end(claim)
            held = claim.record
            try:
                with self.store.engine.begin() as conn:
                    self.store.log_event(
                        conn, held.run_id, "fenced", held.seq, epoch=held.epoch, owner=held.lease_owner
                    )
            except Exception:
                log.exception("run %s: could not record that epoch %s was fenced", claim.run_id, claim.epoch)
            return
        if isinstance(exc, self.timeouts):
            exc = StepTimeoutError(
                f"the step ran past its soft time limit ({self.settings.soft_time_limit:g}s); raise "
                "RATCHET_SOFT_TIME_LIMIT or make the step faster, then continue the run"
            )
        flight.error = exc

    def _begin(self, claim: Claim) -> InFlight:
        held = claim.record
        flight = InFlight(
            epoch=claim.epoch, run_id=claim.run_id, owner=held.lease_owner or "", claimed_at=held.updated_at
        )
        with self._lock:
            self._inflight[flight.owner] = flight
        self.heartbeat.wake()
        return flight

    def held(self) -> list[InFlight]:
        """The steps this process holds a claim on now (what the heartbeat renews)."""
        with self._lock:
            return list(self._inflight.values())

    def _end(self, claim: Claim) -> None:
        with self._lock:
            self._inflight.pop(claim.record.lease_owner or "", None)

    def fail_step(self, run_id: str, seq: int, exc: BaseException, *, owner: str) -> bool:
        """The failure handler: flush the step's in-flight messages and put the run in ERROR.

        `owner` is the failed delivery's claim owner (as passed to `model_step`/`tool_step`).
        Only a step that holds the claim may fail the run (fenced by its epoch): an error before
        the claim, or from a worker whose lease was taken over, changes nothing."""
        with self._lock:
            flight = self._inflight.pop(owner[:255], None)
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
        """Write the ERROR row with the in-flight messages. Their content cannot fail the write
        (`Message.to_row` makes it storable); if the database refuses them anyway, the run still
        goes to ERROR, without them, and the error says so: never left RUNNING for the sweeper."""

        def fail(inflight: list[Message], error: dict[str, str]) -> RunRecord | None:
            return retry_transient(
                lambda: self.store.fail(
                    run_id,
                    epoch=flight.epoch,
                    owner=flight.owner or None,
                    error=error,
                    inflight=inflight,
                    system_message=flight.system_message,
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

    # ---------------------------------------------------------------- hooks

    def publish(self, step: StepRef) -> None:
        """Publish a step after its commit. If the broker fails now, the run's outbox marker
        (publish_after) lets the sweeper publish it later: log, do not fail the committed step."""
        try:
            self.dispatcher.publish(step)
        except Exception as exc:
            log.warning(
                "run %s: publishing step %s failed (%s); the sweeper will publish it", step.run_id, step.seq, exc
            )

    def after_final(self, run_id: str, record: RunRecord | None = None) -> None:
        """Called when a run reaches ERROR: a member that failed moves its team (a completed
        member fans in with its final commit instead). `record`, the run as just committed,
        saves reading it again."""
        team = delegation.after_member_final(
            self.store, run_id, publish_grace=self.settings.publish_grace_seconds, record=record
        )
        if (step := delegation.wake_step(team)) is not None:
            self.publish(step)


def _assistant_message(reply: ModelReply, used: Collection[str], seq: int) -> Message:
    """The reply as the message the store will hold: call ids unique and storable, text storable
    (what a model says is untrusted: DESIGN.md, "Untrusted data")."""
    calls = _unique_call_ids(reply.tool_calls, used, seq)
    content = storable_text(reply.content) if reply.content is not None else None
    return ModelReply(content=content, tool_calls=calls, usage=reply.usage).to_message()


def _system_message(agent: Agent) -> str | None:
    text = agent.render_system_message()
    return storable_text(text) if text is not None else None


def _unique_call_ids(calls: list[ToolCall], used: Collection[str], seq: int) -> list[ToolCall]:
    """The reply's tool calls with ids unique in the run (`used`: the ids of its earlier calls)
    and storable (escaped, at most 128 characters with the suffix).

    A tool result, an at-most-once start and a member delegation are keyed by (run_id,
    tool_call_id), and tools get `run_id:tool_call_id` as their idempotency key; a provider that
    sends an empty id, the same id twice, or reuses an earlier turn's id would make them collide.
    Such ids get a suffix; the stored assistant message carries the new ids, so the model sees
    its results under them. (The tool-batch cap counts from the user's last message:
    `Transcript.tool_batches`.)"""
    if not calls:
        return calls
    taken: set[str] = set()
    unique: list[ToolCall] = []
    for i, call in enumerate(calls):
        base = storable_name(call.id, CALL_ID_BASE_MAX) if call.id else ""
        cid = base
        n = 0
        while not cid or cid in used or cid in taken:
            n += 1
            cid = f"{base or 'call'}~{seq}.{i}" + (f".{n}" if n > 1 else "")
        taken.add(cid)
        unique.append(call if cid == call.id else call.model_copy(update={"id": cid}))
    return unique


def _interrupted_message(call: ToolCall) -> Message:
    return Message(
        role="tool", tool_call_id=call.id, tool_name=storable_name(call.name, TOOL_NAME_MAX),
        tool_args=call.arguments_dict(), tool_call_error=True,
        content="this call was interrupted before it reported a result and was not run again "
        "(at-most-once); its outcome is unknown",
    )  # fmt: skip


def _not_run(call: ToolCall, why: str) -> Message:
    return Message(
        role="tool", tool_call_id=call.id, tool_name=storable_name(call.name, TOOL_NAME_MAX),
        tool_args=call.arguments_dict(), tool_call_error=True, content=f"this call was not run: {why}",
    )  # fmt: skip


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
