"""`python -m bench.screenshots DIR`: the pictures of the run pages in docs/, taken in headless
Chromium: DIR/ui-runs.png (the list), DIR/ui-run.png (a run in ERROR: its error, its tool error,
its steps) and DIR/ui-team.png (a team run: its member runs as a tree). Not a test and not part
of one (tests never write tracked files): run it by hand after changing the page, look at the
pictures, commit them.

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
        team = client.start("crew", input="An article on otters, with sources", user_id="ada").run_id
        client.continue_run(team)
        inline.autorun = False
        client.cancel(client.start("writer", input="Draft the newsletter", user_id="cy").run_id)
        client.start("writer", input="Summarise the incident report", user_id="ben")  # stays QUEUED
        inline.autorun = True
        failed = client.start("researcher", input="How does Celery retry a task?", user_id="ada").run_id
    return {"failed": failed, "team": team}


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.screenshots", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder to write the pictures to (docs/)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ratchet-shots-") as tmp:
        url = f"sqlite:///{Path(tmp) / 'runs.db'}"
        ids = fill(url)
        with served(url, Path(tmp) / "api.log") as api, browser() as chromium:
            shoot(chromium, f"{api.url}/ui/", args.out / "ui-runs.png", ready="tr.run", full_page=False)
            shoot(chromium, f"{api.url}/ui/#/runs/{ids['failed']}", args.out / "ui-run.png", ready="#timeline",
                  full_page=True)  # fmt: skip
            shoot(chromium, f"{api.url}/ui/#/runs/{ids['team']}", args.out / "ui-team.png", ready="#timeline",
                  full_page=True)  # fmt: skip
    for name in ("ui-runs.png", "ui-run.png", "ui-team.png"):
        print(args.out / name, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
