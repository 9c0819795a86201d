"""The web console in a real browser: Debian's Chromium driven by Playwright (no browser
download) against the service on a real uvicorn on loopback, with a scripted model.

Screenshots of each view are taken as the tests go: into a temporary folder, or into
``docs/img/console-*.png`` when ``HERMES_UPDATE_SCREENSHOTS=1`` (so a normal run leaves the
checkout as it found it)::

    HERMES_UPDATE_SCREENSHOTS=1 pytest tests/server/test_console.py
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import shutil
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from browsers import chromium_browser  # noqa: F401  (the browser fixture)
from hermes_agent import Agent, Pricing, ScriptedModel
from hermes_agent.models.base import ModelResponse, ModelSettings
from hermes_agent.runs.keys import MemoryKeyStore
from hermes_agent.server import ServiceSettings, create_app
from hermes_agent.server.routes_console import CONTENT_SECURITY_POLICY
from hermes_agent.tools.registry import Tool
from hermes_agent.types import Message, StreamChunk
from server_harness import call, delete_file, poll_run, serve

playwright_api = pytest.importorskip("playwright.sync_api")
expect = playwright_api.expect
expect.set_options(timeout=15_000)

CHROMIUM = os.environ.get("HERMES_CHROMIUM", "/usr/bin/chromium")
pytestmark = pytest.mark.skipif(
    shutil.which(CHROMIUM) is None,
    reason=f"needs Chromium at {CHROMIUM} (apt-get install chromium)",
)
DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"
ASSETS = Path(__file__).resolve().parents[2] / "src" / "hermes_agent" / "server" / "console"
PAYLOAD = "<script>alert(1)</script><img src=x onerror=alert(2)>"
GREETING = (
    "Hello! I am the scripted model of these tests; this answer arrives in small pieces, "
    "a few characters at a time, so the page has to show it growing."
)


# -- the agent the console shows ---------------------------------------------------------


def _tool_text(messages: Sequence[Message]) -> str:
    results = messages[-1].tool_results
    content = results[0].content if results else messages[-1].content
    if isinstance(content, dict):  # the envelope the model reads: status, data, error
        content = content.get("data") if content.get("error") is None else content["error"]
    return str(content)


def script(messages: Sequence[Message], _tools: Sequence[dict[str, Any]]) -> str:
    """``weather CITY`` → a scratch pad and a lookup call; ``delete PATH`` → a call that needs
    approval; ``xss`` → a tool whose result holds markup; ``mixed`` → an unknown tool and a
    lookup in one turn; anything else → ``GREETING``."""
    user = str(next(m.content for m in reversed(messages) if m.role == "user"))
    if messages[-1].role == "tool":
        return f"done: {_tool_text(messages)}"
    words = user.split()
    if words[0] == "weather":
        return (
            f"<scratch_pad>Goal: the weather in {words[1]}. Action: lookup.</scratch_pad>\n"
            + call("lookup", city=words[1])
        )
    if words[0] == "delete":
        return call("delete_file", path=words[1])
    if words[0] == "xss":
        return call("echo", text=PAYLOAD)
    if words[0] == "mixed":  # a call the selector refuses beside one that runs
        return call("no_such_tool", x=1) + "\n" + call("lookup", city="Rome")
    return GREETING


class SlowStream(ScriptedModel):
    """Streams each completion a few characters at a time, 30 ms apart (and takes as long to
    give it whole, for a run nobody streams)."""

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        settings: ModelSettings,
    ) -> ModelResponse:
        response = await super().complete(messages, tools, settings)
        # A model's pace, as a real model answers.
        await asyncio.sleep(0.03 * max(1, -(-len(response.text) // self.chunk_size)))
        return response

    async def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        settings: ModelSettings,
    ) -> AsyncIterator[StreamChunk]:
        async for chunk in super().stream(messages, tools, settings):
            await asyncio.sleep(0.03)  # a streaming model's pace
            yield chunk


def lookup(city: str) -> str:
    """The weather in a city."""
    time.sleep(0.3)  # a tool that takes a moment, as a real lookup does
    return f"sunny in {city}"


def lookup_today(city: str) -> str:
    """The weather in a city."""  # the same tool as the model saw it; it answers otherwise
    return f"rainy in {city}"


def echo(text: str) -> str:
    """Say it back."""
    return f"echo: {text}"


def make_agent(tmp_path: Path) -> Agent:
    agent = Agent(
        model=SlowStream(script, chunk_size=4),
        storage=f"sqlite:///{tmp_path / 'state.db'}",
        pricing=Pricing(prompt_per_1k=0.5, completion_per_1k=1.5),
    )
    agent.add_tool(Tool.from_function(lookup, cache_ttl=60, idempotent=True))
    agent.add_tool(Tool.from_function(delete_file, requires_approval=True))
    agent.add_tool(Tool.from_function(echo))
    return agent


def local(**overrides: Any) -> ServiceSettings:
    return ServiceSettings(auth="none", approval_policy="wait", **overrides)


# -- the browser ---------------------------------------------------------------------------


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 860}, color_scheme="light")
    page = context.new_page()
    page.set_default_timeout(15_000)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    context.close()
    assert not errors, f"the page raised: {errors}"


def screenshot(page: Any, name: str, tmp_path: Path) -> Path:
    """``console-<name>.png``: in docs/img with HERMES_UPDATE_SCREENSHOTS=1, else in tmp."""
    folder = DOCS_IMG if os.environ.get("HERMES_UPDATE_SCREENSHOTS") == "1" else tmp_path
    path = folder / f"console-{name}.png"
    page.evaluate("window.scrollTo(0, 0)")  # the sticky header stays on top of the picture
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000  # a picture of something, not a blank page
    return path


def open_console(page: Any, url: str, route: str = "#/runs", ready: str = "runs") -> None:
    page.goto(f"{url}/console/{route}")
    expect(page.locator(f"main[data-ready={ready}]")).to_have_count(1)


# -- tests ---------------------------------------------------------------------------------


def test_runs_list_filters_and_a_run_shows_five_stages_per_step(page: Any, tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    with serve(create_app(agent=agent, settings=local())) as url:
        client = httpx.Client(base_url=url, timeout=30)
        first = client.post("/v1/runs", json={"message": "weather Paris", "session_id": "trip"})
        again = client.post("/v1/runs", json={"message": "weather Paris", "session_id": "trip"})
        chat = client.post("/v1/runs", json={"message": "hello", "session_id": "small-talk"})
        ids = [r.json()["request_id"] for r in (first, again, chat)]

        open_console(page, url)
        rows = page.locator("tr.run-row")
        expect(rows).to_have_count(3)
        # Newest first.
        assert [rows.nth(i).get_attribute("data-request-id") for i in range(3)] == ids[::-1]
        expect(rows.nth(0)).to_contain_text("small-talk")
        expect(rows.nth(1).locator("code.chip")).to_have_text(["lookup"])
        screenshot(page, "runs", tmp_path)

        # Filters: by tool, by session (a click on the session), by status, by time.
        page.fill("input[name=tool]", "lookup")
        page.click("form.filters button[type=submit]")
        expect(rows).to_have_count(2)
        page.click("form.filters [data-action=clear]")
        expect(rows).to_have_count(3)
        page.locator("tr.run-row a", has_text="small-talk").click()
        expect(rows).to_have_count(1)
        assert page.input_value("input[name=session_id]") == "small-talk"
        page.goto(f"{url}/console/#/runs?status=failed")
        expect(page.locator("td.empty")).to_have_text("No runs match.")
        page.goto(f"{url}/console/#/runs?since={int(time.time()) + 3600}")
        expect(page.locator("td.empty")).to_have_count(1)
        page.goto(f"{url}/console/#/runs?since={int(time.time()) - 3600}&tool=lookup")
        expect(rows).to_have_count(2)

        # Keyboard: "/" goes to the first filter; a run opens with Enter; j moves by step.
        page.keyboard.press("Escape")
        page.locator("main h1").focus()
        page.keyboard.press("/")
        assert page.evaluate("document.activeElement.name") == "session_id"
        page.locator(f"a[href='#/runs/{ids[1]}']").focus()
        page.keyboard.press("Enter")
        expect(page.locator("main[data-ready=runs] section.step")).to_have_count(2)
        page.locator("main h1").focus()
        page.keyboard.press("j")
        assert page.evaluate("document.activeElement.dataset.step") == "0"
        page.keyboard.press("j")
        assert page.evaluate("document.activeElement.dataset.step") == "1"

        # Five stage rows per step; a bar with its status code for each stage that ran,
        # exactly the stages the audit trail recorded for that step.
        trace = client.get(f"/v1/runs/{ids[1]}/trace").json()["records"]
        steps = page.locator("section.step")
        for index in range(2):
            step = steps.nth(index)
            expect(step.locator(".stage-row")).to_have_count(5)
            recorded = list(  # the stages, not the service's own records (accepted)
                dict.fromkeys(
                    r["stage"] for r in trace if r["step"] == index and r["stage"] != "RunManager"
                )
            )
            ran = step.locator(".stage-row:not(.skipped)")
            assert [ran.nth(i).get_attribute("data-stage") for i in range(ran.count())] == recorded
            expect(step.locator(".stage-bar")).to_have_count(len(recorded))
            expect(step.locator(".stage-row:not(.skipped) .code-cell")).to_have_text(
                ["200"] * len(recorded)
            )
        first_step = steps.nth(0)
        assert [
            first_step.locator(".stage-row").nth(i).get_attribute("data-stage") for i in range(5)
        ] == ["InputParser", "ThoughtGenerator", "ToolSelector", "ToolExecutor", "OutputRenderer"]
        expect(first_step.locator(".stage-row.skipped")).to_have_attribute(
            "data-stage", "OutputRenderer"
        )
        # The bars are drawn to scale: their widths are in the ratio of the stages' latencies.
        page.goto(f"{url}/console/#/runs/{ids[0]}")
        expect(page.locator("section.step")).to_have_count(2)
        bars = page.locator("section.step").nth(0).locator(".stage-bar")
        widths = [bars.nth(i).bounding_box()["width"] for i in range(4)]
        view = client.get(f"/v1/console/runs/{ids[0]}").json()
        latency = [s["latency_ms"] for s in view["steps"][0]["stages"][:4]]
        assert latency[1] > 200 and latency[3] > 250  # a slow model turn, a 0.3 s tool
        assert widths[3] / widths[1] == pytest.approx(latency[3] / latency[1], rel=0.05)

        # The raw completion with its tags marked; the prompt as sent; the call in full.
        step = page.locator("section.step").nth(0)
        completion = step.locator("pre[aria-label='raw completion']")
        expect(completion.locator(".hl-scratch-pad")).to_contain_text("Goal: the weather in Paris")
        expect(completion.locator(".hl-tool-call")).to_contain_text('"name": "lookup"')
        step.locator("summary", has_text="Prompt").click()
        expect(step.locator("pre[aria-label=prompt] .hl-tools").last).to_contain_text(
            '"name": "lookup"'
        )
        call_card = step.locator("article.call")
        expect(call_card.locator("pre.args")).to_contain_text('"city": "Paris"')
        expect(call_card.locator("pre.result")).to_have_text("sunny in Paris")
        expect(call_card).to_contain_text("ran in")
        expect(call_card).to_contain_text("not cached")
        expect(page.locator("dl.facts")).to_contain_text("prompt +")
        expect(page.locator("dl.facts")).to_contain_text("$0.0")
        expect(page.locator("section.output pre")).to_have_text("done: sunny in Paris")
        screenshot(page, "run", tmp_path)

        # The second identical call came from the tool's cache.
        page.goto(f"{url}/console/#/runs/{ids[1]}")
        expect(page.locator("section.step").nth(0).locator("article.call")).to_contain_text(
            "cache hit"
        )

        # Export as JSON Lines: the run's records, as the API exports them.
        with page.expect_download() as download:
            page.click("[data-action=export]")
        exported = Path(download.value.path()).read_text(encoding="utf-8").splitlines()
        assert len(exported) == len(trace)
        assert {json.loads(line)["request_id"] for line in exported} == {ids[1]}

        # Dark, from the reader's system setting.
        page.emulate_media(color_scheme="dark")
        background = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert background == "rgb(20, 22, 26)", background
        screenshot(page, "run-dark", tmp_path)


def test_approve_a_pending_call_and_watch_the_run_finish(page: Any, tmp_path: Path) -> None:
    with serve(create_app(agent=make_agent(tmp_path), settings=local())) as url:
        client = httpx.Client(base_url=url, timeout=30)
        waiting = []
        for path in ("/srv/report.txt", "/srv/keep.txt"):  # two sessions: neither waits
            reply = client.post("/v1/runs", json={"message": f"delete {path}"})
            assert reply.status_code == 202, reply.text
            waiting.append(reply.json())

        open_console(page, url, "#/approvals", "approvals")
        cards = page.locator("article.approval")
        expect(cards).to_have_count(2)
        expect(page.locator("#approval-count")).to_have_text("2")
        approve_card = page.locator(
            f"article[data-approval-id='{waiting[0]['pending_approvals'][0]['approval_id']}']"
        )
        deny_card = page.locator(
            f"article[data-approval-id='{waiting[1]['pending_approvals'][0]['approval_id']}']"
        )
        expect(approve_card.locator("pre.args")).to_contain_text('"path": "/srv/report.txt"')
        expect(approve_card).to_contain_text("delete_file")
        screenshot(page, "approvals", tmp_path)

        approve_card.locator("input[name=reason]").fill("checked by ops")
        approve_card.locator("[data-action=approve]").click()
        expect(approve_card.locator(".approval-status")).to_contain_text("checked by ops")
        # The run resumes live under the card and finishes.
        expect(approve_card.locator("li.ev-result")).to_contain_text("deleted /srv/report.txt")
        deny_card.locator("input[name=reason]").fill("keep it")
        deny_card.locator("[data-action=deny]").click()
        expect(deny_card.locator("li.ev-result")).to_contain_text("completed")
        screenshot(page, "approvals-answered", tmp_path)

        approved = poll_run(client, waiting[0]["request_id"])
        assert approved["status"] == "completed"
        assert approved["result"]["output"] == "done: deleted /srv/report.txt"
        (answer,) = approved["result"]["approvals"]
        assert (answer["arguments"], answer["approved"]) == ({"path": "/srv/report.txt"}, True)
        denied = poll_run(client, waiting[1]["request_id"])
        assert denied["result"]["tool_calls"][0]["status_code"] == 403
        expect(page.locator("#approval-count")).to_be_hidden()

        # The run view shows each decision beside its call.
        page.goto(f"{url}/console/#/runs/{waiting[0]['request_id']}")
        expect(page.locator("article.call")).to_contain_text("approved")
        expect(page.locator("article.call")).to_contain_text("checked by ops")
        page.goto(f"{url}/console/#/runs/{waiting[1]['request_id']}")
        expect(page.locator("article.call")).to_contain_text("refused")
        expect(page.locator("article.call")).to_contain_text("keep it")


def test_a_run_waiting_for_approval_is_approved_from_its_own_view(
    page: Any, tmp_path: Path
) -> None:
    with serve(create_app(agent=make_agent(tmp_path), settings=local())) as url:
        client = httpx.Client(base_url=url, timeout=30)
        reply = client.post("/v1/runs", json={"message": "delete /srv/a.txt"})
        request_id = reply.json()["request_id"]
        open_console(page, url)
        expect(page.locator("tr.run-row a[href='#/approvals']")).to_have_text("1 waiting")
        page.goto(f"{url}/console/#/runs/{request_id}")
        expect(page.locator(".live-log")).to_be_visible()
        page.locator("article.approval [data-action=approve]").click()
        # The view follows the run live and redraws when it ends.
        expect(page.locator("dl.facts")).to_contain_text("completed")
        expect(page.locator("section.output pre")).to_have_text("done: deleted /srv/a.txt")
        expect(page.locator("section.step")).to_have_count(2)


def test_chat_streams_the_answer_and_the_calls(page: Any, tmp_path: Path) -> None:
    with serve(create_app(agent=make_agent(tmp_path), settings=local())) as url:
        open_console(page, url, "#/chat", "chat")
        page.click("[data-action=new-session]")
        expect(page.locator("main[data-ready=chat] .transcript")).to_contain_text("is new")
        session = page.evaluate("decodeURIComponent(location.hash.split('/')[2])")
        assert session.startswith("chat-")
        # Every text the answer shows on its way, as the page draws it.
        page.evaluate(
            """() => {
              window.seen = [];
              new MutationObserver(() => {
                const answer = document.querySelector('.msg.assistant .answer');
                if (answer) window.seen.push(answer.textContent);
              }).observe(document.querySelector('.transcript'),
                         {subtree: true, childList: true, characterData: true});
            }"""
        )
        page.fill("textarea[name=message]", "hello there")
        page.keyboard.press("Enter")
        turn = page.locator(".msg.assistant").last
        expect(turn.locator(".turn-footer")).to_contain_text("done")
        expect(turn.locator(".answer")).to_have_text(GREETING)
        seen = [text for text in page.evaluate("window.seen") if text]
        partial = [text for text in dict.fromkeys(seen) if text != GREETING]
        assert len(partial) >= 5, partial  # it grew in many steps, each a prefix of the next
        assert all(GREETING.startswith(text) for text in partial)
        assert int(turn.locator(".answer").get_attribute("data-deltas")) >= 10

        # A message that calls a tool: the call and its result show as they happen.
        page.fill("textarea[name=message]", "weather Oslo")
        page.keyboard.press("Enter")
        turn = page.locator(".msg.assistant").last
        expect(turn.locator(".call-chip[data-tool=lookup]")).to_contain_text('{"city":"Oslo"}')
        expect(turn.locator(".call-chip pre.result")).to_contain_text("sunny in Oslo")
        expect(turn.locator(".answer")).to_have_text("done: sunny in Oslo")
        expect(turn.locator(".scratch-box")).to_be_attached()
        expect(turn.locator(".turn-footer")).to_contain_text("done")
        screenshot(page, "chat", tmp_path)

        # The session picker lists the session, and picking it shows the conversation.
        page.goto(f"{url}/console/#/runs")
        page.goto(f"{url}/console/#/chat")
        expect(page.locator("select[name=session] option")).to_have_count(2)
        page.select_option("select[name=session]", session)
        expect(page.locator(".transcript .msg.user")).to_have_count(2)
        expect(page.locator(".transcript")).to_contain_text("done: sunny in Oslo")


def test_markup_in_tool_results_and_ids_is_shown_as_text(page: Any, tmp_path: Path) -> None:
    dialogs: list[str] = []

    def dismiss(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", dismiss)
    session = "<img src=x onerror=alert(3)>"
    with serve(create_app(agent=make_agent(tmp_path), settings=local())) as url:
        client = httpx.Client(base_url=url, timeout=30)
        request_id = client.post("/v1/runs", json={"message": "xss", "session_id": session}).json()[
            "request_id"
        ]
        open_console(page, url)
        expect(page.locator("tr.run-row")).to_contain_text(session)
        page.goto(f"{url}/console/#/runs/{request_id}")
        result = page.locator("article.call pre.result")
        expect(result).to_have_text(f"echo: {PAYLOAD}")
        expect(page.locator("section.output pre")).to_have_text(f"done: echo: {PAYLOAD}")
        expect(page.locator("dl.facts")).to_contain_text(session)
        # The streamed path too: the chat shows the same result as it arrives.
        open_console(page, url, "#/chat", "chat")
        page.fill("textarea[name=message]", "xss")
        page.keyboard.press("Enter")
        expect(page.locator(".msg.assistant .answer")).to_have_text(f"done: echo: {PAYLOAD}")
        expect(page.locator(".call-chip pre.result")).to_contain_text(PAYLOAD)
        # A first message without a session started one, which the address now names.
        started = page.evaluate("decodeURIComponent(location.hash.split('/')[2])")
        messages = client.get(f"/v1/sessions/{started}").json()["messages"]
        assert [m["content"] for m in messages if m["role"] == "user"] == ["xss"]
        page.wait_for_timeout(300)
        assert page.locator("main script, main img").count() == 0
        assert page.locator("script").count() == 1  # the console's own module
    assert dialogs == []


def test_replay_shows_the_diff_after_a_tool_changed(page: Any, tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    with serve(create_app(agent=agent, settings=local())) as url:
        client = httpx.Client(base_url=url, timeout=30)
        request_id = client.post("/v1/runs", json={"message": "weather Lima"}).json()["request_id"]
        open_console(page, url, f"#/runs/{request_id}")
        page.click("[data-action=replay]")
        report = page.locator("section.replay-report")
        expect(report).to_have_class(re.compile("matched"))
        expect(report.locator(".verdict")).to_contain_text("all 2 steps do the same today")

        # Today the tool answers differently: the replay says where and how.
        agent.add_tool(
            Tool.from_function(lookup_today, name="lookup", idempotent=True), replace=True
        )
        page.click("[data-action=replay]")
        expect(report).to_have_class(re.compile("differs"))
        expect(report.locator(".verdict")).to_contain_text("first at step 0")
        changed = report.locator(".replay-step.differs")
        expect(changed).to_have_count(1)
        expect(changed.locator(".differences")).to_contain_text("tool results differ")
        expect(changed.locator(".diff-old")).to_contain_text("sunny in Lima")
        expect(changed.locator(".diff-new")).to_contain_text("rainy in Lima")
        # The model's recorded answer is served again, so the last step reads the same.
        expect(report.locator(".replay-step.matched")).to_have_attribute("data-step", "1")
        report.scroll_into_view_if_needed()
        screenshot(page, "replay", tmp_path)

        # The endpoint itself: the same report as JSON; a call that needs approval is not run
        # again on its old answer.
        body = client.post(f"/v1/runs/{request_id}/replay").json()
        assert (body["matched"], body["first_difference"]) == (False, 0)
        waiting = client.post("/v1/runs", json={"message": "delete /srv/b.txt"}).json()
        approval = waiting["pending_approvals"][0]["approval_id"]
        assert client.post(f"/v1/runs/{waiting['request_id']}/replay").status_code == 409
        client.post(f"/v1/approvals/{approval}", json={"approved": True})
        poll_run(client, waiting["request_id"])
        replayed = client.post(f"/v1/runs/{waiting['request_id']}/replay").json()
        assert replayed["matched"] is False
        assert replayed["result"]["tool_calls"][0]["status_code"] == 403
        assert client.post("/v1/runs/nope/replay").status_code == 404


def test_with_keys_the_console_asks_for_one_and_shows_only_the_callers_runs(
    page: Any, tmp_path: Path
) -> None:
    keys = MemoryKeyStore()
    alice, bob = keys.create("alice"), keys.create("bob")
    settings = ServiceSettings(auth="keys")
    with serve(create_app(agent=make_agent(tmp_path), settings=settings, keys=keys)) as url:
        mine = httpx.post(
            f"{url}/v1/runs",
            json={"message": "hello"},
            headers={"Authorization": f"Bearer {alice}"},
        ).json()["request_id"]
        theirs = httpx.post(
            f"{url}/v1/runs", json={"message": "hello"}, headers={"Authorization": f"Bearer {bob}"}
        ).json()["request_id"]
        page.goto(f"{url}/console/")
        expect(page.locator("main[data-ready=key]")).to_have_count(1)
        screenshot(page, "key", tmp_path)
        page.fill("input[name=key]", "hk_0000000000000000.not-a-real-key-at-all")
        page.keyboard.press("Enter")
        expect(page.locator("main .alert")).to_contain_text("not accepted")
        page.fill("input[name=key]", alice)
        page.keyboard.press("Enter")
        expect(page.locator("main[data-ready=runs] tr.run-row")).to_have_count(1)
        assert page.locator("tr.run-row").get_attribute("data-request-id") == mine
        expect(page.locator("#who")).to_contain_text("alice")
        assert page.evaluate("sessionStorage.getItem('hermes-console-key')") == alice
        page.goto(f"{url}/console/#/runs/{theirs}")
        expect(page.locator("main .alert")).to_contain_text(f"no run '{theirs}'")
        page.click("[data-action=forget-key]")
        expect(page.locator("main[data-ready=key]")).to_have_count(1)
        assert page.evaluate("sessionStorage.getItem('hermes-console-key')") is None


def test_the_console_is_served_from_the_package_with_a_strict_policy(tmp_path: Path) -> None:
    with serve(create_app(agent=make_agent(tmp_path), settings=local())) as url:
        client = httpx.Client(base_url=url, timeout=30)
        assert client.get("/").headers["location"] == "/console/"
        page = client.get("/console/")
        assert page.headers["content-type"] == "text/html; charset=utf-8"
        assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert "script-src 'self'" in CONTENT_SECURITY_POLICY
        assert "unsafe" not in CONTENT_SECURITY_POLICY
        assert page.headers["x-content-type-options"] == "nosniff"
        # Every module the page loads is served, as JavaScript, from this origin.
        modules = {"app.js"}
        for source in ASSETS.glob("*.js"):
            modules |= set(re.findall(r'from "\./([a-z]+\.js)"', source.read_text()))
        for name in [*sorted(modules), "console.css"]:
            asset = client.get(f"/console/{name}")
            assert asset.status_code == 200, name
            assert asset.headers["content-type"].split(";")[0] in ("text/javascript", "text/css")
        for bad in ("nope.js", "..%2Froutes_console.py", "app.py", "index.html.bak"):
            assert client.get(f"/console/{bad}").status_code == 404, bad
        # The console fetches nothing from elsewhere and never parses data as HTML.
        for source in ASSETS.iterdir():
            # An SVG names its namespace by address; nothing is fetched from it.
            text = source.read_text(encoding="utf-8").replace(
                'xmlns="http://www.w3.org/2000/svg"', ""
            )
            assert "http://" not in text and "https://" not in text, source.name
            for risky in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write"):
                assert risky not in text or source.name == "dom.js", (source.name, risky)
            assert "eval(" not in text and "new Function" not in text, source.name
        # The console's own endpoints are in the API schema (documented like the others).
        paths = client.get("/openapi.json").json()["paths"]
        for path in ("/v1/console/me", "/v1/console/runs", "/v1/approvals"):
            assert path in paths
        assert "/v1/runs/{request_id}/replay" in paths
        assert "/console/" not in paths


def test_the_console_page_example_prints_what_it_says(tmp_path: Path) -> None:
    docs = (DOCS_IMG.parent / "console.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"```python\n(.*?)```", docs, re.S)
    promised = [line.split("  # ", 1)[1] for line in block.splitlines() if "print(" in line]
    keys = MemoryKeyStore()
    key = keys.create("alice")
    agent = make_agent(tmp_path)
    # The approval stays unanswered: shut down without waiting for it.
    settings = ServiceSettings(auth="keys", approval_policy="wait", shutdown_grace_s=0.2)
    with serve(create_app(agent=agent, settings=settings, keys=keys)) as url:
        client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30)
        request_id = client.post("/v1/runs", json={"message": "weather Lima"}).json()["request_id"]
        agent.add_tool(
            Tool.from_function(lookup_today, name="lookup", idempotent=True), replace=True
        )
        assert client.post("/v1/runs", json={"message": "delete /srv/old.txt"}).status_code == 202
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(block, {"url": url, "key": key, "request_id": request_id})
    assert printed.getvalue().splitlines() == promised


def test_the_run_view_pairs_each_call_with_its_decision_and_result(tmp_path: Path) -> None:
    """A refused call beside one that ran: each keeps its own arguments, status and result,
    from memory and, after a restart, from the store alone."""
    with serve(create_app(agent=make_agent(tmp_path), settings=local())) as url:
        client = httpx.Client(base_url=url, timeout=30)
        request_id = client.post("/v1/runs", json={"message": "mixed"}).json()["request_id"]
        live = client.get(f"/v1/console/runs/{request_id}").json()
    with serve(create_app(agent=make_agent(tmp_path), settings=local())) as url:  # restarted
        client = httpx.Client(base_url=url, timeout=30)
        stored = client.get(f"/v1/console/runs/{request_id}").json()
        assert client.get("/v1/console/runs/nope").status_code == 404
        listed = client.get("/v1/console/runs", params={"tool": "no_such_tool"}).json()["runs"]
    assert (live["source"], stored["source"]) == ("memory", "store")
    assert live["usage"]["total_tokens"] > 0 and stored["usage"] is None
    assert [r["request_id"] for r in listed] == [request_id]
    assert listed[0]["tools"] == ["lookup", "no_such_tool"]
    for view in (live, stored):
        # The pipeline's records describe the run, not the service's record that accepted it.
        assert len(view["system_prompt_sha256"] or "") == 64 and view["model"], view
        assert view["status"] == "completed" and view["user_message"] == "mixed"
        assert view["status_code"] == 200
        assert [step["step"] for step in view["steps"]] == list(range(len(view["steps"])))
        refused, ran = view["steps"][0]["calls"]
        assert (refused["name"], refused["refused"], refused["status_code"]) == (
            "no_such_tool",
            True,
            404,
        )
        assert refused["arguments"] == {"x": 1} and "no_such_tool" in refused["error"]
        assert (ran["name"], ran["ran"], ran["status_code"]) == ("lookup", True, 200)
        assert ran["arguments"] == {"city": "Rome"} and ran["result"] == "sunny in Rome"
        assert ran["execution_time_ms"] >= 300 and ran["cache_hit"] is False
        stages = view["steps"][0]["stages"]
        assert [s["stage"] for s in stages if s["ran"]] == [
            "InputParser",
            "ThoughtGenerator",
            "ToolSelector",
            "ToolExecutor",
        ]
        assert next(s for s in stages if s["stage"] == "ToolSelector")["status_code"] == 206
        assert view["output"].startswith("done: ") and view["status"] == "completed", view["output"]
