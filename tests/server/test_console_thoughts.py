"""A thinking model in the web console, in a real browser (Debian's Chromium driven by
Playwright) against the service on a real uvicorn: the chat shows each ``<think>`` thought in
its own box and never in the answer, a pre-opened thought (a bare ``</think>``) moves what was
first shown as the answer into that box, and the run view shows each step's thought and notes.
"""

from __future__ import annotations

import asyncio
import queue
import shutil
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from browsers import chromium_browser  # noqa: F401  (the browser fixture)
from hermes_agent import Agent, ScriptedModel
from hermes_agent.models.base import ModelSettings
from hermes_agent.protocol.parser import NOTE_CALL_IN_THOUGHT, NOTE_REVEALED_THOUGHT
from hermes_agent.server import ServiceSettings, create_app
from hermes_agent.tools.registry import Tool
from hermes_agent.types import Message, StreamChunk
from server_harness import call, poll_run, serve
from test_console import CHROMIUM, PAYLOAD, open_console

playwright_api = pytest.importorskip("playwright.sync_api")
expect = playwright_api.expect
expect.set_options(timeout=15_000)

pytestmark = pytest.mark.skipif(
    shutil.which(CHROMIUM) is None,
    reason=f"needs Chromium at {CHROMIUM} (apt-get install chromium)",
)

# What the model thinks before it answers: it considers a call, which must never run.
THOUGHT = (
    "The user asks about Rome. Maybe " + call("lookup", city="Rome") + "? No: I know it. " + PAYLOAD
)
ANSWER = "It is sunny in Rome."
# A template that opened <think> in the prompt: the thought streams first as if it were text,
# with a call in it, and only the bare </think> tells what it was.
PRE_OPENED = "The user wants rain. " + call("lookup", city="Oslo")
PRE_ANSWER = "No rain today."


def script(messages: Sequence[Message], _tools: Sequence[dict[str, Any]]) -> str:
    """``think`` → a thought holding a call, then the answer; ``pre`` → a pre-opened thought;
    ``delete`` → a thought, then a call that waits for approval; after a tool → ``done``."""
    if messages[-1].role == "tool":
        return "<think>The file is gone.</think>done"
    user = str(next(m.content for m in reversed(messages) if m.role == "user"))
    if user == "think":
        return f"<think>{THOUGHT}</think>\n\n{ANSWER}"
    if user == "pre":
        return f"{PRE_OPENED}\n</think>\n\n{PRE_ANSWER}"
    if user == "delete":
        return "<think>I must ask before deleting.</think>" + call("delete_file", path="/a")
    return "Hello."


class SlowStream(ScriptedModel):
    """Streams each completion a few characters at a time, 20 ms apart, so the page sees it
    grow (and shows the pre-opened thought as text before the </think> arrives)."""

    async def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        settings: ModelSettings,
    ) -> AsyncIterator[StreamChunk]:
        async for chunk in super().stream(messages, tools, settings):
            await asyncio.sleep(0.02)  # a model's pace: the thoughts arrive over time
            yield chunk


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    ran: list[str] = []

    def lookup(city: str) -> str:
        """The weather in a city."""
        ran.append(city)
        return f"sunny in {city}"

    def delete_file(path: str) -> str:
        """Delete a file (pretend)."""
        return f"deleted {path}"

    built = Agent(model=SlowStream(script, chunk_size=4), storage=f"sqlite:///{tmp_path / 's.db'}")
    built.add_tool(Tool.from_function(lookup))
    built.add_tool(Tool.from_function(delete_file, requires_approval=True))
    yield built
    assert ran == [], "a call written inside a thought ran"


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 860}, color_scheme="light")
    page = context.new_page()
    page.set_default_timeout(15_000)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    yield page
    context.close()
    assert not errors, f"the page raised: {errors}"
    assert dialogs == [], "model text ran as markup"


def local() -> ServiceSettings:
    return ServiceSettings(auth="none", approval_policy="wait")


WATCH_ANSWER = """() => {
  window.seen = [];
  new MutationObserver(() => {
    const answer = [...document.querySelectorAll('.msg.assistant .answer')].pop();
    if (answer) window.seen.push(answer.textContent);
  }).observe(document.querySelector('.transcript'),
             {subtree: true, childList: true, characterData: true});
}"""


def send(page: Any, text: str) -> Any:
    page.fill("textarea[name=message]", text)
    page.keyboard.press("Enter")
    turn = page.locator(".msg.assistant").last
    expect(turn.locator(".turn-footer")).to_contain_text("done")
    return turn


def test_the_chat_shows_the_thought_in_its_own_box_never_in_the_answer(
    page: Any, agent: Agent, tmp_path: Path
) -> None:
    with serve(create_app(agent=agent, settings=local())) as url:
        open_console(page, url, "#/chat", "chat")
        page.evaluate(WATCH_ANSWER)
        turn = send(page, "think")

        expect(turn.locator(".answer")).to_have_text(ANSWER)
        box = turn.locator("details.thought-box")
        expect(box).to_be_visible()
        expect(box.locator("summary")).to_have_text("Thought")
        box.locator("summary").click()
        # The whole thought, its call and its markup as text: nothing in it ran or rendered.
        expect(box.locator("pre.thought")).to_have_text(THOUGHT)
        expect(box.locator(".thought-note")).to_have_text(NOTE_CALL_IN_THOUGHT)
        assert box.locator("img, script").count() == 0
        expect(turn.locator(".call-chip")).to_have_count(0)
        # Not even for a moment did the answer show any of the thought.
        seen = [text for text in page.evaluate("window.seen") if text]
        assert seen, "the answer never streamed"
        assert all(ANSWER.startswith(text.strip()) for text in seen), seen


def test_a_pre_opened_thought_moves_from_the_answer_into_the_thought_box(
    page: Any, agent: Agent
) -> None:
    with serve(create_app(agent=agent, settings=local())) as url:
        open_console(page, url, "#/chat", "chat")
        page.evaluate(WATCH_ANSWER)
        turn = send(page, "pre")

        expect(turn.locator(".answer")).to_have_text(PRE_ANSWER)
        thought = turn.locator("details.thought-box pre.thought")
        expect(thought).to_have_count(1)
        expect(thought).to_have_attribute("data-revealed", "true")
        expect(thought).to_have_text(PRE_OPENED)
        notes = turn.locator(".thought-note")
        expect(notes).to_have_text([NOTE_REVEALED_THOUGHT, NOTE_CALL_IN_THOUGHT])
        # The call streamed before </think> was withdrawn with the text around it.
        expect(turn.locator(".call-chip")).to_have_count(0)
        seen = [text.strip() for text in page.evaluate("window.seen")]
        assert "The user wants rain." in seen  # it was shown as the answer at first
        last = max(i for i, text in enumerate(seen) if "user wants" in text)
        # Then the reveal took it out, and the real answer grew on its own from nothing (in
        # several pieces, so the deltas did it, not the final result).
        grown = [text for text in seen[last + 1 :] if text]
        assert all(PRE_ANSWER.startswith(text) for text in grown), grown
        assert len(set(grown) - {PRE_ANSWER}) >= 2, grown


def test_the_run_view_shows_each_steps_thought_and_notes(page: Any, agent: Agent) -> None:
    with serve(create_app(agent=agent, settings=local())) as url:
        client = httpx.Client(base_url=url, timeout=30)
        thinking = client.post("/v1/runs", json={"message": "think"}).json()["request_id"]
        pre = client.post("/v1/runs", json={"message": "pre"}).json()["request_id"]

        view = client.get(f"/v1/console/runs/{thinking}").json()
        (step,) = view["steps"]
        assert (step["thought"], step["notes"]) == (THOUGHT, [NOTE_CALL_IN_THOUGHT])
        assert step["calls"] == []

        open_console(page, url, f"#/runs/{thinking}")
        step_card = page.locator("section.step")
        expect(step_card).to_have_count(1)
        expect(step_card.locator("pre.thought[aria-label=thought]")).to_have_text(THOUGHT)
        expect(step_card.locator("ul.notes li")).to_have_text([NOTE_CALL_IN_THOUGHT])
        completion = step_card.locator("pre[aria-label='raw completion']")
        # The call inside the thought is marked as part of the thought, not as a call.
        expect(completion.locator(".hl-think")).to_contain_text("The user asks about Rome.")
        expect(completion.locator(".hl-tool-call")).to_have_count(0)
        expect(page.locator("section.output pre")).to_have_text(ANSWER)
        assert page.locator("main img, main script").count() == 0

        page.goto(f"{url}/console/#/runs/{pre}")
        step_card = page.locator("section.step")
        expect(step_card.locator("pre.thought")).to_have_text(PRE_OPENED)
        expect(step_card.locator("ul.notes li")).to_have_text(
            [NOTE_REVEALED_THOUGHT, NOTE_CALL_IN_THOUGHT]
        )
        completion = step_card.locator("pre[aria-label='raw completion']")
        expect(completion.locator(".hl-think.pre-opened")).to_contain_text("The user wants rain.")
        expect(completion.locator(".hl-tool-call")).to_have_count(0)
        expect(page.locator("section.output pre")).to_have_text(PRE_ANSWER)


def test_the_live_events_list_thought_deltas_and_the_steps_thought(page: Any, agent: Agent) -> None:
    with serve(create_app(agent=agent, settings=local())) as url:
        client = httpx.Client(base_url=url, timeout=30)
        # Deltas are for a caller who streams the run: one does, in the background, while
        # the console watches the same run.
        started: queue.Queue[str] = queue.Queue()

        def follow() -> None:
            body = {"message": "delete", "stream": True}
            with client.stream("POST", "/v1/runs", json=body) as reply:
                started.put(reply.headers["x-run-id"])
                for _ in reply.iter_lines():
                    pass

        following = threading.Thread(target=follow, daemon=True)
        following.start()
        request_id = started.get(timeout=30)

        open_console(page, url, f"#/runs/{request_id}")
        log = page.locator(".live-log")
        expect(log).to_be_visible()
        expect(log.locator("li[data-kind=thought]").first).to_contain_text("thought of")
        page.locator("article.approval [data-action=approve]").click()
        expect(page.locator("dl.facts")).to_contain_text("completed")
        deltas = log.locator("li[data-kind=thought_delta]")
        expect(deltas).to_have_count(2)  # one line per model turn's streamed thought
        expect(deltas.first).to_contain_text("I must ask before deleting.")
        expect(deltas.nth(1)).to_contain_text("The file is gone.")
        # The run view redrew: both steps show their thoughts.
        expect(page.locator("section.step pre.thought")).to_have_text(
            ["I must ask before deleting.", "The file is gone."]
        )
        assert poll_run(client, request_id)["result"]["output"] == "done"
        following.join(timeout=10)
