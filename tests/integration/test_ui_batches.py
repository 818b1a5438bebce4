"""The list of runs' batch in headless Chromium (as tests/integration/test_ui.py drives it: `ratchet
api` in a uvicorn subprocess with a token, a real worker, SQLite and PostgreSQL): runs picked by
their checkboxes are continued together, a refused one said with the API's reason while the others
go on; the "Failed" filter shows the runs in ERROR, every one picked at once and cancelled."""

from __future__ import annotations

from typing import Any

import playwright.sync_api as pw
import pytest

from tests.integration.test_api import ApiServer
from tests.integration.test_ui import (  # noqa: F401  (the fixtures, as the run pages' tests make them)
    TOKEN,
    api,
    db_url,
    settings,
    shared,
    signed_in,
    start,
)


@pytest.fixture
def served(request: pytest.FixtureRequest) -> tuple[ApiServer, Any]:
    """The API server and a browser page, as tests/integration/test_ui.py makes them."""
    return request.getfixturevalue("api"), request.getfixturevalue("page")


def status_of(server: ApiServer, run_id: str) -> str:
    with server.client(TOKEN) as http:
        status: str = http.get(f"/runs/{run_id}").json()["status"]
    return status


@pytest.mark.usefixtures("worker")
def test_runs_picked_in_the_list_are_continued_or_cancelled_together_each_outcome_said_on_its_own(
    served: tuple[ApiServer, Any],
) -> None:
    server, browser = served
    failed = [start(server, "ui-researcher", f"topic {i}", until="ERROR") for i in range(3)]
    done = start(server, "ui-echo", "done", until="COMPLETED")
    signed_in(browser, f"{server.url}/ui/")
    pw.expect(browser.locator("tr.run")).to_have_count(4)
    pw.expect(browser.locator("#batch-continue")).to_be_disabled()

    # When a failed run and a completed one are picked, and continued together
    browser.check(f'input.pick[data-run="{failed[0]}"]')
    browser.check(f'input.pick[data-run="{done}"]')
    assert "#/runs/" not in browser.url  # a checkbox picks the run, it does not open it
    pw.expect(browser.locator("#batch-count")).to_have_text("2 selected")
    browser.click("#batch-continue")

    # Then the failed one goes on and completes, and the completed one is refused, saying why
    pw.expect(browser.locator("#batch-outcome .summary")).to_have_text("Continued 1 · refused 1")
    refusal = browser.locator(f'#batch-outcome li[data-run="{done}"]')
    pw.expect(refusal).to_contain_text("RunNotContinuableError")
    pw.expect(refusal).to_contain_text("a batch continues runs in place only")
    pw.expect(browser.locator(f'tr.run[data-run="{failed[0]}"]')).to_have_attribute("data-status", "COMPLETED")
    pw.expect(browser.locator(f'input.pick[data-run="{done}"]')).to_be_checked()  # the refused one stays picked
    assert status_of(server, done) == "COMPLETED"

    # And under "Failed", the runs still in ERROR are picked at once and cancelled
    browser.click("#failed")
    pw.expect(browser.locator("tr.run")).to_have_count(2)
    assert "status=ERROR" in browser.url
    browser.check("#pick-all")
    pw.expect(browser.locator("#batch-count")).to_have_text("2 selected")
    browser.click("#batch-cancel")
    pw.expect(browser.locator("#batch-outcome .summary")).to_have_text("Cancelled 2 · refused 0")
    pw.expect(browser.locator("td.empty")).to_have_text("No runs match.")
    assert [status_of(server, run_id) for run_id in failed[1:]] == ["CANCELLED", "CANCELLED"]
    pw.expect(browser.locator("#batch-cancel")).to_be_disabled()
