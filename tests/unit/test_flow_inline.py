"""Flow control on the in-memory dispatcher: runs of one key take turns, a model's rates and a
provider's 429 park steps instead of holding a worker, none of it spends a retry, and nothing is
asked of the limiter where no limit applies."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from orchestrator import Agent, RunStatus, Team
from orchestrator.limits import LocalLimiter
from orchestrator.messages import Message
from orchestrator.models.base import CallContext, ModelReply, RateLimit, ToolSpec
from orchestrator.ports import Ask, StepRef, Verdict
from orchestrator.testing.script import Fault, ScriptConfig
from orchestrator.testing.scripted_model import ScriptedModel
from tests.flow_support import limited, logged, lookup, name, run_step_of
from tests.support import CountingModel

S = RunStatus


def test_runs_of_one_user_take_turns_and_another_users_run_does_not_wait(tmp_path: Path) -> None:
    model = CountingModel(script=ScriptConfig(tool_batches=2))
    agent = Agent(name=name("turns"), model=model, tools=[lookup])
    with limited(tmp_path, max_runs_per_key=1) as inline:
        # Given three runs of one user and one of another, started before any step ran
        ids = [agent.start(f"q{i}", user_id="alice").run_id for i in range(3)]
        other = agent.start("q", user_id="bob").run_id
        inline.run_until_idle()
        outputs = {r: inline.client.get_run(r) for r in [*ids, other]}
    # Then every run completed, alice's one after another: each one's calls all come before the next one's
    assert {r: o.status for r, o in outputs.items()} == dict.fromkeys([*ids, other], S.COMPLETED)
    order = [run_id for run_id, _ in model.calls if run_id != other]
    firsts = sorted(ids, key=order.index)
    assert order == [r for r in firsts for _ in range(3)], order
    # and bob's run went through while alice's waited
    assert model.calls.index((other, 0)) < order.index(firsts[1]) + 3
    # The runs that waited logged why, and spent no retry
    for run_id in firsts[1:]:
        (throttled,) = logged(inline, run_id, "throttled")
        assert throttled["reason"] == "concurrency" and throttled["by"] == "sweeper"
        assert outputs[run_id].retry is None and not logged(inline, run_id, "retry")
    assert not logged(inline, firsts[0], "throttled") and not logged(inline, other, "throttled")


def test_an_agents_concurrency_key_counts_a_tenants_users_together(tmp_path: Path) -> None:
    model = CountingModel(script=ScriptConfig(tool_batches=1))
    agent = Agent(
        name=name("tenant"), model=model, tools=[lookup],
        concurrency_key=lambda run: run.user_id.split("/")[0] if run.user_id else None,
    )  # fmt: skip
    with limited(tmp_path, max_runs_per_key=1) as inline:
        a, b, c = (agent.start("q", user_id=u).run_id for u in ("acme/ann", "acme/bob", "initech/cy"))
        free = agent.start("q").run_id  # no user: no key, not counted
        inline.run_until_idle()
        assert all(inline.client.get_run(r).status == S.COMPLETED for r in (a, b, c, free))
        assert [bool(logged(inline, r, "throttled")) for r in (a, b, c, free)] == [False, True, False, False]


def test_a_cancelled_or_failed_run_gives_its_place_to_the_run_waiting(tmp_path: Path) -> None:
    failing = Agent(
        name=name("fails"), model=CountingModel(script=ScriptConfig(faults=[Fault(status=400)])), tools=[lookup]
    )
    agent = Agent(name=name("waits"), model=CountingModel(script=ScriptConfig(tool_batches=1)), tools=[lookup])
    with limited(tmp_path, max_runs_per_key=1) as inline:
        holder = agent.start("q", user_id="u").run_id
        run_step_of(inline, holder)  # its first model step: it holds the place, its tool step queued
        waiting = agent.start("q", user_id="u").run_id
        run_step_of(inline, waiting)  # ...so this one is parked, published by nobody yet
        assert logged(inline, waiting, "throttled") and waiting not in {s.run_id for s in inline.pending}
        inline.client.cancel(holder)
        inline.run_until_idle()
        assert inline.client.get_run(waiting).status == S.COMPLETED
        # A run that fails frees its place too
        failed = failing.start("q", user_id="v").run_id
        after = agent.start("q", user_id="v").run_id
        inline.run_until_idle()
        assert inline.client.get_run(failed).status == S.ERROR
        assert inline.client.get_run(after).status == S.COMPLETED


def test_a_team_takes_one_place_and_its_members_none(tmp_path: Path) -> None:
    t = uuid.uuid4().hex[:6]
    member = Agent(name=f"member-{t}", model=CountingModel(script=ScriptConfig(final_text="done")), role="Helps.")
    leader = CountingModel(
        script=ScriptConfig(batches=[[{"tool": "delegate_task_to_member", "arguments": {"member_id": f"member-{t}",
                                                                                     "task": "help"}}]])
    )  # fmt: skip
    team = Team(name=f"team-{t}", model=leader, members=[member])
    with limited(tmp_path, max_runs_per_key=1) as inline:
        run_id = team.start("go", user_id="u").run_id
        inline.run_until_idle()
        out = inline.client.get_run(run_id)
    assert out.status == S.COMPLETED and [m.status for m in out.member_runs] == [S.COMPLETED]


def test_a_models_request_rate_parks_a_step_for_the_buckets_refill_not_as_a_retry(tmp_path: Path) -> None:
    model = CountingModel(script=ScriptConfig(tool_batches=0))
    model.rate_limit = RateLimit(requests=2, per=60)
    agent = Agent(name=name("rpm"), model=model, retries=0)
    with limited(tmp_path) as inline:
        ids = [agent.start(f"q{i}").run_id for i in range(3)]
        inline.run_until_idle()
        outputs = [inline.client.get_run(r) for r in ids]
    assert [o.status for o in outputs] == [S.COMPLETED] * 3  # with retries=0: a park is not a retry
    ((throttled,),) = [logged(inline, r, "throttled") for r in ids if logged(inline, r, "throttled")]
    assert throttled["reason"] == "requests" and throttled["by"] == "countdown"
    assert 30 <= throttled["delay"] <= 33  # one request refills in 60/2 s, plus up to 10% jitter
    assert 30 <= inline.now <= 33  # waited on the virtual clock, not by a sleeping worker


def test_a_429_blocks_the_model_for_every_run_for_its_retry_after(tmp_path: Path) -> None:
    rate = RateLimit()  # no numbers: only the provider's 429s are shared
    hit = ScriptedModel(id="shared", script=ScriptConfig(faults=[Fault(status=429, retry_after=5.0)]), rate_limit=rate)
    calm = ScriptedModel(id="shared", rate_limit=rate)
    first, second = Agent(name=name("hit"), model=hit), Agent(name=name("calm"), model=calm)
    with limited(tmp_path) as inline:
        a = first.start("q").run_id
        b = second.start("q").run_id
        inline.run_until_idle()
        assert [inline.client.get_run(r).status for r in (a, b)] == [S.COMPLETED] * 2
        assert [e["reason"] for e in logged(inline, b, "throttled")] == ["blocked"]
        assert not logged(inline, b, "retry")
        (retry,) = logged(inline, a, "retry")
        assert retry["delay"] >= 5.0


class Spy(LocalLimiter):
    """A limiter that records what it was asked: `asked` the admits, `called` every call by name."""

    def __init__(self) -> None:
        super().__init__(slot_seconds=900)
        self.asked: list[Ask] = []
        self.called: list[str] = []
        self.settled: list[int] = []
        self.blocked: list[float] = []

    def admit(self, ask: Ask) -> Verdict:
        self.asked.append(ask)
        self.called.append("admit")
        return super().admit(ask)

    def wait_for_room(self, key: str, limit: int, step: StepRef) -> bool:
        self.called.append("wait_for_room")
        return super().wait_for_room(key, limit, step)

    def release(self, run_id: str, limit: int) -> StepRef | None:
        self.called.append("release")
        return super().release(run_id, limit)

    def settle(self, model: str, rate: RateLimit, tokens: int) -> None:
        self.called.append("settle")
        self.settled.append(tokens)
        super().settle(model, rate, tokens)

    def block(self, model: str, seconds: float) -> None:
        self.called.append("block")
        self.blocked.append(seconds)
        super().block(model, seconds)


def test_a_step_with_no_limit_asks_the_limiter_nothing(tmp_path: Path) -> None:
    agent = Agent(name=name("free"), model=CountingModel(), tools=[lookup])
    spy = Spy()
    with limited(tmp_path, max_runs_per_key=2, limiter=spy) as inline:
        no_user = agent.start("q").run_id
        inline.run_until_idle()
        assert inline.client.get_run(no_user).status == S.COMPLETED and spy.asked == []
        assert spy.called == []  # not only no admit: no call of any kind
        with_user = agent.start("q", user_id="u").run_id
        inline.run_until_idle()
        assert [(a.run_id, a.key, a.limit, a.model) for a in spy.asked] == [(with_user, "u", 2, None)] * 2


def test_a_concurrency_key_that_fails_puts_the_run_in_error_saying_so(tmp_path: Path) -> None:
    def broken(run: Any) -> str:
        raise KeyError("tenant")

    agent = Agent(name=name("broken-key"), model=CountingModel(), concurrency_key=broken)
    with limited(tmp_path, max_runs_per_key=1) as inline:
        run_id = agent.start("q", user_id="u").run_id
        inline.run_until_idle()
        out = inline.client.get_run(run_id)
    assert out.status == S.ERROR and out.error is not None
    assert out.error.type == "ConfigurationError" and "concurrency_key raised KeyError" in out.error.message


def test_a_run_that_ends_or_is_cancelled_without_a_limit_asks_the_limiter_nothing(tmp_path: Path) -> None:
    agent = Agent(name=name("unlimited"), model=CountingModel())
    spy = Spy()
    with limited(tmp_path, limiter=spy) as inline:
        done = agent.start("q", user_id="u").run_id
        inline.run_until_idle()
        cancelled = agent.start("q", user_id="u").run_id
        inline.client.cancel(cancelled)

        assert inline.client.get_run(done).status == S.COMPLETED
        assert inline.client.get_run(cancelled).status == S.CANCELLED
        assert spy.called == []  # neither the commit nor the cancel asked it anything


class Boasting(ScriptedModel):
    """Says each call used more tokens than any limit holds (a broken proxy in front of a model)."""

    def invoke(self, messages: Sequence[Message], tools: Sequence[ToolSpec], *, context: CallContext) -> ModelReply:
        return replace(super().invoke(messages, tools, context=context), usage={"input_tokens": 2**31 - 1})


def test_a_reply_that_says_it_used_more_than_the_token_limit_is_charged_the_limit_only(tmp_path: Path) -> None:
    rate = RateLimit(tokens=1000, per=60)
    agent = Agent(name=name("boast"), model=Boasting(id=f"m-{uuid.uuid4().hex[:6]}", rate_limit=rate))
    spy = Spy()
    with limited(tmp_path, limiter=spy) as inline:
        run_id = agent.start("q").run_id
        inline.run_until_idle()
        assert inline.client.get_run(run_id).status == S.COMPLETED
        # Charged the whole limit at most, as `admit` charges a call larger than it: a minute's wait
        (ask,) = spy.asked
        assert spy.settled == [1000 - min(ask.tokens, 1000)]
        assert spy.admit(ask).wait <= 60


def test_a_429_longer_than_max_retry_after_blocks_the_model_no_longer_than_that(tmp_path: Path) -> None:
    rate = RateLimit()
    hit = ScriptedModel(id="shared-long", script=ScriptConfig(faults=[Fault(status=429, retry_after=7200.0)]),
                        rate_limit=rate)  # fmt: skip
    agent = Agent(name=name("long-429"), model=hit)
    spy = Spy()
    with limited(tmp_path, max_retry_after=900, limiter=spy) as inline:
        run_id = agent.start("q").run_id
        inline.run_until_idle()
        # The run told to wait two hours errors out, saying so; the model's other runs wait 900 s at most
        assert inline.client.get_run(run_id).status == S.ERROR
        assert spy.blocked == [900.0]
