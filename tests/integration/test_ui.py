"""The run pages in headless Chromium (Debian's, driven by Playwright): `ratchet api` in a uvicorn
subprocess with bearer tokens on, a real worker running the steps, on SQLite and PostgreSQL. The
page asks for the token, lists the runs and keeps the list current, shows an ERROR run with its
error and its tool error, continues it and shows it complete; a streamed run's text shows as it
is written; run content that is markup stays text; a run stopped at its deadline shows why and
is continued from its page; a run's page shows its agent's definition from
the catalog, live or when last seen; a run paused by a tool that needs a person is found under
"Waiting for you", its calls approved, rejected with a note, answered with fields or an external
result from its page, a refusal said as the API says it (one on a tool a deploy changed too), and
the run seen COMPLETED. That the
page's files need no token and every API route still does: tests/integration/test_api_records.py."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import playwright.sync_api as pw
import pytest
from sqlalchemy import update

import tests.integration.ui_agents  # noqa: F401  (the embedded worker runs its agents)
from orchestrator import Client
from orchestrator.agent import get_agent
from orchestrator.catalog import Definition, describe
from orchestrator.settings import Settings
from orchestrator.store import Store
from orchestrator.store.database import open_engine
from orchestrator.store.tables import runs
from orchestrator.testing.waiting import wait_until
from tests.conftest import make_settings
from tests.integration.browser import CHROMIUM, DEADLINE_MS
from tests.integration.test_api import ApiServer, SharedApi, module_database, shared_api, start_api
from tests.integration.ui_agents import MARKUP, WORDS

APP = "tests.integration.ui_agents"
TOKEN = "ui-test-token-7f3a"


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A database of each kind for this module's tests, which `settings` empties before each one."""
    with module_database(request, request.param, tmp_path_factory.mktemp("db")) as url:
        yield url


@pytest.fixture(scope="module")
def shared(db_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedApi]:
    """The module's server (tokens on), started once per database: `SharedApi` says what keeps its tests apart."""
    log = tmp_path_factory.mktemp("api") / "api.log"
    with shared_api(make_settings(db_url, redis_url), log, env={"RATCHET_API_TOKENS": TOKEN}, app=APP) as served:
        yield served


@pytest.fixture
def settings(shared: SharedApi) -> Settings:
    """The worker's settings are the API server's: its database and queues, emptied for this test."""
    return shared.fresh()


@pytest.fixture
def api(shared: SharedApi, settings: Settings) -> ApiServer:
    return shared.server


def start(api: ApiServer, agent: str, text: str, *, stream: bool = False, until: str | None = None) -> str:
    """Start a run over HTTP, as any client would; with `until`, wait for that status."""
    with api.client(TOKEN) as http:
        started = http.post("/runs", json={"agent": agent, "input": text, "stream": stream})
        assert started.status_code == 202, started.text
        run_id: str = started.json()["run_id"]
        if until is not None:
            done = http.get(f"/runs/{run_id}/wait", params={"timeout": 30}).json()
            assert done["status"] == until, done
    return run_id


def signed_in(page: Any, url: str) -> None:
    """Open the page, which asks for a token (the API answers 401 without one), and give it."""
    page.goto(url)
    page.locator("#token-form").wait_for(state="visible")
    page.fill("#token-input", TOKEN)
    page.click("#token-form button[type=submit]")
    page.locator("#token-form").wait_for(state="hidden")


@pytest.mark.usefixtures("worker")
def test_the_list_shows_runs_live_and_an_error_run_is_continued_to_completion(api: ApiServer, page: Any) -> None:
    failed = start(api, "ui-researcher", "how does celery retry?", until="ERROR")
    signed_in(page, f"{api.url}/ui/")

    row = page.locator(f'tr.run[data-run="{failed}"]')
    pw.expect(row).to_have_attribute("data-status", "ERROR")
    pw.expect(row).to_contain_text("BadRequestError")
    # The list follows new runs without a reload
    later = start(api, "ui-echo", "later", until="COMPLETED")
    pw.expect(page.locator(f'tr.run[data-run="{later}"]')).to_have_attribute("data-status", "COMPLETED")
    # Filtered by status, only the ERROR run
    page.select_option("select[name=status]", "ERROR")
    pw.expect(page.locator("tr.run")).to_have_count(1)
    assert "status=ERROR" in page.url

    row.click()
    pw.expect(page.locator("#run-error")).to_contain_text("the request was refused once")
    pw.expect(page.locator(".msg.tool-error")).to_contain_text("connection refused")
    pw.expect(page.locator(".msg.tool-error .flag")).to_have_text("tool error")
    pw.expect(page.locator(".step.failed")).to_contain_text("model call")
    pw.expect(page.locator(".step").first).to_contain_text("attempt 1")

    page.click("#continue")

    pw.expect(page.locator("body")).to_have_attribute("data-status", "COMPLETED")
    # The batch's two calls run at once and their results are stored as they finish, in either order.
    pw.expect(page.locator(".msg.assistant").last).to_contain_text(re.compile(r"Researched: .*notes on celery"))
    pw.expect(page.locator('.logline[data-kind="continue"]')).to_have_count(1)
    pw.expect(page.locator("#run-error")).to_have_count(0)
    assert page.locator(".step.failed").count() == 1  # the failed step stays in the timeline
    assert TOKEN not in api.log.read_text()  # the token went in headers, never in a logged URL


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the page's part: the stream is tested on both
@pytest.mark.usefixtures("worker")
def test_a_streamed_runs_page_shows_its_text_as_it_is_written_then_the_answer(api: ApiServer, page: Any) -> None:
    signed_in(page, f"{api.url}/ui/")
    run_id = start(api, "ui-writer", "write", stream=True)
    page.goto(f"{api.url}/ui/#/runs/{run_id}")

    pw.expect(page.locator(".live-text pre")).to_contain_text("word1 ")  # before the step committed
    pw.expect(page.locator("body")).to_have_attribute("data-status", "COMPLETED")
    pw.expect(page.locator(".msg.assistant")).to_contain_text(f"word{WORDS - 1}")
    pw.expect(page.locator(".live-text")).to_be_hidden()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the page's part only
@pytest.mark.usefixtures("worker")
def test_run_content_that_is_markup_is_shown_as_text(api: ApiServer, page: Any) -> None:
    run_id = start(api, "ui-echo", "<b>hello</b><script>window.__pwned=3</script>", until="COMPLETED")
    signed_in(page, f"{api.url}/ui/#/runs/{run_id}")

    timeline = page.locator("#timeline")
    pw.expect(page.locator(".msg.tool")).to_contain_text(MARKUP)
    pw.expect(page.locator(".msg.user")).to_contain_text("<b>hello</b><script>")
    # None of the run's markup became elements (the page's own <b>, a log line's kind, may be there)
    assert timeline.locator("img, script").count() == 0 and timeline.locator("b", has_text="hello").count() == 0
    assert page.evaluate("() => window.__pwned") is None


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the page's part: the catalog is the store's
@pytest.mark.usefixtures("worker")
def test_a_runs_page_shows_its_agents_definition_live_and_one_no_worker_serves_as_last_seen(
    api: ApiServer, page: Any, settings: Settings
) -> None:
    run_id = start(api, "ui-echo", "hello", until="COMPLETED")
    signed_in(page, f"{api.url}/ui/#/runs/{run_id}")

    # The worker wrote the agent into the catalog at boot: its model, its tool, the hash the run
    # started with, live
    definition = page.locator("#definition")
    pw.expect(definition).to_have_attribute("data-live", "true")
    pw.expect(definition).to_contain_text("scripted")
    # A model that names no provider (the scripted model) shows as its id alone
    pw.expect(definition.locator("div", has=page.locator("dt", has_text="Model")).locator("dd")).to_have_text(
        "scripted"
    )
    pw.expect(definition.locator("li code")).to_have_text("render_html")
    started_with = Client(settings).get_run(run_id).definition_hash
    assert started_with is not None
    pw.expect(definition.locator(f'dd[title="{started_with}"]')).to_have_text(started_with[:12])

    # A definition no worker has marked seen for two days: shown as not live, with when it was
    gone = Definition.from_body(
        {"name": "ui-gone", "kind": "agent", "model": {"provider": "openai", "id": "gpt-old"}, "tools": []}
    )
    engine = open_engine(settings.database_url)
    try:
        Store(engine, clock=lambda: time.time() - 2 * 86400).catalog.write([gone.served()])
    finally:
        engine.dispose()
    other = Client(settings).start("ui-gone", input="hello").run_id  # no worker serves it: it fails
    page.goto(f"{api.url}/ui/#/runs/{other}")
    pw.expect(page.locator("h1")).to_contain_text("ui-gone")
    pw.expect(definition).to_have_attribute("data-live", "false")
    pw.expect(definition).to_contain_text("not live · last seen")
    pw.expect(definition).to_contain_text("2 d ago")
    pw.expect(definition).to_contain_text("openai / gpt-old")


@pytest.mark.parametrize(
    "db_url", ["sqlite"], indirect=True
)  # the page's part: the rules are tests/unit/test_deploys.py
@pytest.mark.usefixtures("worker")
def test_a_run_a_deploy_stopped_is_continued_under_the_new_definition_from_its_page(
    api: ApiServer, page: Any, settings: Settings
) -> None:
    failed = start(api, "ui-researcher", "how does celery retry?", until="ERROR")
    # Given the run on an older version whose answer had another schema, no worker of it left
    body = describe(get_agent("ui-researcher")).body()
    old = Definition.from_body({**body, "output_schema": {"type": "object", "properties": {}}})
    engine = open_engine(settings.database_url)
    try:
        Store(engine, clock=lambda: time.time() - 3600).catalog.write([old.served()])
        with engine.begin() as conn:
            conn.execute(update(runs).where(runs.c.run_id == failed).values(definition_hash=old.hash))
    finally:
        engine.dispose()
    signed_in(page, f"{api.url}/ui/#/runs/{failed}")

    page.click("#continue")

    pw.expect(page.locator("#run-error")).to_contain_text("DefinitionChangedError")
    pw.expect(page.locator("#run-error")).to_contain_text("its output schema changed")
    new = describe(get_agent("ui-researcher")).hash
    pw.expect(page.locator("#accept-definition")).to_have_text(f"Continue under definition {new[:12]}")
    # Its steps ran on this worker's definition, not the one the run is on now: each says so
    pw.expect(page.locator(".step.failed .definition").last).to_have_text(f"definition {new[:12]} (not the run's now)")

    page.click("#accept-definition")

    pw.expect(page.locator("body")).to_have_attribute("data-status", "COMPLETED")
    pw.expect(page.locator('.logline[data-kind="definition"]')).to_contain_text("accepted by a continue")
    assert Client(settings).get_run(failed).definition_hash == new
    pw.expect(page.locator(".step .definition.flag")).to_have_count(0)


# ---------------------------------------------------------------- a person in the loop


def approvals_of(api: ApiServer, run_id: str) -> list[dict[str, Any]]:
    """The run's requirements waiting for a person, as `GET /approvals` lists them."""
    with api.client(TOKEN) as http:
        answered = http.get("/approvals")
        assert answered.status_code == 200, answered.text
        return [a["requirement"] for a in answered.json()["approvals"] if a["run_id"] == run_id]


@pytest.mark.usefixtures("worker")
def test_a_paused_run_is_found_waiting_for_you_and_its_calls_approved_from_its_page_complete_it(
    api: ApiServer, page: Any
) -> None:
    paused = start(api, "ui-payer", "pay them", until="PAUSED")  # a real tool step paused it
    done = start(api, "ui-echo", "hello", until="COMPLETED")
    signed_in(page, f"{api.url}/ui/")

    page.click("#waiting-nav")
    pw.expect(page.locator(f'tr.run[data-run="{paused}"]')).to_have_attribute("data-status", "PAUSED")
    pw.expect(page.locator(f'tr.run[data-run="{done}"]')).to_have_count(0)
    assert "status=PAUSED" in page.url
    page.click(f'tr.run[data-run="{paused}"]')

    asked = page.locator(".requirement")
    pw.expect(asked).to_have_count(2)
    pw.expect(page.locator("#requirements h2").first).to_contain_text("Waiting for you")
    to_ann, to_bob = asked.filter(has_text='"to": "ann"'), asked.filter(has_text='"to": "bob"')
    pw.expect(to_ann.locator(".tool")).to_have_text("pay")
    pw.expect(to_ann.locator("pre.arguments")).to_contain_text('"amount": 120')
    pw.expect(to_bob.locator("pre.arguments")).to_contain_text('"amount": 75')
    pw.expect(page.locator("#continue")).to_be_disabled()  # its decisions resume it
    page.fill("#decider", "ann")
    to_ann.locator("button[data-action=approve]").click()
    pw.expect(asked).to_have_count(1, timeout=DEADLINE_MS)  # one decided, the run still waits for the other
    pw.expect(page.locator("body")).to_have_attribute("data-status", "PAUSED")
    to_bob.locator("button[data-action=approve]").click()

    pw.expect(page.locator("body")).to_have_attribute("data-status", "COMPLETED", timeout=DEADLINE_MS)
    pw.expect(page.locator(".msg.assistant").last).to_contain_text("paid 120 to ann")
    pw.expect(page.locator(".msg.assistant").last).to_contain_text("paid 75 to bob")
    pw.expect(page.locator("li.decision")).to_have_count(2)
    pw.expect(page.locator("li.decision").first).to_contain_text("approved by ann")
    # The timeline's wait for a person lists both decisions (the log leaves them to that step)
    pw.expect(page.locator("ul.decisions li")).to_have_count(2)
    pw.expect(page.locator("ul.decisions li").first).to_contain_text("confirm by ann")
    pw.expect(page.locator('.logline[data-kind="decision"]')).to_have_count(0)
    assert approvals_of(api, paused) == []
    with api.client(TOKEN) as http:
        stored = http.get(f"/runs/{paused}").json()["requirements"]
    assert {(r["status"], r["decision"]["kind"], r["decided_by"]) for r in stored} == {("decided", "confirm", "ann")}
    assert len(stored) == 2


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the page's part: deadlines are tested on both
@pytest.mark.usefixtures("worker")
def test_a_run_stopped_at_its_deadline_shows_why_on_its_page_and_is_continued_from_there(
    api: ApiServer, page: Any
) -> None:
    with api.client(TOKEN) as http:
        started = http.post("/runs", json={"agent": "ui-payer", "input": "pay them", "run_timeout": 3})
        assert started.status_code == 202, started.text
        run_id, deadline = started.json()["run_id"], started.json()["deadline_at"]
        wait_until(
            lambda: http.get(f"/runs/{run_id}").json()["status"] == "ERROR",
            timeout=30,
            what="the worker's sweeper to stop the paused run at its deadline",
        )
    signed_in(page, f"{api.url}/ui/#/runs/{run_id}")

    pw.expect(page.locator("#run-error")).to_contain_text("RunTimeoutError")
    pw.expect(page.locator("#run-error")).to_contain_text("Continue it")
    pw.expect(page.locator(".facts.panel")).to_contain_text("Deadline")
    page.click("#continue")

    pw.expect(page.locator('.logline[data-kind="continue"]')).to_have_count(1)
    with api.client(TOKEN) as http:
        assert http.get(f"/runs/{run_id}").json()["deadline_at"] > deadline  # given again, from the continue


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the page's part: deciding is tested on both
@pytest.mark.usefixtures("worker")
def test_a_call_rejected_with_a_note_and_a_decision_another_producer_made_first_is_said_as_the_api_refuses_it(
    api: ApiServer, page: Any
) -> None:
    paused = start(api, "ui-payer", "pay them", until="PAUSED")
    signed_in(page, f"{api.url}/ui/#/runs/{paused}")
    asked = page.locator(".requirement")
    pw.expect(asked).to_have_count(2)

    to_ann = asked.filter(has_text='"to": "ann"')
    to_ann.locator("input[name=note]").fill("not this month")
    to_ann.locator("button[data-action=reject]").click()
    pw.expect(asked).to_have_count(1)

    # Another producer approves the other call while this page still shows it (its reads held off)
    page.route(f"{api.url}/runs/{paused}", lambda route: route.abort())
    [other] = approvals_of(api, paused)
    with api.client(TOKEN) as http:
        decided = http.post(f"/runs/{paused}/requirements/{other['id']}", json={"kind": "confirm", "by": "bob"})
        assert decided.status_code == 200, decided.text
        assert http.get(f"/runs/{paused}/wait", params={"timeout": 30}).json()["status"] == "COMPLETED"
    asked.first.locator("button[data-action=reject]").click()
    refusal = asked.first.locator(".outcome.refused")
    pw.expect(refusal).to_have_attribute("data-type", "DecisionConflictError")
    pw.expect(refusal).to_contain_text("by bob")
    page.unroute(f"{api.url}/runs/{paused}")

    # Read again, and redrawn
    pw.expect(page.locator("body")).to_have_attribute("data-status", "COMPLETED", timeout=DEADLINE_MS)
    pw.expect(page.locator(".msg.tool-error")).to_contain_text("not this month")  # what the model read
    pw.expect(page.locator(".msg.assistant").last).to_contain_text("paid 75 to bob")
    pw.expect(page.locator("li.decision.k-reject")).to_contain_text('"to":"ann"')
    pw.expect(page.locator("li.decision.k-reject")).to_contain_text("not this month")
    pw.expect(page.locator("li.decision.k-confirm")).to_contain_text("approved by bob")
    pw.expect(page.locator("li.decision.k-confirm .outcome.refused")).to_contain_text("DecisionConflictError")


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the page's part: deciding is tested on both
@pytest.mark.usefixtures("worker")
def test_an_approval_of_a_tool_a_deploy_changed_is_refused_on_the_page_saying_what_changed(
    api: ApiServer, page: Any, settings: Settings
) -> None:
    paused = start(api, "ui-payer", "pay them", until="PAUSED")
    # A worker of the next version of ui-payer, whose `pay` asks nobody, booted (seen last, live)
    [row] = Client(settings).store.catalog.read("ui-payer")
    body = Definition.from_json(row.definition).body()
    body["tools"] = [{**t, "flags": {}} for t in body["tools"]]
    engine = open_engine(settings.database_url)
    try:
        Store(engine, clock=lambda: time.time() + 3600).catalog.write([Definition.from_body(body).served()])
    finally:
        engine.dispose()
    signed_in(page, f"{api.url}/ui/#/runs/{paused}")
    asked = page.locator(".requirement")
    pw.expect(asked).to_have_count(2)

    asked.first.locator("button[data-action=approve]").click()

    refusal = asked.first.locator(".outcome.refused")
    pw.expect(refusal).to_have_attribute("data-type", "PausedToolChangedError")
    pw.expect(refusal).to_contain_text("tool 'pay' now runs without asking anyone")
    pw.expect(asked).to_have_count(2)  # nothing was stored
    assert len(approvals_of(api, paused)) == 2


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the page's part only
@pytest.mark.usefixtures("worker")
def test_a_calls_fields_are_filled_in_and_an_external_calls_result_given_from_the_page(
    api: ApiServer, page: Any
) -> None:
    paused = start(api, "ui-shipper", "ship it", until="PAUSED")
    signed_in(page, f"{api.url}/ui/#/runs/{paused}")

    mail = page.locator('.requirement[data-pause="user_input"]')
    pw.expect(mail.locator(".tool")).to_have_text("send_mail")
    pw.expect(mail.locator("pre.arguments")).to_contain_text("release notes")
    mail.locator("input[name=recipient]").fill("ann@example.com")
    mail.locator("input[name=copies]").fill("2")
    mail.locator("button[data-action=answer]").click()
    pw.expect(mail).to_have_count(0)

    deploy = page.locator('.requirement[data-pause="external_execution"]')
    pw.expect(deploy.locator("pre.arguments")).to_contain_text("billing")
    deploy.locator("textarea[name=result]").fill("deployed by CI, build 42")
    deploy.locator("button[data-action=result]").click()

    pw.expect(page.locator("body")).to_have_attribute("data-status", "COMPLETED", timeout=DEADLINE_MS)
    answer = page.locator(".msg.assistant").last
    pw.expect(answer).to_contain_text("sent 'release notes' to ann@example.com x2")  # copies as a number
    pw.expect(answer).to_contain_text("deployed by CI, build 42")
    pw.expect(page.locator("li.decision.k-input")).to_contain_text("ann@example.com")


# ---------------------------------------------------------------- without tokens


@pytest.fixture(scope="module")
def shared_tokenless(shared: SharedApi, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    """A server without tokens on the module's database and queues (`settings` empties them)."""
    server = start_api(shared.settings, tmp_path_factory.mktemp("tokenless") / "api.log", app=APP)
    yield server
    server.stop()


@pytest.fixture
def tokenless(shared_tokenless: ApiServer, settings: Settings) -> ApiServer:
    return shared_tokenless


def queued(api: ApiServer) -> str:
    """A run no worker takes: it stays QUEUED until something cancels it."""
    with api.client() as http:
        started = http.post("/runs", json={"agent": "ui-echo", "input": "wait"})
        assert started.status_code == 202, started.text
        return str(started.json()["run_id"])


def status_of(api: ApiServer, run_id: str) -> str:
    with api.client() as http:
        return str(http.get(f"/runs/{run_id}").json()["status"])


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the page's part only
def test_without_tokens_the_pages_of_the_api_itself_still_cancel_a_run(tokenless: ApiServer, page: Any) -> None:
    run_id = queued(tokenless)
    page.goto(f"{tokenless.url}/ui/#/runs/{run_id}")

    pw.expect(page.locator("body")).to_have_attribute("data-status", "QUEUED")
    page.click("#cancel")
    page.click("#cancel")  # a second click within 4 s cancels

    pw.expect(page.locator("body")).to_have_attribute("data-status", "CANCELLED")
    assert page.locator("#token-form").is_hidden()  # no token asked for


#: A page of a site of its own, whose name (as a rebinding attacker's would) resolves to 127.0.0.1.
EVIL = "evil.test"
ATTACK = """<!doctype html><title>attack</title>
<form id="form" method="post" action="{api}/runs/{run_id}/cancel"><input name="x" value="1"></form>
<script>
window.attack = async () => {{
  const seen = {{}};
  await fetch("{api}/runs/{run_id}/cancel", {{method: "POST", mode: "no-cors", body: "x"}}).catch(() => null);
  const read = await fetch("{api}/runs").then(r => r.status, () => "blocked");
  seen.cross = read;
  const rebound = await fetch("/runs");  // this page's own origin: evil.test, rebound to the API
  seen.rebound = [rebound.status, await rebound.text()];
  return seen;
}};
</script>"""


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the page's part only
def test_a_page_of_another_site_can_neither_read_nor_cancel_the_runs_of_a_tokenless_api(
    tokenless: ApiServer, playwright: Any
) -> None:
    run_id = queued(tokenless)
    port = tokenless.url.rsplit(":", 1)[1]
    attacker = f"http://{EVIL}:{port}"
    # Chromium's own Local Network Access checks would stop these requests before they left it;
    # off, it sends them as a browser without those checks (Firefox, Safari, an older Chromium) does.
    browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
        f"--host-resolver-rules=MAP {EVIL} 127.0.0.1",
        "--disable-features=LocalNetworkAccessChecks,BlockInsecurePrivateNetworkRequests",
    ])  # fmt: skip
    try:
        page = browser.new_page()
        page.set_default_timeout(DEADLINE_MS)
        # The attacker's page is served by the browser's route: its origin is evil.test's
        html = ATTACK.format(api=tokenless.url, run_id=run_id)
        page.route(f"{attacker}/attack", lambda route: route.fulfill(content_type="text/html", body=html))
        page.goto(f"{attacker}/attack")

        seen = page.evaluate("() => window.attack()")
        with page.expect_navigation():
            page.evaluate("() => document.getElementById('form').submit()")
        refused_form = page.content()
    finally:
        browser.close()

    # Every one of its requests reached the API and was refused, and the run goes on
    assert seen["cross"] == "blocked"  # the API answered 403, and no CORS header lets the page read it
    assert seen["rebound"][0] == 421 and run_id not in seen["rebound"][1]
    assert "ForeignOrigin" in refused_form
    assert status_of(tokenless, run_id) == "QUEUED"
    log = tokenless.log.read_text()
    assert log.count(f'POST /runs/{run_id}/cancel HTTP/1.1" 403') == 2 and 'GET /runs HTTP/1.1" 421' in log


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the page's part: the store is tested on both
def test_the_schedules_page_lists_each_schedule_with_its_cron_zone_and_next_tick(api: ApiServer, page: Any) -> None:
    with api.client(TOKEN) as http:
        body = {"agent": "ui-echo", "cron": "0 9 * * mon-fri", "timezone": "Europe/Paris", "input": "report"}
        made = http.post("/schedules", json={**body, "schedule_id": "weekday-report"})
        assert made.status_code == 201, made.text
    signed_in(page, f"{api.url}/ui/")
    page.click("a.nav[href='#/schedules']")
    row = page.locator('tr[data-schedule="weekday-report"]')
    pw.expect(row).to_contain_text("0 9 * * mon-fri")
    pw.expect(row).to_contain_text("Europe/Paris")
    pw.expect(row).to_contain_text("ui-echo")
    pw.expect(row.locator("td").nth(5)).to_have_text("-")  # no tick fired yet
