"""The console's chat and badges in a real browser (Debian's Chromium through Playwright, the
service on a real uvicorn): answers drawn as Markdown without ever running the model's markup,
the session picker on the session the chat is in, a failed run shown as a failure, and the
pages usable 400 pixels wide."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from browsers import chromium_browser, close, new_page, send  # noqa: F401  (the browser fixture)
from hermes_agent import Agent, ScriptedModel
from hermes_agent.server import ServiceSettings, create_app
from hermes_agent.types import Message
from server_harness import serve

playwright_api = pytest.importorskip("playwright.sync_api")
expect = playwright_api.expect
CHROMIUM = os.environ.get("HERMES_CHROMIUM", "/usr/bin/chromium")
pytestmark = pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason=f"needs {CHROMIUM}")

MARKDOWN_ANSWER = """\
## Totals

The **sum** is `40`, see _below_:

- first <img src=x onerror="window.pwned=1">
- second [docs](javascript:window.pwned=2)

```python
print("<b>not bold</b>")
```
"""


QUOTES = 150_000
MAX_QUOTE_DEPTH = 32  # markdown.js's bound on nested block quotes


def script(messages: Sequence[Message], _tools: Sequence[dict[str, Any]]) -> str:
    user = str(next(m.content for m in reversed(messages) if m.role == "user"))
    if user == "broken":
        return "<tool_call>{not json</tool_call>"  # never usable: the run fails (502)
    if user == "markdown":
        return MARKDOWN_ANSWER
    if user == "quotes":
        return ">" * QUOTES  # a hostile answer: one line of quote markers
    return f"Hello, you said {user}."


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("console-render")
    # Big chunks: the 150,000-character answer streams in a few dozen deltas, not 37,500.
    model = ScriptedModel(script, chunk_size=4096)
    agent = Agent(model=model, storage=f"sqlite:///{folder / 'state.db'}")
    settings = ServiceSettings(auth="none", approval_policy="wait")
    with serve(create_app(agent=agent, settings=settings)) as address:
        yield address


def test_the_answer_is_markdown_drawn_as_nodes(browser: Any, url: str) -> None:
    page = new_page(browser)
    page.goto(f"{url}/console/#/chat")
    expect(page.locator("main[data-ready=chat]")).to_have_count(1)
    turn = send(page, "markdown")
    answer = turn.locator(".answer")
    expect(answer.locator("h5.md-heading")).to_have_text("Totals")
    expect(answer.locator("strong")).to_have_text("sum")
    expect(answer.locator("p code")).to_have_text("40")
    expect(answer.locator("em")).to_have_text("below")
    expect(answer.locator("ul.md-list li")).to_have_count(2)
    expect(answer.locator("pre.md-code")).to_have_attribute("data-lang", "python")
    expect(answer.locator("pre.md-code")).to_have_text('print("<b>not bold</b>")')
    # The model's markup is text: no element, no handler, no link that runs code.
    expect(answer.locator("img, b, a, script")).to_have_count(0)
    expect(answer.locator("li").first).to_contain_text('<img src=x onerror="window.pwned=1">')
    expect(answer.locator(".md-link")).to_contain_text("docs (javascript:window.pwned=2)")
    assert page.evaluate("window.pwned") is None
    expect(turn.locator(".turn-footer .badge.ok")).to_have_text("done")

    # The same answer read back from the session is drawn the same way.
    page.reload()
    stored = page.locator(".transcript .msg.assistant .body").last
    expect(stored.locator("strong")).to_have_text("sum")
    expect(stored.locator("img")).to_have_count(0)
    close(page)


def test_an_answer_of_150000_quote_markers_is_drawn_within_the_depth_bound(
    browser: Any, url: str
) -> None:
    page = new_page(browser)
    page.goto(f"{url}/console/#/chat")
    expect(page.locator("main[data-ready=chat]")).to_have_count(1)
    turn = send(page, "quotes")
    answer = turn.locator(".answer")
    expect(turn.locator(".turn-footer .badge.ok")).to_have_text("done")
    # Nested as deep as the bound, no deeper; the innermost quote holds the rest as text.
    expect(answer.locator("blockquote")).to_have_count(MAX_QUOTE_DEPTH)
    innermost = answer.locator("blockquote").nth(MAX_QUOTE_DEPTH - 1)
    expect(innermost.locator("blockquote")).to_have_count(0)
    rest = innermost.evaluate("q => q.textContent.length")
    assert rest == QUOTES - MAX_QUOTE_DEPTH  # each level took one marker
    # The renderer itself, timed in the page: bounded work, however many markers.
    took = page.evaluate(
        """async (n) => {
          const { markdown } = await import('/console/markdown.js');
          const start = performance.now();
          markdown('>'.repeat(n));
          markdown('> '.repeat(n / 2));
          return performance.now() - start;
        }""",
        QUOTES,
    )
    assert took < 2_000, f"{took:.0f} ms to draw the quotes"
    # The chat still works after it.
    expect(send(page, "hello").locator(".answer")).to_contain_text("Hello, you said hello.")
    close(page)


def test_the_picker_follows_the_session_the_first_message_starts(browser: Any, url: str) -> None:
    page = new_page(browser)
    page.goto(f"{url}/console/#/chat")
    expect(page.locator("main[data-ready=chat]")).to_have_count(1)
    assert page.eval_on_selector("select[name=session]", "s => s.value") == ""
    send(page, "hello")
    session = page.evaluate("decodeURIComponent(location.hash.split('/')[2])")
    assert session.startswith("chat-")
    assert page.eval_on_selector("select[name=session]", "s => s.value") == session
    # A new session from the button: the picker is on it too.
    page.click("[data-action=new-session]")
    expect(page.locator(".transcript")).to_contain_text("is new")
    fresh = page.evaluate("decodeURIComponent(location.hash.split('/')[2])")
    assert fresh != session
    assert page.eval_on_selector("select[name=session]", "s => s.value") == fresh
    close(page)


def test_a_failed_run_is_a_failure_in_the_chat_and_the_runs_list(browser: Any, url: str) -> None:
    page = new_page(browser)
    page.goto(f"{url}/console/#/chat")
    expect(page.locator("main[data-ready=chat]")).to_have_count(1)
    turn = send(page, "broken")
    expect(turn.locator(".turn-footer .badge.err")).to_have_text("failed 502")
    expect(turn.locator(".turn-footer .badge.ok")).to_have_count(0)
    page.goto(f"{url}/console/#/runs")
    row = page.locator("tr.run-row").first
    expect(row.locator(".badge")).to_have_text("failed")
    expect(row.locator(".badge")).to_have_class("badge err")
    close(page)


def test_a_failed_status_word_is_never_a_green_badge(browser: Any, url: str) -> None:
    page = new_page(browser)
    page.goto(f"{url}/console/#/runs")
    expect(page.locator("main[data-ready=runs]")).to_have_count(1)
    shown = page.evaluate(
        """async () => {
          const { statusBadge } = await import('/console/dom.js');
          const cases = [['completed', 200], ['completed', 502], ['failed'], ['timed_out'],
                         ['cancelled'], ['dead'], ['incomplete']];
          return cases.map(([status, code]) => {
            const b = statusBadge(status, code);
            return [b.textContent, b.className];
          });
        }"""
    )
    assert shown == [
        ["completed", "badge ok"],
        ["failed", "badge err"],
        ["failed", "badge err"],
        ["timed out", "badge err"],
        ["cancelled", "badge err"],
        ["dead", "badge err"],
        ["incomplete", "badge warn"],
    ]
    close(page)


@pytest.mark.parametrize(("route", "ready"), [("#/runs", "runs"), ("#/chat", "chat")])
def test_at_400_pixels_nothing_runs_off_the_page(
    browser: Any, url: str, route: str, ready: str
) -> None:
    page = new_page(browser, width=400)
    page.goto(f"{url}/console/{route}")
    expect(page.locator(f"main[data-ready={ready}]")).to_have_count(1)
    if ready == "runs":
        expect(page.locator("tr.run-row").first).to_be_visible()
    sizes = page.evaluate(
        """() => {
          const header = document.querySelector('header.top');
          const inside = [...header.querySelectorAll('*')].every(
            (el) => el.getBoundingClientRect().right <= window.innerWidth + 0.5);
          return {page: document.documentElement.scrollWidth, width: window.innerWidth,
                  header: header.scrollWidth, headerBox: header.clientWidth, inside};
        }"""
    )
    assert sizes["page"] <= sizes["width"], sizes  # no sideways scrolling of the page
    assert sizes["header"] <= sizes["headerBox"] and sizes["inside"], sizes
    if ready == "runs":
        table = page.evaluate(
            """() => {
              const wrap = document.querySelector('.table-wrap');
              return {overflow: getComputedStyle(wrap).overflowX, scroll: wrap.scrollWidth,
                      box: wrap.clientWidth};
            }"""
        )
        # Each run is a card as wide as the screen, every column kept (test_console_phone).
        assert table["overflow"] == "auto" and table["scroll"] <= table["box"] + 1, table
        expect(page.locator("tr.run-row .col-status .badge").first).to_be_in_viewport()
    close(page)


def test_a_long_line_of_markup_is_shown_as_its_text(browser: Any, url: str) -> None:
    """The renderer's inline pieces are bounded: a line past 4,000 characters (a model
    writing 40,000 "[") is one text node, and ordinary lines keep their markup."""
    page = new_page(browser)
    page.goto(f"{url}/console/#/chat")
    expect(page.locator("main[data-ready=chat]")).to_have_count(1)
    drawn = page.evaluate(
        """async () => {
          const { markdown } = await import("/console/markdown.js");
          const long = "[".repeat(40000) + "x](y)";
          const blocks = markdown(long + "\\n\\nsee [docs](https://example.org) **now**");
          return blocks.map((b) => ({
            text: b.textContent.length,
            links: b.querySelectorAll(".md-link").length,
            strong: b.querySelectorAll("strong").length,
          }));
        }"""
    )
    assert drawn[0] == {"text": 40005, "links": 0, "strong": 0}
    assert drawn[1]["links"] == 1 and drawn[1]["strong"] == 1
    close(page)
