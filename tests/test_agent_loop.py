"""The agent loop with a ScriptedModel: every ending has its documented status and message."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from hermes_agent import (
    Agent,
    HermesAgentError,
    Memory,
    Message,
    ScriptedModel,
    Status,
    ToolExecution,
)
from hermes_agent.testing import tool_call as call


def make_agent(script: list[str], **options: object) -> tuple[Agent, ScriptedModel]:
    model = ScriptedModel(script)
    agent = Agent(model=model, **options)  # type: ignore[arg-type]

    @agent.tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    return agent, model


def test_tool_call_then_answer() -> None:
    agent, model = make_agent([call("add", a=2, b=3), "2 + 3 = 5"])
    result = agent.run("What is 2 + 3?")
    assert result.status == 200
    assert result.output == "2 + 3 = 5"
    assert [(c.name, c.arguments, c.result) for c in result.tool_calls] == [
        ("add", {"a": 2, "b": 3}, 5)
    ]
    assert len(result.steps) == 2 and result.usage.requests == 2
    # The second request carried the tool result back to the model.
    last = model.requests[1].messages[-1]
    assert last.role == "tool" and last.tool_results[0].content["data"] == 5
    assert last.tool_results[0].content["status"] == "success"
    assert result.request_id and result.session_id and result.duration_ms > 0


def test_plain_answer_without_tools() -> None:
    agent, _ = make_agent(["Hello! How can I help?"])
    result = agent.run("Hi")
    assert (result.status, result.output, result.tool_calls) == (200, "Hello! How can I help?", [])


def test_unknown_tool_is_fed_back_with_available_names() -> None:
    agent, model = make_agent([call("multiply", a=2, b=3), call("add", a=2, b=3), "5"])
    result = agent.run("2+3?")
    assert result.status == 200 and result.output == "5"
    first = result.tool_calls[0]
    assert first.status_code == 404
    assert first.error == "tool 'multiply' does not exist; available tools: add"
    fed_back = model.requests[1].messages[-1].tool_results[0]
    assert fed_back.content["status"] == "error"
    assert fed_back.status_code == 404 and fed_back.content["data"] is None


def test_invalid_arguments_are_fed_back_and_retried() -> None:
    agent, model = make_agent([call("add", a=2), call("add", a=2, b=3), "5"])
    result = agent.run("2+3?")
    assert result.status == 200
    assert result.tool_calls[0].status_code == 400
    assert "missing required argument 'b'" in (result.tool_calls[0].error or "")
    assert result.tool_calls[1].result == 5
    assert "missing required argument 'b'" in model.requests[1].messages[-1].tool_results[0].error


def test_malformed_json_is_fed_back_then_the_retry_is_bounded() -> None:
    broken = '<tool_call>\n{"name": "add", "arguments": {"a": 2,, }\n</tool_call>'
    agent, model = make_agent([broken] * 5, max_retries=2)
    result = agent.run("2+3?")
    assert result.status == 502
    assert "no usable tool call in 3 turns in a row" in (result.error or "")
    assert len(model.requests) == 3
    # The model saw its own malformed text verbatim, followed by the parse error.
    replay = model.requests[1].messages
    assert replay[-2].raw == broken
    assert "could not parse your tool call" in replay[-1].tool_results[0].content["error"]


def test_a_tool_that_raises_becomes_a_500_result() -> None:
    agent, _ = make_agent([call("boom"), "It failed, sorry."])

    @agent.tool
    def boom() -> None:
        """Always fails."""
        raise RuntimeError("disk on fire")

    result = agent.run("go")
    assert result.status == 200 and result.output == "It failed, sorry."
    assert result.tool_calls[0].status_code == 500
    assert result.tool_calls[0].error == "tool 'boom' raised RuntimeError: disk on fire"


def test_a_tool_that_times_out_becomes_a_408_result() -> None:
    agent, _ = make_agent(
        [call("slow"), "Too slow."], tool_execution=ToolExecution(default_timeout=0.2)
    )

    @agent.tool
    def slow() -> str:
        """Sleeps."""
        time.sleep(2)  # slow work on purpose: it runs past its timeout
        return "done"

    started = time.monotonic()
    result = agent.run("go")
    assert time.monotonic() - started < 1.5
    assert result.tool_calls[0].status_code == 408
    assert result.tool_calls[0].error == "tool 'slow' timed out after 0.2 s"
    assert result.output == "Too slow."


def test_async_tool_timeout_uses_the_tool_setting() -> None:
    agent, _ = make_agent([call("nap"), "ok"])

    @agent.tool(timeout=0.1)
    async def nap() -> str:
        """Sleeps asynchronously."""
        await asyncio.sleep(5)  # slow work on purpose: it runs past its timeout
        return "rested"

    result = agent.run("go")
    assert result.tool_calls[0].status_code == 408


def test_max_iterations_reached_gives_an_honest_206() -> None:
    agent, _ = make_agent([call("add", a=1, b=1)] * 3, max_iterations=3)
    result = agent.run("loop forever")
    assert result.status == 206
    assert result.output.startswith("I stopped after 3 steps (max_iterations=3)")
    assert 'add({"a": 1, "b": 1}) → 2' in result.output


def test_several_calls_in_one_turn_run_concurrently() -> None:
    barrier = threading.Barrier(3, timeout=2)
    agent, model = make_agent([call("meet", n=1) + call("meet", n=2) + call("meet", n=3), "met"])

    @agent.tool
    def meet(n: int) -> int:
        """Waits until all three calls are running at once."""
        barrier.wait()
        return n

    result = agent.run("go")
    assert [c.result for c in result.tool_calls] == [1, 2, 3]
    tool_message = model.requests[1].messages[-1]
    assert [r.content["data"] for r in tool_message.tool_results] == [1, 2, 3]


def test_empty_message_is_a_400() -> None:
    agent, model = make_agent([])
    result = agent.run("   ")
    assert result.status == 400
    assert result.output == "the message is empty; ask a question or give an instruction"
    assert model.requests == []


def test_model_failure_is_a_502_not_a_crash() -> None:
    agent, _ = make_agent([])
    result = agent.run("hi")
    assert result.status == 502
    assert "ran out of responses" in (result.error or "")


def test_tool_choice_must_name_a_visible_tool() -> None:
    agent, _ = make_agent(["x"])
    with pytest.raises(HermesAgentError, match="tool_choice 'nope' is not a visible tool"):
        agent.run("hi", tool_choice="nope")


def test_forced_tool_choice_applies_to_the_first_turn_only() -> None:
    agent, model = make_agent([call("add", a=1, b=2), "3"])
    agent.run("1+2", tool_choice="add")
    assert [r.settings.tool_choice for r in model.requests] == ["add", "auto"]


def test_toolsets_limit_what_the_model_sees() -> None:
    agent, model = make_agent([call("secret"), "ok"])

    @agent.tool(toolset="admin")
    def secret() -> str:
        """Admin only."""
        return "s3cret"

    result = agent.run("go", toolsets=["default"])
    assert [t["function"]["name"] for t in model.requests[0].tools] == ["add"]
    assert result.tool_calls[0].status_code == 404
    assert "is not available in this session" in (result.tool_calls[0].error or "")


def test_sessions_keep_history_apart_and_follow_ups_see_it() -> None:
    def answer(messages: list[Message], tools: object) -> str:
        users = [m.content for m in messages if m.role == "user"]
        return " | ".join(users)

    agent = Agent(model=ScriptedModel(answer))
    agent.run("I am Ada", session_id="a")
    agent.run("I am Bob", session_id="b")
    assert agent.run("Who am I?", session_id="a").output == "I am Ada | Who am I?"
    assert agent.run("Who am I?", session_id="b").output == "I am Bob | Who am I?"


def test_history_window_keeps_recent_turns_and_a_bounded_summary() -> None:
    seen: list[list[Message]] = []

    def answer(messages: list[Message], tools: object) -> str:
        seen.append(list(messages))
        return f"answer {len(seen)}"

    memory = Memory(history_window=10, summary_max_chars=200)
    agent = Agent(model=ScriptedModel(answer), memory=memory)
    for turn in range(25):
        agent.run(f"question {turn}", session_id="s")
    last = seen[-1]
    assert sum(1 for m in last if m.role == "user") == 11  # 10 past turns + the new one
    summary = last[0]
    assert summary.role == "system" and summary.content.startswith("Earlier in this conversation")
    assert len(summary.content) <= 200
    assert "question 13" in summary.content  # the most recent folded turn
    assert "question 14" not in summary.content  # kept verbatim instead


def test_run_works_inside_a_running_event_loop() -> None:
    agent, _ = make_agent(["hi"])

    async def inside() -> str:
        return agent.run("hello").output

    assert asyncio.run(inside()) == "hi"


def test_astream_yields_deltas_calls_and_the_result() -> None:
    agent, _ = make_agent([call("add", a=2, b=3), "The answer is 5."])

    async def collect() -> list:
        return [event async for event in agent.astream("2+3")]

    events = asyncio.run(collect())
    kinds = [e.kind for e in events]
    assert kinds[0] == "input" and kinds[-1] == "result"
    parsed = [e for e in events if e.kind == "tool_call_parsed"]
    assert parsed[0].data["name"] == "add" and parsed[0].data["arguments"] == {"a": 2, "b": 3}
    text = "".join(e.data["text"] for e in events if e.kind == "text_delta")
    assert text == "The answer is 5."
    assert events[-1].data["result"].output == "The answer is 5."
    assert events[-1].data["result"].status == Status.OK


def test_dry_run_plans_validated_calls_and_runs_nothing() -> None:
    ran: list[int] = []
    agent, _ = make_agent([call("record", n="7") + call("record")])

    @agent.tool
    def record(n: int) -> int:
        """Records that it ran."""
        ran.append(n)
        return n

    result = agent.run("go", dry_run=True)
    assert ran == []
    assert result.loop_status == "dry_run_complete" and result.status == 200
    assert [(c.name, c.arguments, c.result, c.status_code) for c in result.tool_calls] == [
        ("record", {"n": 7}, None, 200),
        ("record", {}, None, 400),
    ]
    # A dry run leaves no trace in the session.
    assert agent.sessions.load(result.session_id) == []


def test_a_run_cancelled_while_waiting_for_its_session_does_not_lock_it_for_good() -> None:
    agent, _ = make_agent(["first", "second"])
    lock = agent.sessions.lock("s")

    async def scenario() -> str:
        lock.acquire()  # another run holds the session
        waiting = asyncio.create_task(agent.arun("x", session_id="s"))
        await asyncio.sleep(0.05)  # the run reaches the held lock (no event marks it)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        lock.release()
        result = await asyncio.wait_for(agent.arun("hello", session_id="s"), 5)
        return result.output

    assert asyncio.run(scenario()) == "first"


def test_calls_sharing_an_id_are_kept_apart() -> None:
    twin = '<tool_call>{"id": "c1", "name": "add", "arguments": {"a": %d, "b": %d}}</tool_call>'
    agent, model = make_agent([twin % (1, 2) + twin % (5, 5), "done"])
    result = agent.run("two sums")
    fed_back = model.requests[1].messages[-1].tool_results
    assert [r.content["data"] for r in fed_back] == [3, 10]
    assert [(c.arguments, c.result) for c in result.tool_calls] == [
        ({"a": 1, "b": 2}, 3),
        ({"a": 5, "b": 5}, 10),
    ]
    assert len({c.id for c in result.tool_calls}) == 2


def test_a_failed_run_leaves_the_session_as_it_was() -> None:
    def answer(messages: list[Message], tools: object) -> str:
        if messages[-1].content == "first":
            raise RuntimeError("endpoint exploded")
        return "fine"

    model = ScriptedModel(answer)
    agent = Agent(model=model)
    failed = agent.run("first", session_id="s")
    assert failed.status == 502 and failed.error == "RuntimeError: endpoint exploded"
    assert agent.sessions.load("s") == []  # the error is no turn of the conversation
    agent.run("second", session_id="s")
    sent = model.requests[-1].messages
    assert [m.role for m in sent] == ["user"]
    assert not any("exploded" in str(m.content) for m in sent)
    assert [m.role for m in agent.sessions.load("s")] == ["user", "assistant"]


def test_a_failing_custom_renderer_is_a_500_not_a_traceback() -> None:
    agent, _ = make_agent(["hello"])
    agent.add_renderer("broken", lambda view: 1 / 0)
    result = agent.run("hi", output_format="broken")
    assert result.status == 500
    assert result.error == "renderer 'broken' failed: ZeroDivisionError: division by zero"
