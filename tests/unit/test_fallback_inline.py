"""Fallback models (`orchestrator.models.fallback`), run by the in-memory dispatcher on a real
SQLite store: a final error and spent retries move the step to the next model, in the same step;
an error whose class names no list fails as before; a chain that fails whole says each model's
error; the fallback is an event, a log entry and part of its step's timeline; the reply names
the model that wrote it and is costed at its prices. A worker killed in a fallback's call is
tests/chaos/test_model_faults.py's."""

from __future__ import annotations

import uuid

import pytest

from orchestrator import Agent, ConfigurationError, RetryPolicy, RunStatus, Team
from orchestrator.catalog import describe
from orchestrator.errors import ModelCallError
from orchestrator.events import drop_restarted
from orchestrator.models import FallbackConfig
from orchestrator.models.fallback import fallback_class
from orchestrator.testing import InMemoryDispatcher
from orchestrator.testing.script import Fault, ScriptConfig
from orchestrator.usage import Prices
from tests.support import CountingModel

S = RunStatus
FAST = RetryPolicy(base=0.01, max_delay=0.02)
TOO_LONG = "This model's maximum context length is 8192 tokens; your messages resulted in 9000 tokens"
CLAUDE_TOO_LONG = "prompt is too long: 210000 tokens > 200000 maximum"
GEMINI_TOO_LONG = "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576)."


def name() -> str:
    return f"fallback-{uuid.uuid4().hex[:8]}"


def model(id: str, *fault: Fault, prices: Prices | None = None) -> CountingModel:
    return CountingModel(id=id, script=ScriptConfig(faults=list(fault), final_text=f"{id} says hi"), prices=prices)


def test_a_final_error_falls_back_in_the_same_step_and_the_run_completes_on_the_fallback(
    inline: InMemoryDispatcher,
) -> None:
    primary = model("primary", Fault(status=400, times=None, message=TOO_LONG))
    backup = model("backup", prices=Prices(input=1.0, output=2.0))
    agent = Agent(name=name(), model=primary, fallback_models=[backup], retries=3)

    out = agent.run("hello")

    assert out.status == S.COMPLETED and out.content == "backup says hi"
    # One call of each, both in the step the run started with: a final error is not retried.
    assert primary.calls_for(out.run_id) == [0] and backup.calls_for(out.run_id) == [0]
    reply = out.messages[-1]
    assert reply.model == "backup"
    assert reply.metrics is not None and reply.metrics.input_tokens and reply.metrics.output_tokens
    assert reply.metrics.cost == pytest.approx(Prices(input=1.0, output=2.0).cost(
        reply.metrics.input_tokens, reply.metrics.output_tokens
    ))  # fmt: skip
    [entry] = [e for e in inline.client.get_log(out.run_id) if e.kind == "fallback"]
    assert entry.seq == 0 and entry.detail is not None
    assert (entry.detail["from"], entry.detail["to"], entry.detail["index"]) == ("primary", "backup", 1)
    assert entry.detail["error"]["type"] == "BadRequestError"
    [event] = [e for e in agent.client.stream(out.run_id) if e.event == "FallbackModelActivated"]
    assert (event.failed_model, event.model, event.seq) == ("primary", "backup", 0)
    assert event.error is not None and "maximum context length" in event.error.message
    [step] = [s for s in inline.client.get_steps(out.run_id) if s.task == "model"]
    assert step.status == "done" and step.model == "backup"
    assert [(f.failed_model, f.model, f.error.type) for f in step.fallbacks] == [
        ("primary", "backup", "BadRequestError")
    ]
    # The next model step starts on the agent's own model again.
    assert inline.store.get_record(out.run_id).model_index is None


def test_spent_retries_fall_back_and_the_fallback_gets_retries_of_its_own(inline: InMemoryDispatcher) -> None:
    primary = model("primary", Fault(status=500, times=None))
    backup = model("backup", Fault(status=503, times=1))
    agent = Agent(name=name(), model=primary, fallback_models=[backup], retries=2, retry_policy=FAST)

    out = agent.run("hello")

    assert out.status == S.COMPLETED and out.content == "backup says hi"
    # The primary is retried as before (its first call and 2 retries), then the backup is
    # called in the step that spent them, and its own failure is retried on it, not the primary.
    assert primary.calls_for(out.run_id) == [0, 1, 2]
    assert backup.calls_for(out.run_id) == [2, 3]
    kinds = [e.kind for e in inline.client.get_log(out.run_id) if e.kind in ("retry", "fallback")]
    assert kinds == ["retry", "retry", "fallback", "retry"]


def test_a_rate_limit_tries_the_rate_limit_list_before_the_general_one(inline: InMemoryDispatcher) -> None:
    primary = model("primary", Fault(status=429, times=None))
    general, for_limits = model("general"), model("for-limits")
    config = FallbackConfig(on_error=[general], on_rate_limit=[for_limits])
    agent = Agent(name=name(), model=primary, fallback_config=config, retries=0)

    out = agent.run("hello")

    assert out.status == S.COMPLETED and out.content == "for-limits says hi"
    assert general.calls_for(out.run_id) == []


@pytest.mark.parametrize(
    ("fault", "config"),
    [
        # A server error names no list of this config: only rate limits do.
        (Fault(status=500, times=None), FallbackConfig(on_rate_limit=[model("backup")])),
        # A client error is a configuration to fix: never hidden behind a fallback.
        (Fault(status=401, times=None), FallbackConfig(on_error=[model("backup")])),
    ],
    ids=["class-not-named", "client-error"],
)
def test_an_error_of_a_class_no_list_names_fails_the_run_as_before(
    inline: InMemoryDispatcher, fault: Fault, config: FallbackConfig
) -> None:
    primary = model("primary", fault)
    agent = Agent(name=name(), model=primary, fallback_config=config, retries=1, retry_policy=FAST)

    out = agent.run("hello")

    assert out.status == S.ERROR and out.error is not None
    assert "every model" not in out.error.message and f"HTTP {fault.status}" in out.error.message
    backups = [m for ms in (config.on_error, config.on_rate_limit) for m in ms]
    assert all(isinstance(b, CountingModel) and b.calls_for(out.run_id) == [] for b in backups)
    assert not [e for e in inline.client.get_log(out.run_id) if e.kind == "fallback"]


def test_when_every_model_fails_the_run_errors_saying_each_models_error(inline: InMemoryDispatcher) -> None:
    primary = model("primary", Fault(status=500, times=None, message="primary is down"))
    second = model("second", Fault(status=400, times=None, message=TOO_LONG))
    third = model("third", Fault(status=503, times=None, message="third is overloaded"))
    agent = Agent(name=name(), model=primary, fallback_models=[second, third], retries=1, retry_policy=FAST)

    out = agent.run("hello")

    assert out.status == S.ERROR and out.error is not None
    assert out.error.type == "InternalServerError"  # the first model's, as Agno raises the primary's
    message = out.error.message
    assert "every model of the fallback chain failed (3 tried)" in message
    assert message.index("primary is down") < message.index("maximum context length") < message.index("third is")
    assert [m.role for m in out.messages] == ["user"]  # the conversation kept, nothing invented
    assert (len(primary.calls_for(out.run_id)), len(second.calls_for(out.run_id))) == (2, 1)
    assert len(third.calls_for(out.run_id)) == 2
    steps = [
        (s.seq, s.status, [(f.failed_model, f.model) for f in s.fallbacks]) for s in inline.client.get_steps(out.run_id)
    ]
    assert steps == [
        (0, "retried", []),
        (1, "retried", [("primary", "second"), ("second", "third")]),  # the step that moved on, twice
        (2, "failed", []),
    ]
    # Continuing starts from the agent's own model again.
    assert inline.store.get_record(out.run_id).model_index == 2
    again = agent.continue_run(run_id=out.run_id)
    assert again.status == S.ERROR and len(primary.calls_for(out.run_id)) == 4


def test_a_streamed_fallback_sorts_after_the_failed_calls_text_whose_deltas_readers_drop(
    inline: InMemoryDispatcher,
) -> None:
    # The primary's stream breaks after two words: its partial text must not reach the answer.
    primary = model("primary", Fault(status=500, times=None, break_stream_after=2))
    backup = model("backup")
    agent = Agent(name=name(), model=primary, fallback_models=[backup], retries=0)

    events = list(agent.run("hello", stream=True))

    names = [e.event for e in events]
    switch = names.index("FallbackModelActivated")
    assert names[switch + 1] == "StepRestarted" and names[-1] == "RunCompleted"
    assert [e.content for e in events[:switch] if e.event == "RunContent"] == ["primary", " says"]
    assert events[switch].key < events[switch + 1].key  # a new epoch: the next call's events sort after
    kept = "".join(e.content or "" for e in drop_restarted(events) if e.event == "RunContent")
    assert kept == "backup says hi"


def test_a_teams_fallback_models_answer_for_its_leader(inline: InMemoryDispatcher) -> None:
    member = Agent(name=name(), model=model("member"), role="answers")
    leader, backup = model("leader", Fault(status=503, times=None)), model("leader-backup")
    team = Team(name=name(), model=leader, members=[member], fallback_models=[backup], retries=0)

    out = team.run("hello")

    assert out.status == S.COMPLETED and out.messages[-1].model == "leader-backup"
    assert len(leader.calls_for(out.run_id)) == len(backup.calls_for(out.run_id)) >= 1


@pytest.mark.parametrize(
    ("error", "klass"),
    [
        (ModelCallError("x", status_code=429, retryable=True, kind="RateLimitError"), "rate_limit"),
        (ModelCallError("x", status_code=529, retryable=True, kind="OverloadedError"), "rate_limit"),
        (ModelCallError(TOO_LONG, status_code=400, kind="BadRequestError"), "context_overflow"),
        # Claude's and Gemini's words, which their adapters mark (test_claude_models, test_gemini_models)
        (
            ModelCallError(CLAUDE_TOO_LONG, status_code=400, kind="BadRequestError", context_overflow=True),
            "context_overflow",
        ),
        (
            ModelCallError(GEMINI_TOO_LONG, status_code=400, kind="BadRequestError", context_overflow=True),
            "context_overflow",
        ),
        (ModelCallError(CLAUDE_TOO_LONG, status_code=400, kind="BadRequestError"), None),
        (ModelCallError("x", status_code=500, retryable=True, kind="InternalServerError"), "error"),
        (ModelCallError("x", retryable=True, kind="APITimeoutError"), "error"),
        (ModelCallError("x", status_code=404, kind="NotFoundError"), None),
        (ModelCallError("bad key", kind="AuthenticationError"), None),  # refused before any request
    ],
)
def test_errors_are_sorted_into_agnos_fallback_classes(error: ModelCallError, klass: str | None) -> None:
    assert fallback_class(error) == klass


def test_the_catalog_lists_the_fallback_models_and_a_definition_without_any_hashes_as_before() -> None:
    primary, backup, big = model("primary"), model("backup"), model("big")
    plain = Agent(name=name(), model=primary)
    with_fallbacks = Agent(
        name=name(), model=primary, fallback_models=[backup], fallback_config=FallbackConfig(on_context_overflow=[big])
    )

    assert "fallback_models" not in describe(plain).body()
    assert describe(with_fallbacks).fallback_models == {
        "on_error": [{"provider": None, "id": "backup"}],
        "on_context_overflow": [{"provider": None, "id": "big"}],
    }


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (dict(fallback_models=["openai:gpt-4o"]), "a fallback model must be a Model"),
        (dict(fallback_config={"on_error": []}), "fallback_config must be a FallbackConfig"),
        (
            dict(fallback_models=[model("b")], fallback_config=FallbackConfig(on_error=[model("c")])),
            "give one of them",
        ),
        (dict(fallback_config=FallbackConfig(on_error=model("b"))), "on_error must be a list of models"),  # type: ignore[arg-type]
    ],
)
def test_a_fallback_that_cannot_work_is_refused_when_the_agent_is_defined(options: dict, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        Agent(name=name(), model=model("a"), **options)


def test_a_cost_budget_refuses_a_fallback_model_without_prices() -> None:
    priced = model("a", prices=Prices(input=1.0, output=1.0))
    with pytest.raises(ConfigurationError, match="its fallback model .*has no prices"):
        Agent(name=name(), model=priced, fallback_models=[model("b")], max_cost=1.0)


def test_a_model_set_after_the_agent_was_defined_is_the_one_called_and_its_fallbacks_stay(
    inline: InMemoryDispatcher,
) -> None:
    # The README's unit test sets `team.model` to a scripted model in a test: the chain follows it.
    backup = model("backup")
    agent = Agent(name=name(), model=model("defined"), fallback_models=[backup])
    agent.model = replaced = model("replaced", Fault(status=500, times=None))

    out = agent.run("hello")

    assert out.status == S.COMPLETED and out.content == "backup says hi"
    assert replaced.calls_for(out.run_id) and backup.calls_for(out.run_id)
    assert agent.fallback.models == (replaced, backup)
