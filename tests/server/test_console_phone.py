"""The console on a phone and on a desk, in a real browser (Debian's Chromium through
Playwright, the service on a real uvicorn): every run's status in sight at 390 pixels, a hint
when the runs table is wider than its box, Markdown tables drawn as nodes (the ``table`` and
``markdown`` formats' output among them), a partial answer (206) amber everywhere, a run's
error given its own block, and an icon.

Screenshots of each width are written to a temporary folder as the tests go."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from browsers import chromium_browser, close, new_page, send  # noqa: F401  (the browser fixture)
from hermes_agent import Agent, ScriptedModel
from hermes_agent.pipeline.tables import markdown_table
from hermes_agent.server import ServiceSettings, create_app
from hermes_agent.testing import tool_call
from hermes_agent.types import Message
from server_harness import serve

playwright_api = pytest.importorskip("playwright.sync_api")
expect = playwright_api.expect
CHROMIUM = os.environ.get("HERMES_CHROMIUM", "/usr/bin/chromium")
pytestmark = pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason=f"needs {CHROMIUM}")

FLIGHTS = [
    {"flight_no": "CA1234", "dep": {"time": "15:20"}, "delay_minutes": 35, "note": "a | b"},
    {"flight_no": "MU5678", "dep": {"time": "16:05"}, "delay_minutes": 0, "note": "<b>x</b>"},
]
TABLE = markdown_table(FLIGHTS, columns={"flight_no": "航班号", "delay_minutes": "延误(分钟)"})
HOSTILE_TABLE = """\
Here:

| left | middle | right |
|:-----|:------:|------:|
| <img src=x onerror="window.pwned=1"> | **bold** | 3 |
| a \\| b | [docs](javascript:window.pwned=2) |
"""
LONG_SESSION = "s" * 48  # one word: no place to wrap on a narrow table


def shout(text: str) -> str:
    """Say it louder."""
    return text.upper()


def script(messages: Sequence[Message], _tools: Sequence[dict[str, Any]]) -> str:
    user = str(next(m.content for m in reversed(messages) if m.role == "user"))
    if user == "loop":
        return tool_call("shout", text="again")  # never stops: max_iterations ends it, 206
    if user == "broken":
        return "<tool_call>{not json</tool_call>"  # never usable: the run fails (502)
    if user == "table":
        return f"The flights:\n\n{TABLE}"
    if user == "hostile table":
        return HOSTILE_TABLE
    return f"Hello, you said {user}."


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("console-phone")
    model = ScriptedModel(script)
    agent = Agent(
        model=model, tools=[shout], max_iterations=4, storage=f"sqlite:///{folder / 'state.db'}"
    )
    settings = ServiceSettings(auth="none", approval_policy="wait")
    with serve(create_app(agent=agent, settings=settings)) as address:
        with httpx.Client(base_url=address, timeout=30) as client:
            for message, session in [
                ("hello", LONG_SESSION),
                ("loop", "chat-partial"),
                ("broken", "chat-broken"),
            ]:
                answer = client.post("/v1/runs", json={"message": message, "session_id": session})
                assert answer.status_code in (200, 502), answer.text
        yield address


LAYOUT = """() => {
  const wrap = document.querySelector('.table-wrap');
  const rows = [...document.querySelectorAll('tr.run-row')].map((row) => {
    const badge = row.querySelector('.col-status .badge').getBoundingClientRect();
    return {inside: badge.left >= 0 && badge.right <= innerWidth && badge.width > 0,
            top: Math.round(badge.top - row.getBoundingClientRect().top)};
  });
  const heads = [...document.querySelectorAll('table.runs thead th')];
  return {page: document.documentElement.scrollWidth, width: innerWidth, rows,
          wrapScroll: wrap.scrollWidth, wrapBox: wrap.clientWidth,
          hint: !document.querySelector('.scroll-hint').hidden,
          headerShown: document.querySelector('table.runs thead')
            .getBoundingClientRect().height > 1,
          headerLine: new Set(heads.map((th) => Math.round(th.getBoundingClientRect().top))).size};
}"""


def test_at_390_pixels_every_run_shows_its_status(browser: Any, url: str, tmp_path: Path) -> None:
    page = new_page(browser, 390)
    page.goto(f"{url}/console/#/runs")
    expect(page.locator("tr.run-row")).to_have_count(3)
    shown = page.evaluate(LAYOUT)
    page.screenshot(path=str(tmp_path / "runs-390.png"), full_page=True)
    # Each run is a card: its status on the card's first line, inside the screen.
    assert [row["inside"] for row in shown["rows"]] == [True, True, True], shown
    assert all(row["top"] < 40 for row in shown["rows"]), shown
    assert not shown["headerShown"], shown  # the column names are on the cells instead
    assert shown["page"] <= shown["width"], shown  # no sideways scrolling of the page
    assert shown["wrapScroll"] <= shown["wrapBox"] + 1 and not shown["hint"], shown
    # Each cell is named by its column (drawn before it, read out by a screen reader).
    label = page.locator("tr.run-row .col-session").first.evaluate(
        "td => getComputedStyle(td, '::before').content"
    )
    assert label == '"Session: "', label
    close(page)


def test_on_a_desk_the_runs_are_a_table_and_a_hint_says_when_it_scrolls(
    browser: Any, url: str, tmp_path: Path
) -> None:
    page = new_page(browser, 1280)
    page.goto(f"{url}/console/#/runs")
    expect(page.locator("tr.run-row")).to_have_count(3)
    wide = page.evaluate(LAYOUT)
    page.screenshot(path=str(tmp_path / "runs-1280.png"), full_page=True)
    assert wide["headerShown"] and wide["headerLine"] == 1, wide  # eight columns, one line
    assert all(row["inside"] for row in wide["rows"]) and not wide["hint"], wide
    # Narrower than the table (a 48-letter session id cannot wrap): the table scrolls in its
    # box and the hint says so; widened again, the hint goes.
    page.set_viewport_size({"width": 700, "height": 800})
    expect(page.locator(".scroll-hint")).to_be_visible()
    narrow = page.evaluate(LAYOUT)
    page.screenshot(path=str(tmp_path / "runs-700.png"), full_page=True)
    assert narrow["wrapScroll"] > narrow["wrapBox"] and narrow["page"] <= narrow["width"], narrow
    page.set_viewport_size({"width": 1280, "height": 800})
    expect(page.locator(".scroll-hint")).to_be_hidden()
    close(page)


def test_a_partial_answer_is_amber_in_the_list_the_run_and_the_chat(browser: Any, url: str) -> None:
    page = new_page(browser, 390)
    page.goto(f"{url}/console/#/chat/chat-partial-2")
    expect(page.locator("main[data-ready=chat]")).to_have_count(1)
    turn = send(page, "loop")
    chat_badge = turn.locator(".turn-footer .badge")
    expect(chat_badge).to_have_text("partial")
    expect(chat_badge).to_have_class("badge warn")
    page.goto(f"{url}/console/#/runs?session_id=chat-partial-2")
    row = page.locator("tr.run-row")
    expect(row).to_have_count(1)
    expect(row.locator(".col-status .badge")).to_have_text("partial")
    expect(row.locator(".col-status .badge")).to_have_class("badge warn")
    expect(row.locator(".col-status")).to_contain_text("206")
    row.locator(".col-run a").click()
    expect(page.locator("dl.facts .badge")).to_have_text("partial")
    expect(page.locator("dl.facts .badge")).to_have_class("badge warn")
    shown = page.evaluate(
        """async () => {
          const { statusBadge, resultBadge } = await import('/console/dom.js');
          return [statusBadge('completed', 206), resultBadge(206)]
            .map((b) => [b.textContent, b.className]);
        }"""
    )
    assert shown == [["partial", "badge warn"], ["partial", "badge warn"]]
    close(page)


def test_a_runs_error_has_its_own_block_not_the_status_cell(browser: Any, url: str) -> None:
    page = new_page(browser, 390)
    page.goto(f"{url}/console/#/runs?session_id=chat-broken")
    expect(page.locator("tr.run-row")).to_have_count(1)
    page.locator("tr.run-row .col-run a").click()
    error = page.locator(".run-error pre.error")
    expect(error).to_be_visible()
    text = error.text_content() or ""
    assert len(text) > 20, text
    status = page.locator("dl.facts div", has=page.locator("dt", has_text="Status")).locator("dd")
    expect(status.locator(".badge")).to_have_text("failed")
    assert text not in (status.text_content() or "")
    assert (status.text_content() or "").strip() == "failed 502"
    close(page)


@pytest.mark.parametrize("width", [390, 1280])
def test_a_markdown_table_is_drawn_as_a_table(
    browser: Any, url: str, width: int, tmp_path: Path
) -> None:
    page = new_page(browser, width)
    page.goto(f"{url}/console/#/chat")
    expect(page.locator("main[data-ready=chat]")).to_have_count(1)
    table = send(page, "table").locator(".answer table.md-table")
    expect(table.locator("thead th")).to_have_text(["航班号", "dep.time", "延误(分钟)", "note"])
    expect(table.locator("tbody tr")).to_have_count(2)
    expect(table.locator("tbody tr").first.locator("td")).to_have_text(
        ["CA1234", "15:20", "35", "a | b"]
    )
    # Tool data is text: the markup in a cell is shown as its characters.
    expect(table.locator("tbody tr").nth(1).locator("td").last).to_have_text("<b>x</b>")
    expect(table.locator("b")).to_have_count(0)
    page.screenshot(path=str(tmp_path / f"chat-table-{width}.png"), full_page=True)
    sizes = page.evaluate("[document.documentElement.scrollWidth, innerWidth]")
    assert sizes[0] <= sizes[1], sizes  # a wide table scrolls in the bubble, not the page

    turn = send(page, "hostile table")
    hostile = turn.locator(".answer table.md-table")
    expect(hostile.locator("thead th")).to_have_text(["left", "middle", "right"])
    cells = hostile.locator("tbody tr").first.locator("td")
    expect(cells.nth(0)).to_have_text('<img src=x onerror="window.pwned=1">')
    expect(cells.nth(1).locator("strong")).to_have_text("bold")
    classes = hostile.locator("thead th").evaluate_all("ths => ths.map((t) => t.className)")
    assert classes == ["align-left", "align-center", "align-right"]
    # A short row is filled out with empty cells; "\\|" is a pipe, not a column.
    expect(hostile.locator("tbody tr").nth(1).locator("td")).to_have_text(
        ["a | b", "docs (javascript:window.pwned=2)", ""]
    )
    expect(turn.locator(".answer img, .answer a, .answer script")).to_have_count(0)
    assert page.evaluate("window.pwned") is None
    expect(turn.locator(".answer p").first).to_have_text("Here:")
    close(page)


def test_tables_are_bounded(browser: Any, url: str) -> None:
    """Past 64 columns the lines are a paragraph; a 15,000-row table, a line of 100,000
    pipes and 10,000 would-be headers are drawn in bounded time."""
    page = new_page(browser, 1280)
    page.goto(f"{url}/console/#/chat")
    expect(page.locator("main[data-ready=chat]")).to_have_count(1)
    shown = page.evaluate(
        """async () => {
          const { markdown, MAX_TABLE_COLUMNS } = await import('/console/markdown.js');
          const row = (n, cell) => '|' + Array(n).fill(cell).join('|') + '|';
          const table = (n) => markdown(row(n, 'a') + '\\n' + row(n, '-'));
          const wide = table(MAX_TABLE_COLUMNS + 1);
          const widest = table(MAX_TABLE_COLUMNS);
          const start = performance.now();
          const rows = Array(15000).fill('| 1 | 2 |');
          const long = markdown(['| a | b |', '|---|---|', ...rows].join('\\n'));
          markdown('|'.repeat(100000) + '\\n' + '-|'.repeat(50000));
          markdown(Array(10000).fill('a | b\\n-x-').join('\\n'));
          return {took: performance.now() - start, wide: wide[0].tagName,
                  widest: widest[0].querySelectorAll('th').length,
                  rows: long[0].querySelectorAll('tbody tr').length};
        }"""
    )
    assert shown["wide"] == "P" and shown["widest"] == 64, shown
    assert shown["rows"] == 15000, shown
    assert shown["took"] < 3_000, shown
    close(page)


def test_the_console_has_an_icon(browser: Any, url: str) -> None:
    for path in ("/favicon.ico", "/console/favicon.svg"):
        answer = httpx.get(f"{url}{path}")
        assert answer.status_code == 200, path
        assert answer.headers["content-type"] == "image/svg+xml"
        assert answer.text.startswith("<svg")
    page = new_page(browser, 1280)
    page.goto(f"{url}/console/#/runs")
    expect(page.locator("link[rel=icon]")).to_have_attribute("href", "/console/favicon.svg")
    close(page)
