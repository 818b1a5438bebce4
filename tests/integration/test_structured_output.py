"""Structured output (`output_schema=`) on a real worker, through the real openai client of both
APIs against the scripted server, on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from pydantic import BaseModel

from orchestrator import Agent, Client, RunStatus, Team
from orchestrator.models import OpenAIChat, OpenAIResponses
from orchestrator.models._openai import OpenAIModel
from orchestrator.retry import RetryPolicy
from orchestrator.settings import Settings
from orchestrator.store import Store
from orchestrator.team import TO_MEMBER, member_id
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.server import ScriptedServer
from tests.conftest import settings_env

S = RunStatus
QUICK_RETRIES = RetryPolicy(base=0.05, factor=2.0, max_delay=0.1)
ROOT = Path(__file__).resolve().parents[2]
VALID = '{"city": "Paris", "population": 2100000}'
NOT_JSON = "Paris has about two million people"
WRONG_TYPE = '{"city": "Paris", "population": "many"}'


class CityFacts(BaseModel):
    city: str
    population: int


@pytest.fixture(params=[OpenAIChat, OpenAIResponses], ids=["chat", "responses"])
def api(request: pytest.FixtureRequest) -> type[OpenAIModel]:
    return request.param  # type: ignore[no-any-return]


def city_agent(api: type[OpenAIModel], settings: Settings, retries: int = 3) -> Agent:
    return Agent(
        name=f"city-{uuid.uuid4().hex[:6]}",
        model=api(id="city"),
        output_schema=CityFacts,
        retries=retries,
        retry_policy=QUICK_RETRIES,
        client=Client(settings),
    )


def retry_errors(settings: Settings, run_id: str) -> list[str]:
    """The type of each error the run's retries recorded."""
    events = Store.open(settings.database_url).get_events(run_id)
    return [e["detail"]["error"]["type"] for e in events if e["kind"] == "retry"]


def test_a_valid_reply_is_asked_for_by_schema_and_comes_back_as_the_models_instance(
    api: type[OpenAIModel], settings: Settings, scripted: ScriptedServer, worker: object
) -> None:
    scripted.configure(ScriptConfig(final_replies=[VALID]))
    agent = city_agent(api, settings)

    out = agent.run("Tell me about Paris", timeout=30)

    assert out.status == S.COMPLETED
    assert out.content == CityFacts(city="Paris", population=2100000)
    assert out.messages[-1].content == VALID  # stored as the JSON the model sent
    [request] = scripted.requests_for(out.run_id)
    assert request["output_format"] == "CityFacts"
    assert ("response_format" if api is OpenAIChat else "text") in request["params"]


@pytest.mark.parametrize("invalid", [NOT_JSON, WRONG_TYPE], ids=["not-json", "wrong-type"])
def test_an_invalid_reply_is_retried_with_its_validation_error_shown_to_the_model(
    api: type[OpenAIModel], settings: Settings, scripted: ScriptedServer, worker: object, invalid: str
) -> None:
    scripted.configure(ScriptConfig(final_replies=[invalid, VALID]))
    agent = city_agent(api, settings)

    out = agent.run("Tell me about Paris", timeout=30)

    assert out.status == S.COMPLETED
    assert out.content == CityFacts(city="Paris", population=2100000)
    assert retry_errors(settings, out.run_id) == ["OutputValidationError"]
    first, second = scripted.requests_for(out.run_id)
    assert first["last_user"] == "Tell me about Paris"
    assert "does not follow the output schema CityFacts" in second["last_user"]
    assert second["output_format"] == "CityFacts"
    # The correction was only in flight: the transcript holds the question and the valid answer.
    assert [(m.role, m.content) for m in out.messages] == [("user", "Tell me about Paris"), ("assistant", VALID)]


def test_a_reply_that_never_validates_ends_in_error_with_the_raw_reply_kept(
    api: type[OpenAIModel], settings: Settings, scripted: ScriptedServer, worker: object
) -> None:
    scripted.configure(ScriptConfig(final_replies=[WRONG_TYPE]))
    agent = city_agent(api, settings, retries=2)

    out = agent.run("Tell me about Paris", timeout=30)

    assert out.status == S.ERROR
    assert out.error is not None and out.error.type == "OutputValidationError"
    assert "population" in out.error.message
    assert out.messages[-1].role == "assistant" and out.messages[-1].content == WRONG_TYPE
    assert out.content is None
    assert len(scripted.requests_for(out.run_id)) == 3  # the first try and its two retries
    assert retry_errors(settings, out.run_id) == ["OutputValidationError"] * 2


def read_elsewhere(settings: Settings, run_id: str, agent_name: str | None) -> list[object]:
    """`Client.get_run(run_id).content`, its type and value, as another process reads it: one that
    defines the agent (with its schema) when `agent_name` is given, else one that never did."""
    code = (
        "import json, sys\n"
        "from orchestrator import Agent, Client\n"
        "if len(sys.argv) > 2:\n"
        "    from pydantic import BaseModel\n"
        "    from orchestrator.models import OpenAIChat\n"
        "    class CityFacts(BaseModel):\n"
        "        city: str\n"
        "        population: int\n"
        "    Agent(name=sys.argv[2], model=OpenAIChat(id='city'), output_schema=CityFacts)\n"
        "out = Client().get_run(sys.argv[1])\n"
        "print(json.dumps([type(out.content).__name__, str(out.content)]))\n"
    )
    env = {**os.environ, **settings_env(settings), "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-c", code, run_id, *([agent_name] if agent_name else [])]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_a_stored_row_reads_the_same_in_every_process_whatever_agents_it_imported(
    settings: Settings, scripted: ScriptedServer, worker: object
) -> None:
    scripted.configure(ScriptConfig(final_replies=[VALID]))
    agent = city_agent(OpenAIChat, settings)  # how a row is read back does not depend on the API
    out = agent.run("Tell me about Paris", timeout=30)
    assert isinstance(out.content, CityFacts)  # the agent's own run reads with its own schema

    here = Client(settings).get_run(out.run_id)

    assert [type(here.content).__name__, here.content] == ["str", VALID]
    assert read_elsewhere(settings, out.run_id, agent.name) == ["str", VALID]
    assert read_elsewhere(settings, out.run_id, None) == ["str", VALID]
    assert here.content_as(CityFacts) == out.content  # a producer holding the schema asks for it


def test_a_team_answers_in_its_output_schema_after_delegating(
    settings: Settings, scripted: ScriptedServer, worker: object
) -> None:
    t = uuid.uuid4().hex[:6]
    writer = Agent(name=f"writer-{t}", model=OpenAIChat(id="writer"), role="Knows cities.")
    team = Team(
        name=f"team-{t}",
        model=OpenAIResponses(id="leader"),
        members=[writer],
        output_schema=CityFacts,
        retry_policy=QUICK_RETRIES,
        client=Client(settings),
    )
    call = {"tool": TO_MEMBER, "arguments": {"member_id": member_id(writer), "task": "Paris"}}
    leader = ScriptConfig(batches=[[call]], final_replies=[NOT_JSON, VALID])
    scripted.configure(ScriptConfig(by_model={"leader": leader, "writer": ScriptConfig(final_text="big")}))

    out = team.run("Tell me about Paris", timeout=30)

    assert out.status == S.COMPLETED
    assert out.content == CityFacts(city="Paris", population=2100000)
    assert [m.content for m in out.member_runs] == ["big"]
    leader_requests = [r for r in scripted.requests_for(out.run_id) if r["model"] == "leader"]
    assert [r["output_format"] for r in leader_requests] == ["CityFacts"] * 3


def test_a_streamed_run_asks_for_the_schema_and_retries_an_invalid_reply_too(
    api: type[OpenAIModel], settings: Settings, scripted: ScriptedServer, worker: object
) -> None:
    scripted.configure(ScriptConfig(final_replies=[NOT_JSON, VALID]))
    agent = city_agent(api, settings)

    events = list(agent.run("Tell me about Paris", stream=True, timeout=30))

    run_id = events[0].run_id
    out = Client(settings).get_run(run_id)
    assert out.status == S.COMPLETED and out.content_as(CityFacts) == CityFacts(city="Paris", population=2100000)
    assert [(r["stream"], r["output_format"]) for r in scripted.requests_for(run_id)] == [(True, "CityFacts")] * 2
