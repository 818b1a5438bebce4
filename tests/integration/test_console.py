"""The console's pages in headless Chromium (Debian's, driven by Playwright), as tests/integration/
test_ui.py drives the run pages: `ratchet api` in a uvicorn subprocess with a static token and
users' JWTs, a real worker running the steps. The agents page lists the catalog and opens an
agent; the playground starts a run of the agent picked, shows its text as it streams and its tool
calls, and goes on with a message (a COMPLETED run as a fork in the same session, an ERROR run in
place) or, for a run in ERROR, without one (Continue); a stream that answers an error is followed
again a poll interval later; a run's time axis draws each step's wait in the queue, its call and each tool call from
the stored times, and a team's member runs; a session's page shows its runs as one conversation;
two users each see only their own sessions and runs; markup a tool or the model wrote stays text."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import jwt
import playwright.sync_api as pw
import pytest

import tests.integration.console_agents  # noqa: F401  (the embedded worker runs its agents)
from orchestrator.settings import Settings
from tests.conftest import make_settings
from tests.integration.browser import DEADLINE_MS
from tests.integration.console_agents import CHATTER_WORDS, MARKUP
from tests.integration.test_api import ApiServer, SharedApi, module_database, shared_api

APP = "tests.integration.console_agents"
TOKEN = "console-test-token-9c1e"
SECRET = uuid.uuid4().hex + uuid.uuid4().hex  # the users' JWTs are signed with it (HS256)

pytestmark = [pytest.mark.parametrize("db_url", ["sqlite"], indirect=True), pytest.mark.usefixtures("worker")]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A database for this module's tests, which `settings` empties before each one."""
    with module_database(request, request.param, tmp_path_factory.mktemp("db")) as url:
        yield url


@pytest.fixture(scope="module")
def shared(db_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedApi]:
    """The module's server, started once: `SharedApi` says what keeps its tests apart."""
    env = {"RATCHET_API_TOKENS": TOKEN, "RATCHET_JWT_KEY": SECRET, "RATCHET_JWT_ALGORITHMS": "HS256"}
    log = tmp_path_factory.mktemp("api") / "api.log"
    with shared_api(make_settings(db_url, redis_url), log, env=env, app=APP) as served:
        yield served


@pytest.fixture
def settings(shared: SharedApi) -> Settings:
    """The worker's settings are the API server's: its database and queues, emptied for this test."""
    return shared.fresh()


@pytest.fixture
def api(shared: SharedApi, settings: Settings) -> ApiServer:
    return shared.server


def user_token(user: str) -> str:
    """A user's JWT, as an identity provider would sign it: the user's runs and sessions only."""
    now = int(time.time())
    claims = {"sub": user, "scope": "read write", "exp": now + 600, "iat": now}
    return jwt.encode(claims, SECRET, algorithm="HS256")


def signed_in(page: Any, url: str, token: str = TOKEN) -> None:
    """Open the page, which asks for a token (the API answers 401 without one), and give it."""
    page.goto(url)
    page.locator("#token-form").wait_for(state="visible")
    page.fill("#token-input", token)
    page.click("#token-form button[type=submit]")
    page.locator("#token-form").wait_for(state="hidden")


def start(api: ApiServer, agent: str, text: str, *, token: str = TOKEN, until: str, **body: Any) -> str:
    """Start a run over HTTP, as any client would, and wait for `until`."""
    with api.client(token) as http:
        started = http.post("/runs", json={"agent": agent, "input": text, **body})
        assert started.status_code == 202, started.text
        run_id: str = started.json()["run_id"]
        done = http.get(f"/runs/{run_id}/wait", params={"timeout": 30}).json()
        assert done["status"] == until, done
    return run_id


def read(api: ApiServer, path: str) -> Any:
    with api.client(TOKEN) as http:
        answered = http.get(path)
        assert answered.status_code == 200, answered.text
        return answered.json()


def test_the_agents_page_lists_the_catalog_and_opens_an_agent_with_its_tools_schemas(api: ApiServer, page: Any) -> None:
    signed_in(page, f"{api.url}/ui/")
    page.click("a.nav[href='#/agents']")

    # Every agent the worker wrote into the catalog at boot, live, with its model and tools
    row = page.locator('#agents tr[data-agent="ui-researcher"]')
    pw.expect(row).to_have_attribute("data-live", "true")
    pw.expect(row.locator("td.mono")).to_have_text("scripted")  # a model that names no provider: its id
    pw.expect(row.locator("td.tools-cell")).to_have_text("lookup, fetch_page")
    pw.expect(page.locator('#agents tr[data-agent="ui-crew"]')).to_contain_text("ui-helper")  # a team's members
    listed = {a["name"] for a in read(api, "/agents")["agents"]}
    pw.expect(page.locator("#agents tr[data-agent]")).to_have_count(len(listed))

    row.locator("a", has_text="ui-researcher").click()
    pw.expect(page.locator("h1")).to_contain_text("ui-researcher")
    pw.expect(page.locator("#definition")).to_have_attribute("data-live", "true")
    schema = page.locator('details.tool-schema[data-tool="lookup"]')
    schema.locator("summary").click()
    pw.expect(schema.locator("pre")).to_contain_text('"query"')
    [version] = read(api, "/agents/ui-researcher")["definitions"]
    pw.expect(page.locator(f'#versions tr[data-hash="{version["definition_hash"]}"]')).to_contain_text("live")

    page.click("#try")  # to the playground, the agent picked
    pw.expect(page.locator("#pg-agent")).to_have_value("ui-researcher")


def test_the_playground_starts_a_run_streams_it_and_continues_it_with_a_message_in_a_fork_of_the_same_session(
    api: ApiServer, page: Any
) -> None:
    signed_in(page, f"{api.url}/ui/")
    page.click("a.nav[href='#/playground']")
    page.select_option("#pg-agent", "ui-chatter")
    page.fill("#pg-message", "hello there")
    page.click("#pg-send")

    first = page.locator(".turn").nth(0)
    pw.expect(first.locator(".turn-user")).to_have_text("hello there")
    pw.expect(first.locator("pre.live")).to_contain_text("w3 ")  # streamed: before the answer was committed
    pw.expect(first.locator('.pg-calls li[data-tool="lookup"]')).to_contain_text("notes on the question")
    pw.expect(first.locator("pre.final")).to_have_text(
        "You said: hello there. " + " ".join(f"w{i}" for i in range(CHATTER_WORDS))
    )
    pw.expect(page.locator("body")).to_have_attribute("data-status", "COMPLETED")
    run_id = page.locator("#pg-state a.mono").first.inner_text()
    [started] = [r for r in read(api, "/runs")["runs"] if r["agent_name"] == "ui-chatter"]
    assert started["run_id"].startswith(run_id[:8]) and started["status"] == "COMPLETED"

    # Go on: a COMPLETED run is not changed, its conversation goes on in a fork, in its session
    page.fill("#pg-message", "and again")
    page.click("#pg-send")
    pw.expect(page.locator("#pg-note")).to_contain_text("Continued as a new run")
    pw.expect(page.locator("#pg-note")).to_contain_text(f"same session ({started['session_id']})")
    second = page.locator(".turn").nth(1)
    pw.expect(second.locator("pre.live")).to_contain_text("w3 ")
    pw.expect(second.locator("pre.final")).to_contain_text("You said: and again.")
    pw.expect(page.locator("body")).to_have_attribute("data-status", "COMPLETED")
    pw.expect(page.locator(".turn")).to_have_count(2)
    fork = [r for r in read(api, "/runs")["runs"] if r["forked_from"] == started["run_id"]]
    assert len(fork) == 1 and fork[0]["session_id"] == started["session_id"] and fork[0]["status"] == "COMPLETED"
    pw.expect(page.locator("#pg-session-link")).to_have_text(started["session_id"])
    pw.expect(page.locator("#pg-state a.mono").first).to_have_attribute("href", f"#/runs/{fork[0]['run_id']}")


def test_the_playground_waits_before_following_again_a_run_whose_event_stream_answers_an_error(
    api: ApiServer, page: Any
) -> None:
    answered: list[str] = []

    def refuse(route: Any) -> None:  # a proxy that fails the stream while the run goes on
        answered.append(route.request.url)
        route.fulfill(status=503, body="unavailable")

    page.route("**/runs/*/events", refuse)
    signed_in(page, f"{api.url}/ui/#/playground?agent=ui-chatter")
    pw.expect(page.locator("#pg-agent")).to_have_value("ui-chatter")
    page.fill("#pg-message", "hello")
    page.click("#pg-send")
    # The run's stop is read by the page's own poll, each a poll interval after a refused stream
    pw.expect(page.locator("body")).to_have_attribute("data-status", "COMPLETED", timeout=DEADLINE_MS)
    assert 1 <= len(answered) <= 3, answered  # not a request loop while the run went on


def test_the_playground_continues_a_run_in_error_in_place_with_the_message(api: ApiServer, page: Any) -> None:
    signed_in(page, f"{api.url}/ui/#/playground?agent=ui-researcher")
    pw.expect(page.locator("#pg-agent")).to_have_value("ui-researcher")
    page.fill("#pg-message", "how does celery retry?")
    page.click("#pg-send")

    first = page.locator(".turn").nth(0)
    pw.expect(first.locator(".errorbox")).to_contain_text("the request was refused once")
    pw.expect(first.locator('.pg-calls li[data-tool="fetch_page"]')).to_have_class("failed")
    pw.expect(page.locator("body")).to_have_attribute("data-status", "ERROR")
    [failed] = read(api, "/runs")["runs"]

    page.fill("#pg-message", "try once more")
    page.click("#pg-send")
    pw.expect(page.locator("#pg-note")).to_contain_text(f"Continued in place: the same run, {failed['run_id']}")
    pw.expect(page.locator(".turn").nth(1).locator("pre.final")).to_contain_text("Researched:")
    pw.expect(page.locator("body")).to_have_attribute("data-status", "COMPLETED")
    pw.expect(page.locator(".turn").nth(1).locator(".errorbox")).to_have_count(0)  # the old error is not read again
    [resumed] = read(api, "/runs")["runs"]
    assert resumed["run_id"] == failed["run_id"] and resumed["status"] == "COMPLETED"
    assert read(api, f"/runs/{failed['run_id']}")["messages"][-2]["content"] == "try once more"


def test_the_playground_continues_a_run_in_error_in_place_without_a_message(api: ApiServer, page: Any) -> None:
    signed_in(page, f"{api.url}/ui/#/playground?agent=ui-researcher")
    pw.expect(page.locator("#pg-agent")).to_have_value("ui-researcher")
    pw.expect(page.locator("#pg-continue")).to_be_hidden()
    page.fill("#pg-message", "how does celery retry?")
    page.click("#pg-send")
    pw.expect(page.locator("body")).to_have_attribute("data-status", "ERROR")
    [failed] = read(api, "/runs")["runs"]

    page.click("#pg-continue")  # POST /runs/{id}/continue with {}: what a run owing tool calls needs
    pw.expect(page.locator("#pg-note")).to_contain_text(f"without a message: the same run, {failed['run_id']}")
    pw.expect(page.locator(".turn").nth(0).locator("pre.final")).to_contain_text("Researched:")
    pw.expect(page.locator("body")).to_have_attribute("data-status", "COMPLETED")
    pw.expect(page.locator("#pg-continue")).to_be_hidden()
    pw.expect(page.locator(".turn")).to_have_count(1)  # no message: no turn of its own
    done = read(api, f"/runs/{failed['run_id']}")
    assert done["status"] == "COMPLETED" and [m["role"] for m in done["messages"]].count("user") == 1


def bars(row: Any) -> dict[str, float]:
    """A time axis row's bars: milliseconds by kind."""
    found = row.locator("rect.bar").evaluate_all("rs => rs.map(r => [r.dataset.kind, Number(r.dataset.ms)])")
    return dict(found)


def test_a_runs_time_axis_draws_each_steps_queue_wait_call_and_tool_calls_from_the_stored_times(
    api: ApiServer, page: Any
) -> None:
    run_id = start(api, "ui-researcher", "how does celery retry?", until="ERROR")
    with api.client(TOKEN) as http:
        assert http.post(f"/runs/{run_id}/continue", json={}).status_code == 202
        assert http.get(f"/runs/{run_id}/wait", params={"timeout": 30}).json()["status"] == "COMPLETED"
    steps = read(api, f"/runs/{run_id}/steps")["steps"]
    messages = read(api, f"/runs/{run_id}")["messages"]
    signed_in(page, f"{api.url}/ui/#/runs/{run_id}")
    page.click("#time-link")

    rows = page.locator("#time-axis .axis-row.k-step")
    pw.expect(rows).to_have_count(len(steps))
    assert [s["task"] for s in steps] == ["model", "tools", "model", "model"]
    for i, step in enumerate(steps):
        row = rows.nth(i)
        pw.expect(row).to_have_attribute("data-task", step["task"])
        drawn = bars(row)
        if step["started_at"] is None:  # the failed call wrote nothing: from when it could start
            assert step["status"] == "failed" and set(drawn) == {"unstamped"}
            assert drawn["unstamped"] == pytest.approx((step["ended_at"] - step["ready_at"]) * 1000, abs=0.01)
            continue
        assert set(drawn) == {"queue", step["task"]}
        assert drawn["queue"] == pytest.approx((step["started_at"] - step["ready_at"]) * 1000, abs=0.01)
        assert drawn[step["task"]] == pytest.approx((step["ended_at"] - step["started_at"]) * 1000, abs=0.01)
    pw.expect(rows.nth(2)).to_have_attribute("data-status", "failed")

    # The batch's two calls under it, each until its result was committed; the one that failed in red
    batch = steps[1]
    results = {m["tool_name"]: m for m in messages if m["role"] == "tool"}
    tools = page.locator("#time-axis .axis-row.k-tool")
    pw.expect(tools).to_have_count(2)
    for name, kind in (("lookup", "tool"), ("fetch_page", "tool-error")):
        drawn = bars(page.locator(f'#time-axis .axis-row.k-tool[data-tool="{name}"]'))
        assert drawn == {kind: pytest.approx((results[name]["created_at"] - batch["started_at"]) * 1000, abs=0.01)}
    pw.expect(page.locator('.axis-row.k-tool[data-tool="fetch_page"] .flag')).to_have_text("error")
    pw.expect(page.locator('#axis-totals [data-total="Steps"] dd')).to_have_text("4")


def test_a_teams_time_axis_draws_its_member_run_linked_to_the_members_own(api: ApiServer, page: Any) -> None:
    team = start(api, "ui-crew", "do the chores", until="COMPLETED")
    [member] = read(api, f"/runs/{team}")["member_runs"]
    signed_in(page, f"{api.url}/ui/#/runs/{team}/time")

    tasks = [s["task"] for s in read(api, f"/runs/{team}/steps")["steps"]]
    assert "fan_in" in tasks
    pw.expect(page.locator("#time-axis .axis-row.k-step")).to_have_count(len(tasks))
    row = page.locator(f'#time-axis .axis-row.k-member[data-member="{member["run_id"]}"]')
    pw.expect(row).to_contain_text("ui-helper")
    assert bars(row)["member"] == pytest.approx((member["updated_at"] - member["created_at"]) * 1000, abs=0.01)
    row.locator("a").click()
    pw.expect(page.locator("h1")).to_contain_text("ui-helper")
    pw.expect(page.locator("#time-axis .axis-row.k-step")).to_have_count(1)


def test_a_sessions_page_shows_its_runs_as_one_conversation(api: ApiServer, page: Any) -> None:
    first = start(api, "ui-chatter", "first question", until="COMPLETED", session_id="talk-1")
    with api.client(TOKEN) as http:
        fork = http.post(f"/runs/{first}/continue", json={"input": "second question"}).json()["run_id"]
        assert http.get(f"/runs/{fork}/wait", params={"timeout": 30}).json()["status"] == "COMPLETED"
    signed_in(page, f"{api.url}/ui/")
    page.click("a.nav[href='#/sessions']")
    listed = page.locator('#sessions tr[data-session="talk-1"]')
    pw.expect(listed.locator("td").nth(2)).to_have_text("2")
    listed.click()

    runs = page.locator("#conversation .session-run")
    pw.expect(runs).to_have_count(2)
    pw.expect(runs.nth(0)).to_have_attribute("data-run", first)
    pw.expect(runs.nth(1)).to_have_attribute("data-run", fork)
    pw.expect(runs.nth(0).locator(".msg.user")).to_have_count(1)
    pw.expect(runs.nth(0).locator(".msg.user")).to_contain_text("first question")
    # The fork's own messages only: its copy of the first run's is said, not shown again
    pw.expect(runs.nth(1).locator(".msg.user")).to_have_count(1)
    pw.expect(runs.nth(1).locator(".msg.user")).to_contain_text("second question")
    pw.expect(runs.nth(1).locator(".msg.assistant").last).to_contain_text("You said: second question.")
    pw.expect(runs.nth(1)).to_contain_text("messages copied from the run it continues")

    page.click("#go-on")  # the playground, at the fork
    pw.expect(page.locator("#pg-agent")).to_have_value("ui-chatter")
    pw.expect(page.locator(".turn")).to_have_count(2)
    pw.expect(page.locator("#pg-send")).to_be_enabled()


def test_each_user_sees_only_their_own_sessions_and_runs_on_the_pages(api: ApiServer, chromium: Any) -> None:
    ann, bob = user_token("ann"), user_token("bob")
    anns = start(api, "ui-echo", "ann's", token=ann, until="COMPLETED", session_id="ann-notes")
    bobs = start(api, "ui-echo", "bob's", token=bob, until="COMPLETED", session_id="bob-notes")

    for token, own, other, own_run, other_run in (
        (ann, "ann-notes", "bob-notes", anns, bobs),
        (bob, "bob-notes", "ann-notes", bobs, anns),
    ):
        context = chromium.new_context(viewport={"width": 1280, "height": 900})
        try:
            page = context.new_page()
            page.set_default_timeout(DEADLINE_MS)
            signed_in(page, f"{api.url}/ui/#/sessions", token)
            pw.expect(page.locator(f'#sessions tr[data-session="{own}"]')).to_be_visible()
            assert page.locator("#sessions tr[data-session]").count() == 1  # not the other user's
            page.goto(f"{api.url}/ui/#/sessions/{other}")
            pw.expect(page.locator("#no-session")).to_be_visible()
            page.goto(f"{api.url}/ui/#/sessions/{own}")
            pw.expect(page.locator("#conversation .session-run")).to_have_attribute("data-run", own_run)
            page.goto(f"{api.url}/ui/#/")
            pw.expect(page.locator(f'tr.run[data-run="{own_run}"]')).to_be_visible()
            assert page.locator("tr.run").count() == 1
            page.goto(f"{api.url}/ui/#/runs/{other_run}/time")
            pw.expect(page.locator("p.empty")).to_have_text(f"No run {other_run}.")
        finally:
            context.close()

    # The service token sees both users' sessions
    context = chromium.new_context()
    try:
        page = context.new_page()
        page.set_default_timeout(DEADLINE_MS)
        signed_in(page, f"{api.url}/ui/#/sessions")
        pw.expect(page.locator("#sessions tr[data-session]")).to_have_count(2)
    finally:
        context.close()


def test_a_run_started_in_the_playground_by_a_user_is_that_users(api: ApiServer, page: Any) -> None:
    signed_in(page, f"{api.url}/ui/#/playground?agent=ui-echo", user_token("ann"))
    pw.expect(page.locator("#pg-agent")).to_have_value("ui-echo")
    page.fill("#pg-message", "hi")
    page.click("#pg-send")
    pw.expect(page.locator("body")).to_have_attribute("data-status", "COMPLETED")
    [run] = read(api, "/runs")["runs"]
    assert run["user_id"] == "ann"


def test_markup_from_a_tool_or_the_model_stays_text_in_the_playground_and_the_session(
    api: ApiServer, page: Any
) -> None:
    signed_in(page, f"{api.url}/ui/#/playground?agent=ui-echo")
    pw.expect(page.locator("#pg-agent")).to_have_value("ui-echo")
    page.fill("#pg-message", "<b>hello</b><script>window.__pwned=3</script>")
    page.click("#pg-send")
    transcript = page.locator("#pg-transcript")
    pw.expect(transcript.locator("pre.final")).to_have_text(MARKUP)  # the model's answer: the tool's markup
    pw.expect(transcript.locator('.pg-calls li[data-tool="render_html"]')).to_contain_text(MARKUP)
    pw.expect(transcript.locator(".turn-user")).to_have_text("<b>hello</b><script>window.__pwned=3</script>")
    assert transcript.locator("img, script, b").count() == 0

    page.click("#pg-session-link")
    conversation = page.locator("#conversation")
    pw.expect(conversation.locator(".msg.tool")).to_contain_text(MARKUP)
    assert conversation.locator("img, script").count() == 0 and conversation.locator("b", has_text="bold").count() == 0
    assert page.evaluate("() => window.__pwned") is None
