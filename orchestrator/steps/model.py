"""The model step: one model call for a run, and the commit of its reply.

`ModelStep.run` runs its stages in order, each a method below:

0. turn: the first step of a run of a serialized session (`serialize_session_runs`) waits,
   parked, while runs of its session are ahead of it (`steps.admission`, `store/turns.py`);
   then the session gets the agent's default state;
1. budget: for an agent with a spending limit (`orchestrator.budgets`), the spend read from the
   committed usage of the run (a team's with its members'), its session and its user; a limit
   spent pauses the run before its call, holding nothing. No read for an agent without one;
2. context: the prompt, from the run's system message, its session's history and its
   transcript, and, on a retry of a reply that did not follow the agent's `output_schema`
   (`orchestrator.structured`), the correction that shows the model why;
3. admit: the limiter's verdict (`orchestrator.steps.admission`), which parks the step before
   its call when a limit says wait;
4. call: the model call; a streamed run's deltas are published, and all stored before anything
   of the step commits. A failed call is parked for a retry as the agent's retry policy
   decides; a model that failed for good hands the step to the next model of its agent's
   fallback chain (`steps.fallbacks`), admitted and called in turn; else the step fails;
5. check: a final answer against the agent's output schema (parked for a retry that shows the
   model why, or failing the step) and tool calls against its `max_tool_batches`;
6. commit: a final answer completes the run (and, for a team's member, reaches its team in the
   same transaction); tool calls queue the tool step, published after the commit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import replace

from orchestrator import delegation, structured, tracing
from orchestrator.agent import AgentDefinition, get_agent
from orchestrator.errors import ModelCallError, ToolBatchLimitError
from orchestrator.messages import MODEL_NAME_MAX, Message, ToolCall
from orchestrator.models.base import CallContext, Model, ModelReply
from orchestrator.ports import DeltaSink
from orchestrator.routing import step_of
from orchestrator.run import RunRecord
from orchestrator.status import RunStatus
from orchestrator.steps.admission import Admission
from orchestrator.steps.context import StepContext
from orchestrator.steps.fallbacks import Fallbacks
from orchestrator.steps.inflight import InFlight
from orchestrator.steps.live import LiveStep
from orchestrator.steps.tools import not_run
from orchestrator.store import Claim
from orchestrator.store.paused import Asked
from orchestrator.store.transient import retry_transient
from orchestrator.untrusted import storable_name, storable_text
from orchestrator.usage import Metrics

log = logging.getLogger("ratchet.steps")
S = RunStatus
#: Room left in the 128-character call-id column for the suffix that makes an id unique.
CALL_ID_BASE_MAX = 96


class ModelStep:
    """Calls the run's model and commits its reply, through its runner's step protocol.
    `sink`: where a streamed run's live events go (the runner builds it on first use)."""

    def __init__(self, steps: StepContext, admission: Admission, sink: Callable[[], DeltaSink]) -> None:
        self.steps = steps
        self.settings = steps.settings
        self.store = steps.store
        self.admission = admission
        self.sink = sink
        self.fallbacks = Fallbacks(steps)

    def run(self, claim: Claim, flight: InFlight) -> str:
        """Call the model on the run's transcript and commit the reply: "completed" or "tools",
        "retry" for a reply parked to be tried again, "throttled" for a step a limit parked
        before its call (`orchestrator.limits`), "paused" for a run whose budget is spent, or
        "waiting" for a first step parked for its turn in its session (`store/turns.py`)."""
        agent = self._agent(claim)
        # 0. turn: a serialized session's run waits for the runs of its session ahead of it
        if self.admission.waits_turn(agent, claim):
            return "waiting"
        if claim.record.seq == 0 and agent.session_state:
            self._add_state_defaults(claim, agent)
        # 1. budget
        if agent.budgets and self._budget_spent(agent, claim):
            return "paused"
        # 2. context
        prompt, new_system = self._context(agent, claim, flight)
        # 3. admit, 4. call (and the models the agent falls back on, each admitted and called in turn)
        index = claim.record.model_index or 0
        while True:
            model = agent.fallback.model(index)
            ask = self.admission.ask(agent, claim.record, prompt, model)
            if self.admission.parked(claim, ask):
                return "throttled"
            try:
                reply, timing = self._call(agent, model, prompt, claim)
                break
            except ModelCallError as exc:
                self.admission.failed(ask, exc)
                failed = self._retried(claim, agent, exc)
                if failed is None:
                    self.steps.end(claim)
                    return "retry"
            following = agent.fallback.after(index, failed)
            if following is None:
                raise self.fallbacks.exhausted(claim, agent, index, failed)
            claim = self.fallbacks.switch(claim, flight, agent, index, following, failed)
            index = following
        self.admission.used(ask, reply)
        # 5. check
        message = _assistant_message(reply, claim.transcript.call_ids, claim.record.seq, model)
        message = _timed(message, *timing)
        if not self._checked(agent, claim, message, flight):
            self.steps.end(claim)  # the reply is not kept: the retry shows the model its error instead
            return "retry"
        # 6. commit
        return self._commit(claim, message, new_system)

    # ---------------------------------------------------------------- budget

    def _budget_spent(self, agent: AgentDefinition, claim: Claim) -> bool:
        """Read what the run, its session and its user spent (committed replies only: a crashed
        step's reply never counts twice) against the agent's limits, as the run's decided raises
        left them; when one is spent, pause the run before its call and say so."""
        store = self.store
        record = claim.record
        spending = store.requirements.spending(record, agent.budgets.scopes)
        spent = agent.budgets.raised(spending.raises).spent(spending)
        if spent is None:
            return False
        asked = Asked(pause_type="budget", detail={"budget": spent})

        def landed() -> RunRecord | None:  # the pause keeps the seq: `durably`'s check would not see it
            found = store.get_record(claim.run_id)
            return found if found.status == S.PAUSED and found.epoch == claim.epoch else None

        retry_transient(
            lambda: store.requirements.pause_for_budget(claim, asked),
            landed=landed,
            within=self.settings.lease_seconds,
            what=f"run {claim.run_id} budget pause",
        )
        self.steps.end(claim)
        log.info(
            "run %s step %s: paused, its %s budget is spent (%s %s of %s)",
            claim.run_id,
            record.seq,
            spent["scope"],
            spent["limit"],
            spent["spent"],
            spent["allowed"],
        )
        return True

    # ---------------------------------------------------------------- context

    def _agent(self, claim: Claim) -> AgentDefinition:
        """The run's agent, with what the run's row lacks of it recorded: its kind."""
        record = claim.record
        agent = get_agent(record.agent_name)
        if record.kind != agent.kind:
            # Started by a producer that does not import the agents: only the worker knows a team.
            self.store.set_kind(claim, agent.kind)
        return agent

    def _add_state_defaults(self, claim: Claim, agent: AgentDefinition) -> None:
        """A run's first step gives its session the keys of the agent's default state it lacks,
        before any tool of the run can read it (again on a redelivery: adding what is missing
        twice adds nothing)."""
        store = self.store
        retry_transient(
            lambda: store.add_state_defaults(claim.record, agent.session_state),
            landed=lambda: None,
            within=self.settings.lease_seconds,
            what=f"run {claim.run_id} default session state",
        )

    def _context(self, agent: AgentDefinition, claim: Claim, flight: InFlight) -> tuple[list[Message], str | None]:
        """The prompt: the system message, the session's history, the transcript and the
        schema correction; and the system message rendered by this step (None when the run
        has one stored), which the commit stores."""
        record = claim.record
        # Rendered once, on the first step, then stored with the run and reused as-is (as Agno does).
        new_system = _system_message(agent) if record.system_message is None else None
        flight.system_message = new_system
        system = record.system_message if record.system_message is not None else new_system
        prompt = [Message(role="system", content=system)] if system else []
        if agent.add_history_to_context:  # fixed at the run's first step, the same on every later attempt
            prompt += self.store.history(claim, agent.num_history_runs, in_turn=agent.serialize_session_runs)
        prompt += claim.messages
        prompt += self._correction(agent, claim)
        return prompt, new_system

    def _correction(self, agent: AgentDefinition, claim: Claim) -> list[Message]:
        """For a retry of a reply that did not follow the agent's output schema, the message that
        shows the model why (built from the error the retry recorded, so every redelivery of the
        step sends the same request; kept in flight, never stored)."""
        if agent.output_schema is None or not claim.record.retries:
            return []
        # The retry parked at this seq recorded why (`Store.park_for_retry`): a read on retries only.
        detail = self.store.retry_detail(claim.run_id, claim.record.seq)
        message = structured.correction(detail.get("error"))
        return [message] if message is not None else []

    # ---------------------------------------------------------------- call

    def _call(
        self, agent: AgentDefinition, model: Model, prompt: list[Message], claim: Claim
    ) -> tuple[ModelReply, tuple[float, float | None]]:
        """The call of `model` (the agent's, or a fallback's), and how long it took and took to its
        first text (streamed runs only: the metrics' model latency and time to first token). A
        streamed run's gets the callback that publishes each delta, and its deltas are all stored
        when this returns or raises, before anything of the step commits."""
        timeout = self.settings.model_timeout
        output = structured.output_format(agent.output_schema) if agent.output_schema is not None else None
        record = claim.record
        context = CallContext(run_id=claim.run_id, seq=record.seq, timeout=timeout, output=output)
        first: list[float] = []
        with tracing.model_call(model, record, stream=record.stream, structured=output is not None) as span:
            started = time.monotonic()
            if record.stream:
                reply = self._streamed(agent, model, prompt, claim, context, first)
            else:  # only streamed runs write live events: no cost to any other step
                reply = model.invoke(prompt, agent.tool_specs(), context=context)
            took = time.monotonic() - started
            span.reply(reply)
            return reply, (took, first[0] - started if first else None)

    def _streamed(
        self,
        agent: AgentDefinition,
        model: Model,
        prompt: list[Message],
        claim: Claim,
        context: CallContext,
        first: list[float],
    ) -> ModelReply:
        """The call of a streamed run: each delta published, and all stored before it returns or
        raises; the time of its first text put in `first`."""
        live = LiveStep(self.sink(), claim, self.store.clock, timeouts=self.steps.timeouts)
        live.begin()

        def delta(text: str) -> None:
            if text and not first:
                first.append(time.monotonic())
            live.delta(text)

        try:
            return model.invoke(prompt, agent.tool_specs(), context=replace(context, on_delta=delta))
        finally:
            live.end()

    def _retried(self, claim: Claim, agent: AgentDefinition, exc: ModelCallError) -> ModelCallError | None:
        """None when the failed call was parked for a retry; else the error its model failed with
        for good (`exc`, or that of a provider asking to wait too long), for the fallback stage."""
        try:
            return None if self._retry(claim, agent, exc) else exc
        except ModelCallError as final:
            return final

    def _retry(self, claim: Claim, agent: AgentDefinition, exc: ModelCallError) -> bool:
        """Park the run for another try of a failed call if the agent's retry policy says so."""
        settings = self.settings
        cap = settings.max_retry_after
        if exc.retryable and exc.retry_after is not None and exc.retry_after > cap:
            # A provider must not park a run for an hour out of sight: stop, say why, let the user decide.
            raise ModelCallError(
                f"{exc}; the provider asked to wait {exc.retry_after:.0f}s before trying again, longer than "
                f"RATCHET_MAX_RETRY_AFTER ({cap:g}s): continue the run later, or raise that setting",
                retryable=False,
                status_code=exc.status_code,
                retry_after=exc.retry_after,
                kind=exc.kind,
            ) from None
        decision = agent.retry_policy.decide(
            retries_so_far=claim.record.retries,
            limit=agent.retries,
            retryable=exc.retryable,
            retry_after=exc.retry_after,
        )
        if not decision.retry:
            return False
        short = decision.delay <= settings.max_countdown
        record = self.steps.durably(
            claim,
            lambda: self.store.park_for_retry(
                claim,
                delay=decision.delay,
                published=short,
                error=exc.to_record(),
                publish_grace=settings.publish_grace_seconds,
            ),
        )
        log.info(
            "run %s step %s: %s; retry %d in %.2fs", claim.run_id, record.seq, exc.kind, record.retries, decision.delay
        )
        if short:
            self.steps.publish(step_of(record, countdown=decision.delay or None))
        return True

    # ---------------------------------------------------------------- check

    def _checked(self, agent: AgentDefinition, claim: Claim, message: Message, flight: InFlight) -> bool:
        """Check the reply before it is committed: False for a final answer that does not follow
        the agent's output schema and was parked for a retry. Raises that error once its retries
        are spent, or ToolBatchLimitError for tool calls past the agent's max_tool_batches."""
        invalid = _invalid_output(agent, message)
        if invalid is not None and self._retry(claim, agent, invalid):
            return False
        # Kept for the failure handler until committed: a commit that fails for good must not
        # lose a paid-for reply (its calls, flushed onto the ERROR row, are what continue runs).
        flight.messages.append(message)
        if invalid is not None:
            raise invalid  # retries spent: the run goes to ERROR with the invalid reply on its row
        batches = claim.transcript.tool_batches
        if message.tool_calls and batches >= agent.max_tool_batches:
            # The calls are answered as not run, so the run owes nothing and a new user message
            # can continue it (the count starts again at each user message).
            flight.messages.extend(not_run(c, "the run reached the agent's max_tool_batches") for c in message.calls)
            raise ToolBatchLimitError(
                f"{agent.name} asked for tool batch {batches + 1} since the user's last message; max_tool_batches "
                f"is {agent.max_tool_batches}. Its calls were not run. Continue the run with a new user message, "
                "or raise max_tool_batches on the agent, restart the workers and continue it"
            )
        return True

    # ---------------------------------------------------------------- commit

    def _commit(self, claim: Claim, message: Message, new_system: str | None) -> str:
        """Commit the reply and publish what follows: the tool step, or a member's woken team."""
        done = not message.tool_calls
        grace = self.settings.publish_grace_seconds
        status, next_step = (S.COMPLETED, None) if done else (S.QUEUED, "tools")
        content = message.content if done else None
        team = claim.record.parent_run_id if done else None
        store = self.store
        woken = None
        if team is None:
            committed = self.steps.durably(
                claim,
                lambda: store.commit_step(
                    claim,
                    [message],
                    status=status,
                    next_step=next_step,
                    publish_grace=grace,
                    content=content,
                    system_message=new_system,
                ),
            )
        else:
            # A member's final answer reaches its team in the same transaction: no crash between.
            # If a retry finds the commit landed, its fan-in landed with it; the team's outbox
            # marker then has the sweeper publish the leader's step.
            committed, woken = self.steps.durably(
                claim,
                lambda: delegation.commit_and_fan_in(
                    store,
                    claim,
                    [message],
                    status=status,
                    publish_grace=grace,
                    content=content,
                    system_message=new_system,
                ),
                landed=lambda r: (r, None),
            )
            store.remember(committed, [message])
        self.steps.end(claim)
        if done:
            self.admission.release(committed)
            # A member's completion already reached its team in the commit (fan_in above).
            if (step := delegation.wake_step(woken)) is not None:
                self.steps.publish(step)
            return "completed"
        self.steps.publish(step_of(committed, calls=message.calls))
        return "tools"


def _assistant_message(reply: ModelReply, used: Collection[str], seq: int, model: Model) -> Message:
    """The reply of `model` as the message the store will hold: call ids unique and storable,
    text storable (what a model says is untrusted: ARCHITECTURE.md, "What comes from outside"),
    its usage costed at the model's prices, and the model named by the id it was configured with
    (a bounded label for the metrics; the provider's own name of it is on the call's span)."""
    calls = _unique_call_ids(reply.tool_calls, used, seq)
    content = storable_text(reply.content) if reply.content is not None else None
    named = storable_name(model.id, MODEL_NAME_MAX)
    return ModelReply(content=content, tool_calls=calls, usage=reply.usage, response_model=named).to_message(
        model.prices
    )


def _timed(message: Message, duration: float, first_token: float | None) -> Message:
    """The reply with its call's timing (metrics: latency per model)."""
    timing = {"duration": duration, "time_to_first_token": first_token}
    metrics = (message.metrics or Metrics()).model_copy(update=timing)
    return message.model_copy(update={"metrics": metrics})


def _invalid_output(agent: AgentDefinition, message: Message) -> ModelCallError | None:
    """The error of a final answer that does not follow the agent's output schema (a reply with
    tool calls is not a final answer: it is checked when the model answers)."""
    if agent.output_schema is None or message.tool_calls:
        return None
    return structured.validate(agent.output_schema, message.content)


def _system_message(agent: AgentDefinition) -> str | None:
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
