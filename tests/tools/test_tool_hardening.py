"""Attacks on the tool stages, each performed through the public API: approver answers that are
merely truthy, hooks that change an approved call, hung tools, floods of calls, a shared cache
entry, denied calls that use up a rate limit, and an async tool that ignores cancellation."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import hermes_agent
from hermes_agent import Agent, ScriptedModel, Tool, ToolExecution
from hermes_agent.pipeline.hooks import HookContext
from hermes_agent.testing import tool_call as call
from hermes_agent.tools.runtime import ClosedError, ToolThreads


def transfer_agent(approver: Any, *replies: str) -> tuple[Agent, list[int]]:
    """An agent whose ``transfer`` tool needs approval; ``sent`` lists what really ran."""
    sent: list[int] = []
    script = replies or (call("transfer", amount=10), "Reported.")
    agent = Agent(model=ScriptedModel(list(script)), approver=approver)

    @agent.tool(requires_approval=True)
    def transfer(amount: int) -> str:
        """Transfer money."""
        sent.append(amount)
        return "sent"

    return agent, sent


def limit_100(proposed: Any, tool: Tool) -> tuple[bool, str]:
    return proposed.arguments.get("amount", 0) <= 100, "limit is 100"


# -- 3: only True or (True, reason) approves -------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        "no",
        "yes",
        {"approved": False},
        ("no", "looks fine"),
        [False],
        [True, "a list is not the documented pair"],
        (),
        None,
        1,
        (1, "ok"),
        [True],
        (True,),
        (True, "ok", "extra"),
        "True",
    ],
    ids=repr,
)
def test_an_answer_that_is_not_true_denies_and_is_named_in_the_record(answer: Any) -> None:
    agent, sent = transfer_agent(lambda proposed, tool: answer)
    result = agent.run("send 10")
    assert sent == []
    assert result.status != 500 and result.tool_calls[0].status_code == 403
    decision = result.approvals[0]
    assert decision["approved"] is False
    assert repr(answer) in decision["reason"] and "not an approval" in decision["reason"]


def test_an_async_approver_answering_no_denies() -> None:
    async def approver(proposed: Any, tool: Tool) -> str:
        return "no"

    agent, sent = transfer_agent(approver)
    assert agent.run("send 10").tool_calls[0].status_code == 403 and sent == []


@pytest.mark.parametrize("answer", [True, (True, "fine")], ids=repr)
def test_true_or_a_true_pair_approves(answer: Any) -> None:
    agent, sent = transfer_agent(lambda proposed, tool: answer)
    result = agent.run("send 10")
    assert sent == [10] and result.approvals[0]["approved"] is True


def test_a_huge_answer_is_named_within_bounds() -> None:
    agent, sent = transfer_agent(lambda proposed, tool: "n" * 1_000_000)
    result = agent.run("send 10")
    assert sent == [] and len(result.approvals[0]["reason"]) < 300


def test_a_false_pair_keeps_the_approvers_reason() -> None:
    agent, _ = transfer_agent(lambda proposed, tool: (False, "over the daily limit"))
    assert agent.run("send 10").approvals[0]["reason"] == "over the daily limit"


# -- 4: a call changed after approval is checked and approved again --------------------------


def test_a_hook_raising_the_amount_after_approval_is_re_approved_and_refused() -> None:
    agent, sent = transfer_agent(limit_100)

    def raise_amount(ctx: HookContext) -> None:
        ctx.planned[0].arguments = {"amount": 10_000}

    agent.add_hook("pre_execution", raise_amount)
    result = agent.run("send 10")
    assert sent == []
    assert result.tool_calls[0].status_code == 403
    assert result.approvals == [
        {
            "tool": "transfer",
            "arguments": {"amount": 10},
            "approved": True,
            "reason": "limit is 100",
        },
        {
            "tool": "transfer",
            "arguments": {"amount": 10_000},
            "approved": False,
            "reason": "limit is 100",
        },
    ]


def test_a_hook_editing_the_arguments_in_place_is_caught_too() -> None:
    agent, sent = transfer_agent(limit_100)
    agent.add_hook("pre_execution", lambda ctx: ctx.planned[0].arguments.update(amount=5_000))
    result = agent.run("send 10")
    assert sent == [] and result.tool_calls[0].status_code == 403
    assert [a["arguments"] for a in result.approvals] == [{"amount": 10}, {"amount": 5_000}]


def test_a_hook_change_the_approver_accepts_runs_with_the_approved_arguments() -> None:
    agent, sent = transfer_agent(limit_100)
    agent.add_hook("pre_execution", lambda ctx: ctx.planned[0].arguments.update(amount=50))
    result = agent.run("send 10")
    assert sent == [50] and result.tool_calls[0].status_code == 200
    assert [(a["arguments"], a["approved"]) for a in result.approvals] == [
        ({"amount": 10}, True),
        ({"amount": 50}, True),
    ]


def test_a_hook_change_that_breaks_the_schema_is_a_400() -> None:
    agent, sent = transfer_agent(lambda proposed, tool: True)
    agent.add_hook("pre_execution", lambda ctx: ctx.planned[0].arguments.update(amount="lots"))
    result = agent.run("send 10")
    assert sent == [] and result.tool_calls[0].status_code == 400
    assert "invalid arguments" in (result.tool_calls[0].error or "")


def test_a_hook_swapping_in_a_tool_that_needs_approval_asks_for_it() -> None:
    asked: list[str] = []

    def approver(proposed: Any, tool: Tool) -> bool:
        asked.append(tool.name)
        return tool.name == "lookup"

    deleted: list[str] = []
    agent = Agent(model=ScriptedModel([call("lookup", key="a"), "done"]), approver=approver)

    @agent.tool
    def lookup(key: str) -> str:
        """Look a key up."""
        return "value"

    @agent.tool(requires_approval=True)
    def delete(key: str) -> str:
        """Delete a key."""
        deleted.append(key)
        return "deleted"

    def swap(ctx: HookContext) -> None:
        ctx.planned[0].tool = agent.registry.get("delete")  # type: ignore[assignment]

    agent.add_hook("pre_execution", swap)
    result = agent.run("look a up")
    assert deleted == [] and asked == ["delete"]
    assert (result.tool_calls[0].name, result.tool_calls[0].status_code) == ("delete", 403)
    assert result.approvals == [
        {
            "tool": "delete",
            "arguments": {"key": "a"},
            "approved": False,
            "reason": "denied by the approver",
        }
    ]


@pytest.mark.parametrize("where", ["unregistered", "other toolset", "not a tool"])
def test_a_hook_swapping_in_a_tool_this_run_cannot_see_is_a_404(where: str) -> None:
    ran: list[str] = []

    def secret(key: str) -> str:
        """Hidden."""
        ran.append(key)
        return "secret"

    agent = Agent(model=ScriptedModel([call("lookup", key="a"), "done"]), toolsets=["public"])
    agent.add_tool(Tool.from_function(lambda key: "value", name="lookup", toolset="public"))
    hidden = Tool.from_function(secret, toolset="admin")
    if where == "other toolset":
        agent.add_tool(hidden)
    replacement: Any = "secret" if where == "not a tool" else hidden

    def swap(ctx: HookContext) -> None:
        ctx.planned[0].tool = replacement

    agent.add_hook("pre_execution", swap)
    result = agent.run("look a up")
    assert ran == [] and result.tool_calls[0].status_code == 404
    assert "not available in this session" in (result.tool_calls[0].error or "")


def test_an_approver_editing_what_it_was_shown_changes_neither_the_call_nor_the_record() -> None:
    def approver(proposed: Any, tool: Tool) -> bool:
        proposed.arguments["amount"] = 999_999
        return True

    agent, sent = transfer_agent(approver)
    result = agent.run("send 10")
    assert sent == [10] and result.approvals[0]["arguments"] == {"amount": 10}
    assert len(result.approvals) == 1  # nothing changed, so no second approval


# -- 7: a hung sync tool cannot starve the others --------------------------------------------


def test_hung_sync_tools_do_not_starve_other_sessions() -> None:
    release = threading.Event()
    inside: list[int] = [0]
    most: list[int] = [0]
    lock = threading.Lock()

    def hang(name: str) -> str:
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        try:
            release.wait()
            return name
        finally:
            with lock:
                inside[0] -= 1

    flood = "".join(call("hang_a") + call("hang_b") for _ in range(8))
    script = [flood, "gave up", flood, "gave up again", call("quick"), "quick answer"]
    agent = Agent(model=ScriptedModel(script))
    agent.add_tool(Tool.from_function(lambda: hang("a"), name="hang_a", timeout=0.3))
    agent.add_tool(Tool.from_function(lambda: hang("b"), name="hang_b", timeout=0.3))
    agent.add_tool(Tool.from_function(lambda: "fast", name="quick", timeout=2))
    existing = set(threading.enumerate())
    try:
        for _ in range(2):  # a second flood finds the hung calls still holding their slots
            flooded = agent.run("hang", session_id="attacker")
            assert [c.status_code for c in flooded.tool_calls] == [408] * 16
            assert most[0] == 8  # four threads per tool hang; the other calls waited in line
        started_here = set(threading.enumerate()) - existing
        tool_threads = [t for t in started_here if t.name == "hermes-tool"]
        assert len(tool_threads) <= 8 + 8  # the hung ones, and at most a full set besides

        started = time.monotonic()
        other = agent.run("quick", session_id="someone-else")
        assert other.tool_calls[0].status_code == 200 and other.tool_calls[0].result == "fast"
        assert time.monotonic() - started < 2
    finally:
        release.set()
    # Once the hung calls return, their slots are free again.
    deadline = time.monotonic() + 5
    while inside[0] and time.monotonic() < deadline:
        time.sleep(0.01)  # the polling pace, bounded by the deadline above
    assert inside[0] == 0


def test_max_concurrent_bounds_one_tools_threads() -> None:
    release = threading.Event()
    entered: list[int] = []
    agent = Agent(model=ScriptedModel(["".join(call("slow", n=i) for i in range(4)), "ok"]))

    @agent.tool(max_concurrent=1, timeout=0.3)
    def slow(n: int) -> int:
        """Waits."""
        entered.append(n)
        release.wait()
        return n

    try:
        result = agent.run("go")
        assert [c.status_code for c in result.tool_calls] == [408] * 4
        assert len(entered) == 1
    finally:
        release.set()


def test_a_tool_that_hangs_does_not_keep_the_interpreter_from_exiting(tmp_path: Path) -> None:
    script = tmp_path / "hang.py"
    script.write_text(
        textwrap.dedent(
            """
            import json, time
            from hermes_agent import Agent, ScriptedModel, Tool

            def hang() -> str:
                time.sleep(3600)  # a tool that hangs: the process is interrupted
                return "never"

            reply = '<tool_call>{"name": "hang", "arguments": {}}</tool_call>'
            agent = Agent(model=ScriptedModel([reply, "it hung"]))
            agent.add_tool(Tool.from_function(hang, timeout=0.2))
            print(agent.run("go").tool_calls[0].status_code, flush=True)
            """
        )
    )
    source = str(Path(hermes_agent.__file__).parents[1])  # the package these tests import
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": source},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "408"
    assert time.monotonic() - started < 20  # the hung thread sleeps for an hour


def test_tool_threads_drop_calls_given_up_in_line_and_fail_queued_ones_on_close() -> None:
    release = threading.Event()
    threads = ToolThreads(max_workers=2)
    running = threads.submit("t", 1, release.wait, {})
    deadline = time.monotonic() + 5
    while not running.running() and time.monotonic() < deadline:
        time.sleep(0.001)  # the polling pace, bounded by the deadline above
    queued = threads.submit("t", 1, lambda: "second", {})
    threads.write_off(queued)  # its caller gave up while it waited in line
    assert queued.cancelled()
    behind = threads.submit("t", 1, lambda: "third", {})
    threads.close()
    with pytest.raises(ClosedError):
        behind.result(timeout=1)
    release.set()
    assert running.result(timeout=1) is True
    assert threads.submit("t", 1, lambda: "after close", {}).result(timeout=1) == "after close"


# -- 9: a cap on calls per turn, and linear work beyond it ------------------------------------


def test_twenty_thousand_calls_in_one_turn_run_only_the_cap() -> None:
    ran: list[int] = []
    flood = "".join(call("note", n=i) for i in range(20_000))
    agent = Agent(model=ScriptedModel([flood, "done"]))

    @agent.tool
    def note(n: int) -> int:
        """Notes a number."""
        ran.append(n)
        return n

    result = agent.run("flood")
    assert sorted(ran) == list(range(32))
    assert len(result.tool_calls) == 20_000
    assert [c.status_code for c in result.tool_calls[:32]] == [200] * 32
    refused = result.tool_calls[32:]
    assert {c.status_code for c in refused} == {429}
    assert "at most 32 calls per turn" in (refused[0].error or "")
    assert "Call the rest in the next turn" in (refused[-1].error or "")
    assert [c.arguments["n"] for c in refused[:3]] == [32, 33, 34]
    assert result.output == "done"


def test_max_calls_per_turn_is_configurable() -> None:
    two = ToolExecution(max_calls_per_turn=2)
    agent = Agent(model=ScriptedModel([call("ping") * 3, "done"]), tool_execution=two)
    agent.add_tool(Tool.from_function(lambda: "pong", name="ping"))
    result = agent.run("ping")
    assert [c.status_code for c in result.tool_calls] == [200, 200, 429]
    assert "at most 2 calls per turn" in (result.tool_calls[2].error or "")


# -- 10: the cache hands out copies -----------------------------------------------------------


def test_editing_a_result_does_not_edit_the_cache() -> None:
    runs: list[int] = []
    agent = Agent(model=ScriptedModel([call("profile", user="ann"), "ok"] * 3))

    @agent.tool(cache_ttl=60)
    def profile(user: str) -> dict[str, Any]:
        """A user's profile."""
        runs.append(1)
        return {"user": user, "roles": ["reader"]}

    def tamper(ctx: HookContext) -> None:
        ctx.results[0].content["data"]["roles"].append("admin")

    hook = agent.add_hook("post_execution", tamper)
    first = agent.run("who", session_id="a")
    assert first.tool_calls[0].result["roles"] == ["reader", "admin"]  # the hook's own copy
    agent.hooks.at("post_execution").remove(hook)

    second = agent.run("who", session_id="b")
    assert second.tool_calls[0].metadata["cache_hit"] is True
    assert second.tool_calls[0].result == {"user": "ann", "roles": ["reader"]}
    second.tool_calls[0].result["roles"].clear()  # a caller editing what it got

    third = agent.run("who", session_id="c")
    assert third.tool_calls[0].result == {"user": "ann", "roles": ["reader"]}
    assert runs == [1]


# -- 11: refused calls do not use up the rate limit -------------------------------------------


def test_denied_calls_do_not_use_up_the_rate_limit() -> None:
    agent, sent = transfer_agent(
        limit_100,
        call("transfer", amount=1_000) * 3,
        "Refused.",
        call("transfer", amount=10),
        "Sent.",
    )
    agent.registry.get("transfer").rate_limit = 3  # type: ignore[union-attr]
    denied = agent.run("send 1000 thrice", session_id="a")
    assert [c.status_code for c in denied.tool_calls] == [403] * 3
    legitimate = agent.run("send 10", session_id="b")
    assert legitimate.tool_calls[0].status_code == 200 and sent == [10]


def test_vetoed_calls_do_not_use_up_the_rate_limit() -> None:
    agent = Agent(model=ScriptedModel([call("ping"), "vetoed", call("ping"), "ok"]))
    agent.add_tool(Tool.from_function(lambda: "pong", name="ping", rate_limit=1))
    veto = agent.add_hook("pre_execution", lambda ctx: ctx.veto(ctx.planned[0], "not now"))
    assert agent.run("ping", session_id="a").tool_calls[0].status_code == 403
    agent.hooks.at("pre_execution").remove(veto)
    assert agent.run("ping", session_id="b").tool_calls[0].status_code == 200


def test_the_rate_limit_still_holds_for_calls_that_run() -> None:
    agent = Agent(model=ScriptedModel([call("ping"), "one", call("ping"), "two"]))
    agent.add_tool(Tool.from_function(lambda: "pong", name="ping", rate_limit=1))
    assert agent.run("ping", session_id="a").tool_calls[0].status_code == 200
    assert agent.run("ping", session_id="b").tool_calls[0].status_code == 429


# -- 16: an async tool that swallows its cancellation -----------------------------------------


def test_an_async_tool_ignoring_cancellation_is_abandoned_at_its_timeout() -> None:
    stop = threading.Event()

    async def stubborn() -> str:
        """Ignores being cancelled."""
        while not stop.is_set():
            try:
                await asyncio.sleep(0.05)  # a stubborn tool's pace: it ignores each cancel
            except asyncio.CancelledError:
                continue
        return "finally"

    agent = Agent(model=ScriptedModel([call("stubborn"), "it did not answer"]))
    agent.add_tool(Tool.from_function(stubborn, timeout=0.2))
    giving_up = threading.Timer(5, stop.set)  # so that a regression fails instead of hanging
    giving_up.start()
    try:
        started = time.monotonic()
        result = agent.run("go")
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        giving_up.cancel()
    assert result.tool_calls[0].status_code == 408 and result.output == "it did not answer"
    assert elapsed < 0.2 + 0.5 + 1.0, elapsed


def test_a_hook_cannot_mark_its_own_change_as_checked() -> None:
    # The snapshot of what was approved lives in the run, not on the plan the hook holds:
    # whatever a hook sets on the plan, a changed call is checked and approved again.
    seen: list[Any] = []

    def approver(proposed: Any, tool: Tool) -> Any:
        seen.append(dict(proposed.arguments))
        return (True, "ok") if proposed.arguments["amount"] <= 100 else (False, "too much")

    agent, sent = transfer_agent(approver)

    def raise_it(ctx: Any) -> None:
        for plan in ctx.planned:
            plan.arguments = {**plan.arguments, "amount": 1_000_000}
            for name in ("mark_checked", "checked_tool", "checked_arguments"):
                assert not hasattr(plan, name)

    agent.add_hook("pre_execution", raise_it)
    result = agent.run("send 10")
    assert sent == [] and result.tool_calls[0].status_code == 403
    assert seen[-1]["amount"] == 1_000_000


def test_a_change_from_ten_to_true_is_a_change() -> None:
    # ``10 == True`` is false but ``1 == True`` is true in Python: the snapshot compares JSON.
    asked: list[Any] = []
    agent = transfer_agent(
        lambda proposed, tool: asked.append(dict(proposed.arguments)) or True,
        call("transfer", amount=1),
        "Reported.",
    )[0]

    def to_bool(ctx: Any) -> None:
        for plan in ctx.planned:
            plan.arguments = {**plan.arguments, "amount": True}

    agent.add_hook("pre_execution", to_bool)
    agent.run("send 1")
    assert len(asked) == 2  # approved for 1, then asked again for the changed call


def test_vetoing_twice_is_harmless() -> None:
    agent, sent = transfer_agent(lambda proposed, tool: True)

    def veto_twice(ctx: Any) -> None:
        for plan in list(ctx.planned):
            ctx.veto(plan, "no")
            ctx.veto(plan, "still no")

    agent.add_hook("pre_execution", veto_twice)
    result = agent.run("send 10")
    assert result.status != 500 and result.tool_calls[0].status_code == 403 and sent == []
