"""`python -m bench.screenshots DIR`: the pictures of the run pages in docs/, taken in headless
Chromium: DIR/ui-runs.png (the list), DIR/ui-run.png (a run in ERROR: its error, its tool error,
its steps), DIR/ui-team.png (a team run: its member runs as a tree), DIR/ui-agents.png (the
agent catalog), DIR/ui-session.png (a session's runs as one conversation), DIR/ui-time.png (a
run's time axis) and DIR/ui-playground.png (a run started and continued from the playground).
Not a test and not part of one (tests never write tracked files): run it by hand after changing
the pages, look at the pictures, commit them.

It fills a SQLite store in a temporary folder with runs of `bench.page_agents`, run through
Ratchet's real steps in this process, and serves it with `ratchet api` (the rig of
`bench.page`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.page import browser, served
from orchestrator.client import Client
from orchestrator.settings import Settings
from orchestrator.testing import in_memory


def fill(database_url: str) -> dict[str, str]:
    """Runs of every status a list shows; the ids of those pictured, by name."""
    from bench import page_agents

    page_agents.transcriber.model.script = page_agents.transcript(4)  # type: ignore[attr-defined]
    settings = Settings(
        database_url=database_url, dispatcher="orchestrator.testing:InMemoryDispatcher", sqlite_synchronous="NORMAL"
    )
    with in_memory(settings) as inline:
        client = Client(settings, store=inline.store)
        done = client.start("researcher", input="Why does Celery redeliver a task?", user_id="ada").run_id
        client.continue_run(done)
        client.start("transcriber", input="Transcribe the stand-up.", session_id="standup-0412", user_id="ben")
        chat = client.start("assistant", input="Why was my task run twice?", session_id="support-1187", user_id="ada")
        again = client.continue_run(chat.run_id, input="Does acks_late change that?").run_id
        team = client.start("crew", input="An article on otters, with sources", user_id="ada").run_id
        client.continue_run(team)
        inline.autorun = False
        client.cancel(client.start("writer", input="Draft the newsletter", user_id="cy").run_id)
        client.start("writer", input="Summarise the incident report", user_id="ben")  # stays QUEUED
        inline.autorun = True
        failed = client.start("researcher", input="How does Celery retry a task?", user_id="ada").run_id
    return {"failed": failed, "team": team, "chat": again}


def shoot(chromium: Any, url: str, path: Path, *, ready: str, full_page: bool) -> None:
    page = chromium.new_page(viewport={"width": 1280, "height": 760})
    try:
        page.goto(url)
        page.wait_for_selector(ready, timeout=30_000)
        page.wait_for_function("() => document.body.dataset.state === 'ready'", timeout=30_000)
        if full_page:  # as tall as the page: what is off screen is not painted (content-visibility)
            height = page.evaluate("() => document.documentElement.scrollHeight")
            page.set_viewport_size({"width": 1280, "height": int(height)})
            page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
        page.screenshot(path=str(path), full_page=full_page)
    finally:
        page.close()


def pages(ids: dict[str, str]) -> dict[str, tuple[str, str, bool]]:
    """Each picture of a page as it opens: its fragment, what shows it is drawn, whether the whole page."""
    return {
        "ui-runs.png": ("", "tr.run", False),
        "ui-run.png": (f"#/runs/{ids['failed']}", "#timeline", True),
        "ui-team.png": (f"#/runs/{ids['team']}", "#timeline", True),
        "ui-agents.png": ("#/agents", "#agents tr[data-agent]", False),
        "ui-session.png": ("#/sessions/support-1187", "#conversation", True),
        "ui-time.png": (f"#/runs/{ids['chat']}/time", "#time-axis", False),
    }


def playground(chromium: Any, url: str, path: Path) -> None:
    """The playground, as a person uses it: a run started with a message, then continued with another."""
    page = chromium.new_page(viewport={"width": 1280, "height": 760})
    try:
        page.goto(url)
        page.wait_for_function("() => document.body.dataset.state === 'ready'", timeout=30_000)
        for n, text in enumerate(("Why was my task run twice?", "Does acks_late change that?"), start=1):
            page.fill("#pg-message", text)
            page.click("#pg-send")
            # Its answer shown, and its stream read to the end
            answered = f"document.querySelectorAll('.turn pre.final').length === {n}"
            read = "!document.getElementById('live').classList.contains('on')"
            page.wait_for_function(f"() => {answered} && {read}", timeout=30_000)
        page.screenshot(path=str(path), full_page=True)
    finally:
        page.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.screenshots", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder to write the pictures to (docs/)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ratchet-shots-") as tmp:
        url = f"sqlite:///{Path(tmp) / 'runs.db'}"
        ids = fill(url)
        with served(url, Path(tmp) / "api.log") as api, browser() as chromium:
            for name, (where, ready, full_page) in pages(ids).items():
                shoot(chromium, f"{api.url}/ui/{where}", args.out / name, ready=ready, full_page=full_page)
            playground(chromium, f"{api.url}/ui/#/playground?agent=assistant", args.out / "ui-playground.png")
    for name in (*pages(ids), "ui-playground.png"):
        print(args.out / name, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
