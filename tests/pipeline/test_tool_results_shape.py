"""What the model reads of a tool result: the status and the data or the error, nothing else.

Timings, cache hits, truncation and fallbacks are the caller's business: they are in
``RunResult.tool_calls[i].metadata``, not in the ``<tool_response>`` the model is fed.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from hermes_agent import Agent, ScriptedModel, Tool
from hermes_agent.events import ToolResultsEvent
from hermes_agent.pipeline.context import RunContext
from hermes_agent.protocol.chatml import render_tool_results
from hermes_agent.testing import tool_call as call
from hermes_agent.types import ToolResult

SHAPE = {"status", "data", "error"}
HIDDEN = ("metadata", "execution_time_ms", "cache_hit", "tool_name", "status_code", '"truncated"')


def fed_back(model: ScriptedModel, request: int = 1) -> list[ToolResult]:
    """The tool results in the model's ``request``-th request (0-based)."""
    return model.requests[request].messages[-1].tool_results


def assert_model_view(result: ToolResult) -> None:
    assert set(result.content) == SHAPE
    wire = render_tool_results([result])
    for word in HIDDEN:
        assert word not in wire, (word, wire)


def test_a_success_is_status_and_data_and_the_timings_stay_with_the_caller() -> None:
    model = ScriptedModel([call("add", a=2, b=3), "5"])
    agent = Agent(model=model)

    @agent.tool
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    result = agent.run("2+3")
    (seen,) = fed_back(model)
    assert seen.content == {"status": "success", "data": 5, "error": None}
    assert render_tool_results([seen]) == (
        '<tool_response>\n{"name": "add", "content": {"status": "success", "data": 5, '
        '"error": null}}\n</tool_response>'
    )
    record = result.tool_calls[0]
    assert record.metadata["tool_name"] == "add"
    assert record.metadata["cache_hit"] is False
    assert record.metadata["execution_time_ms"] >= 0


def test_a_cache_hit_reads_exactly_like_the_first_call() -> None:
    model = ScriptedModel([call("lookup", key="a"), "ok", call("lookup", key="a"), "ok"])
    agent = Agent(model=model)

    @agent.tool(cache_ttl=60)
    def lookup(key: str) -> dict[str, str]:
        """Look a key up."""
        return {"key": key, "value": "v"}

    first = agent.run("a").tool_calls[0]
    second = agent.run("a").tool_calls[0]
    assert (first.metadata["cache_hit"], second.metadata["cache_hit"]) == (False, True)
    assert fed_back(model, 1)[0].content == fed_back(model, 3)[0].content
    assert_model_view(fed_back(model, 3)[0])


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_a_call_that_asked_its_caller_is_never_cached(kind: str) -> None:
    """Its result is its caller's own (an MCP caller's roots, say): the next caller, whoever
    it is, runs the tool again. A call that asked nobody is cached as before."""
    from hermes_agent.tools.runtime import asked_caller

    asking, not_asking = [call("whose", ask=True), "ok"], [call("whose", ask=False), "ok"]
    model = ScriptedModel(asking * 2 + not_asking * 2)
    agent = Agent(model=model)
    ran: list[bool] = []

    def body(ask: bool) -> str:
        ran.append(ask)
        if ask:
            asked_caller()
        return "the caller's own" if ask else "anyone's"

    if kind == "async":

        async def whose(ask: bool) -> str:
            """Answer, asking the caller or not."""
            return body(ask)

    else:

        def whose(ask: bool) -> str:
            """Answer, asking the caller or not."""
            return body(ask)

    agent.add_tool(Tool.from_function(whose, cache_ttl=60))
    hits = [agent.run("go").tool_calls[0].metadata["cache_hit"] for _ in range(4)]
    assert ran == [True, True, False]
    assert hits == [False, False, False, True]


def test_a_cut_result_carries_its_note_in_the_data() -> None:
    model = ScriptedModel([call("big"), "ok"])
    agent = Agent(model=model)

    @agent.tool(max_result_chars=20)
    def big() -> list[int]:
        """Many numbers."""
        return list(range(100))

    result = agent.run("go")
    (seen,) = fed_back(model)
    assert_model_view(seen)
    assert seen.content["status"] == "success"
    assert seen.content["data"].startswith("[0, 1, 2, 3, 4, 5, 6… [truncated: the result has 390")
    assert result.tool_calls[0].metadata["truncated"] is True
    assert result.tool_calls[0].result == list(range(100))  # the caller keeps the whole value


def test_a_fallback_is_recorded_for_the_caller_only() -> None:
    model = ScriptedModel([call("live", symbol="X"), "ok"])
    agent = Agent(model=model)

    @agent.tool(check_fn=lambda: False, fallback="cached")
    def live(symbol: str) -> float:
        """Live price."""
        raise AssertionError("must not run")

    @agent.tool
    def cached(symbol: str) -> float:
        """Cached price."""
        return 1.5

    result = agent.run("price")
    (seen,) = fed_back(model)
    assert seen.content == {"status": "success", "data": 1.5, "error": None}
    assert result.tool_calls[0].metadata["fallback_for"] == "live"


def _veto(ctx: RunContext) -> None:
    for plan in list(ctx.planned):
        if plan.tool.name == "vetoed":
            ctx.veto(plan, "not today")


@pytest.mark.parametrize(
    ("reply", "status", "error_start"),
    [
        (call("nope"), 404, "tool 'nope' does not exist"),
        (call("fails", x="one"), 400, "invalid arguments: 'x' must be an integer"),
        (call("fails", x=1), 500, "tool 'fails' raised RuntimeError: broken"),
        (call("slow"), 408, "tool 'slow' timed out after 0.05 s"),
        (call("vetoed"), 403, "call to 'vetoed' was refused: not today"),
        ("<tool_call>\n{not json\n</tool_call>", 400, "could not parse your tool call"),
    ],
)
def test_every_refusal_and_failure_has_the_same_three_keys(
    reply: str, status: int, error_start: str
) -> None:
    model = ScriptedModel([reply, "sorry"])
    agent = Agent(model=model)

    @agent.tool
    def fails(x: int) -> int:
        """Fails."""
        raise RuntimeError("broken")

    @agent.tool(timeout=0.05)
    async def slow() -> str:
        """Slow."""
        await asyncio.sleep(5)  # slow work on purpose: it runs past its timeout
        return "late"

    @agent.tool
    def vetoed() -> str:
        """Never runs."""
        return "ran"

    agent.add_hook("pre_execution", _veto)
    started = time.monotonic()
    agent.run("go")
    assert time.monotonic() - started < 3
    (seen,) = fed_back(model)
    assert seen.status_code == status
    assert seen.content["status"] == "error" and seen.content["data"] is None
    assert seen.content["error"].startswith(error_start), seen.content["error"]
    assert seen.content["error"] == seen.error
    assert_model_view(seen)


def test_streaming_consumers_see_what_the_model_sees() -> None:
    events: list[Any] = []
    model = ScriptedModel([call("echo", text="hi"), "hi"])
    agent = Agent(model=model, tools=[Tool.from_function(echo)])

    async def consume() -> None:
        async for event in agent.astream("say hi"):
            events.append(event)

    asyncio.run(consume())
    (results,) = [e for e in events if isinstance(e, ToolResultsEvent)]
    assert [r.content for r in results.results] == [
        {"status": "success", "data": "hi", "error": None}
    ]


def echo(text: str) -> str:
    """Echo the text."""
    return text


def test_timings_and_cache_flags_stay_in_the_audit_trail() -> None:
    from hermes_agent.storage import InMemoryStorage

    store = InMemoryStorage()
    model = ScriptedModel(
        ['<tool_call>\n{"name": "twice", "arguments": {"n": 2}}\n</tool_call>', "4"]
    )
    agent = Agent(model=model, storage=store)

    @agent.tool(cache_ttl=60)
    def twice(n: int) -> int:
        """Double a number."""
        return 2 * n

    result = agent.run("2 * 2?")
    records = store.records(result.request_id)
    tool = next(r for r in records if r.role == "tool")
    assert "execution_time_ms" not in tool.content and "cache_hit" not in tool.content
    calls = json.loads(next(r for r in records if r.role == "tool_calls").content)
    assert calls[0]["name"] == "twice" and calls[0]["status"] == 200
    assert calls[0]["metadata"]["cache_hit"] is False
    assert calls[0]["metadata"]["execution_time_ms"] >= 0
    assert calls[0]["id"] == result.tool_calls[0].id
