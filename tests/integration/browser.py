"""The run pages' browser for their tests (a plugin of tests/conftest.py): Debian's headless
Chromium, driven by Playwright (never a browser download), one launch per test module, and a
page per test in a context of its own that fails its test if the page's script threw.
tests/integration/test_ui.py and test_console.py use it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("RATCHET_TEST_CHROMIUM", "/usr/bin/chromium")
#: Seconds a page condition may take: a run of a few steps, or the list's next poll (3 s).
DEADLINE_MS = 20_000


@pytest.fixture(scope="module")
def playwright() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: `make test` installs Debian's chromium (tests/services.sh)")
    from playwright.sync_api import sync_playwright  # here: the tests without a page do not load it

    with sync_playwright() as running:
        yield running


@pytest.fixture(scope="module")
def chromium(playwright: Any) -> Iterator[Any]:
    browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
    yield browser
    browser.close()


@pytest.fixture
def page(chromium: Any) -> Iterator[Any]:
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(DEADLINE_MS)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    context.close()
    assert errors == [], f"the page's script failed: {errors}"
