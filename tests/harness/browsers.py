"""The browser of the console's tests: Debian's Chromium driven by Playwright (no browser
download), and the pages they open in it.

The ``browser`` fixture (one Chromium per test module) is ``chromium_browser``: a test module
imports it to use it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

playwright_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = os.environ.get("HERMES_CHROMIUM", "/usr/bin/chromium")


@pytest.fixture(name="browser", scope="module")
def chromium_browser() -> Iterator[Any]:
    with playwright_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM)
        yield chromium
        chromium.close()


def new_page(browser: Any, width: int = 1280) -> Any:
    """A page of its own context, ``width`` pixels wide, that records the errors it raises."""
    context = browser.new_context(viewport={"width": width, "height": 800})
    page = context.new_page()
    page.set_default_timeout(15_000)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.errors = errors
    return page


def close(page: Any) -> None:
    """Close a page of ``new_page``; it must have raised nothing."""
    errors = page.errors
    page.context.close()
    assert not errors, f"the page raised: {errors}"


def send(page: Any, text: str) -> Any:
    """Send ``text`` in the console's chat; the assistant's turn once it is no longer busy."""
    page.fill("textarea[name=message]", text)
    page.keyboard.press("Enter")
    turn = page.locator(".msg.assistant").last
    playwright_api.expect(turn).not_to_have_attribute("aria-busy", "true")
    return turn
