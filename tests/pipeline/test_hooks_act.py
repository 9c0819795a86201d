"""Hooks that act (answer a run, rewrite its input, change its answer, note facts in the trail),
hook classes written the execute(context) way, per-run variables, run budgets, and a tool's own
TimeoutError told apart from the executor's deadline — in process and over a real uvicorn."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from hermes_agent import (
    Agent,
    Budget,
    HermesAgentError,
    HookContext,
    PostExecutionHook,
    PreThoughtHook,
    Pricing,
    ScriptedModel,
    Status,
    ToolExecution,
    build_agent,
)
from hermes_agent.agent_context import cost_of
from hermes_agent.config import parse_config
from hermes_agent.errors import ConfigError
from hermes_agent.runs.status import ending_status
from hermes_agent.server import ServiceSettings, create_app
from hermes_agent.testing import tool_call as call
from hermes_agent.types import Message, Usage
from server_harness import serve


def agent_with(*replies: str, **options: Any) -> Agent:
    agent = Agent(model=ScriptedModel(list(replies)), storage="memory://", **options)

    @agent.tool
    def lookup(code: str) -> dict[str, Any]:
        """Look a stock up."""
        return {"code": code, "pb": 4.2}

    return agent


def trail(agent: Agent, request_id: str) -> list[tuple[str, str, str]]:
    assert agent.storage is not None
    return [(r.stage, r.role, r.content) for r in agent.storage.records(request_id)]


def hook_records(agent: Agent, request_id: str) -> list[dict[str, Any]]:
    return [json.loads(c) for _, role, c in trail(agent, request_id) if role == "hook"]


# -- hooks that answer ----------------------------------------------------------------------


def test_a_pre_input_hook_answers_and_the_model_is_never_asked() -> None:
    agent = agent_with("never sent")

    def compliance(ctx: HookContext) -> None:
        if "should I buy" in ctx.user_message:
            ctx.finish("I cannot give investment advice.", status=403, reason="advice asked")

    agent.add_hook("pre_input", compliance)
    result = agent.run("should I buy 300750?", session_id="s1")
    assert (result.output, result.status) == ("I cannot give investment advice.", 403)
    assert result.loop_status == "answered_by_hook" and ending_status(result) == "completed"
    answered = result.answered_by or {}
    assert answered["hook"].endswith("<locals>.compliance")  # the hook's qualified name
    assert (answered["point"], answered["reason"]) == ("pre_input", "advice asked")
    assert agent.model.requests == []  # type: ignore[attr-defined]
    roles = [role for _, role, _ in trail(agent, result.request_id)]
    assert roles == ["user", "hook", "output"]  # no prompt, no completion: none was made
    [note] = hook_records(agent, result.request_id)
    assert note["answered"] == {"reason": "advice asked", "status": 403}
    # A completed run: the refusal is the session's history.
    saved = agent.sessions.load("s1")
    assert [(m.role, m.content) for m in saved] == [
        ("user", "should I buy 300750?"),
        ("assistant", "I cannot give investment advice."),
    ]
    # Other questions go to the model.
    assert agent_with("fine").run("hello").output == "fine"


def test_a_pre_thought_hook_answers_after_a_tool_ran() -> None:
    agent = agent_with(call("lookup", code="300750"), "never sent")
    agent.add_hook(
        "pre_thought",
        lambda ctx: ctx.finish("Enough data.", reason="one lookup") if ctx.step == 1 else None,
    )
    result = agent.run("pb of 300750?")
    assert result.output == "Enough data." and result.status == 200
    assert [c.name for c in result.tool_calls] == ["lookup"]
    assert len(agent.model.requests) == 1  # type: ignore[attr-defined]


def test_finish_is_refused_where_the_conversation_cannot_end_and_with_a_failing_status() -> None:
    agent = agent_with(call("lookup", code="1"), "done")
    agent.add_hook("pre_execution", lambda ctx: ctx.finish("no"))
    result = agent.run("x")
    assert result.status == 500 and "can finish the run in pre_input" in (result.error or "")
    agent = agent_with("done")
    agent.add_hook("pre_input", lambda ctx: ctx.finish("no", status=502))
    result = agent.run("x")
    assert result.status == 500 and "below 500" in (result.error or "")


def test_pre_input_rewrites_the_message_and_the_history_and_the_trail_keeps_the_original() -> None:
    agent = agent_with("first", "second")
    agent.run("hello", session_id="s")

    def rewrite(ctx: HookContext) -> None:
        assert [m.content for m in ctx.history] == ["hello", "first"]
        ctx.user_message = ctx.user_message.replace("prices", "quotes")
        ctx.history = [Message("user", "(earlier turns withheld)"), Message("assistant", "ok")]

    agent.add_hook("pre_input", rewrite)
    result = agent.run("show prices", session_id="s")
    sent = agent.model.requests[1].messages  # type: ignore[attr-defined]
    assert [m.content for m in sent] == ["(earlier turns withheld)", "ok", "show quotes"]
    notes = hook_records(agent, result.request_id)
    assert notes[0]["rewrote_message"] == {"from": "show prices"}
    assert notes[1]["rewrote_history"] == {"from_turns": 2, "to_turns": 2}
    # the session keeps its own turns; the rewritten message is this run's
    assert [m.content for m in agent.sessions.load("s")][:2] == ["hello", "first"]
    bad = agent_with("x")
    bad.add_hook("post_input", lambda ctx: setattr(ctx, "user_message", "no"))
    assert "only in pre_input" in (bad.run("hi").error or "")


def test_a_post_output_change_is_recorded_as_what_was_appended() -> None:
    agent = agent_with("PB is 4.2.")
    agent.add_hook("post_output", lambda ctx: setattr(ctx, "output", ctx.output + " [risk]"))
    agent.add_hook("post_output", lambda ctx: ctx.note(contains_disclaimer="[risk]" in ctx.output))
    result = agent.run("pb?")
    assert result.output == "PB is 4.2. [risk]"
    changed, noted = hook_records(agent, result.request_id)
    assert changed["changed_output"] == {"appended": " [risk]"}
    assert noted["facts"] == {"contains_disclaimer": True}
    output = [c for _, role, c in trail(agent, result.request_id) if role == "output"]
    assert output == ["PB is 4.2. [risk]"]


# -- the tool's own TimeoutError -----------------------------------------------------------


def test_a_tool_raising_timeout_error_is_a_tool_error_and_the_deadline_a_408() -> None:
    agent = Agent(
        model=ScriptedModel(
            [call("db", q="a"), call("net", q="b"), call("slow", q="c"), call("aslow", q="d"), "ok"]
        ),
        tool_execution=ToolExecution(default_timeout=0.3),
    )

    @agent.tool
    def db(q: str) -> str:
        """Query the database."""
        raise TimeoutError("DATABASE_TIMEOUT: query_user_info timed out (30s)")

    @agent.tool
    async def net(q: str) -> str:
        """Ask a service."""
        raise TimeoutError("read timed out")  # what socket.timeout is since 3.10

    @agent.tool
    def slow(q: str) -> str:
        """Take long."""
        time.sleep(1.0)  # slow work on purpose: it runs past its timeout
        return "late"

    @agent.tool
    async def aslow(q: str) -> str:
        """Take long, asynchronously."""
        await asyncio.sleep(1.0)  # slow work on purpose: it runs past its timeout
        return "late"

    started = time.perf_counter()
    result = agent.run("go")
    codes = {c.name: (c.status_code, c.error) for c in result.tool_calls}
    assert codes["db"] == (
        500,
        "tool 'db' raised TimeoutError: DATABASE_TIMEOUT: query_user_info timed out (30s)",
    )
    assert codes["net"] == (500, "tool 'net' raised TimeoutError: read timed out")
    assert socket.timeout is TimeoutError
    assert codes["slow"] == (408, "tool 'slow' timed out after 0.3 s")
    assert codes["aslow"] == (408, "tool 'aslow' timed out after 0.3 s")
    assert codes["db"][0] == Status.INTERNAL_ERROR and time.perf_counter() - started < 5
    agent.close()


# -- per-run variables -----------------------------------------------------------------------


def test_variables_reach_hooks_placeholders_the_trail_and_the_result_redacted() -> None:
    agent = agent_with(
        "ok",
        system_prompt="Answer in {{ lang }} for a {{ tier }} client.",
        secrets=["sk-secret-123"],
    )
    seen: list[dict[str, Any]] = []

    def tier(ctx: HookContext) -> None:
        seen.append(dict(ctx.variables))
        ctx.inject_variable("tier", "gold" if ctx.variables["operator_id"] == "op-7" else "std")

    agent.add_hook("pre_thought", tier)
    variables = {"lang": "zh", "operator_id": "op-7", "token": "sk-secret-123"}
    result = agent.run("hi", variables=variables)
    assert seen == [variables]
    system = agent.model.requests[0].messages[0].content  # type: ignore[attr-defined]
    assert system == "Answer in zh for a gold client."
    assert result.variables == {**variables, "tier": "gold"}
    [recorded] = [c for _, role, c in trail(agent, result.request_id) if role == "variables"]
    assert json.loads(recorded)["operator_id"] == "op-7" and "sk-secret-123" not in recorded
    variables["lang"] = "changed"  # the run had its own copy
    assert result.variables["lang"] == "zh"


@pytest.mark.parametrize(
    ("variables", "problem"),
    [
        ({"1st": 1}, "variable name"),
        ({"x": object()}, "not a JSON value"),
        ({"x": [[[[1]]]]}, "nested deeper"),
        ({"x": "y" * 20_000}, "characters of JSON"),
        ("lang=zh", "must be a mapping"),
    ],
)
def test_variables_are_bounded(variables: Any, problem: str) -> None:
    with pytest.raises(HermesAgentError, match=problem):
        agent_with("ok").run("hi", variables=variables)


# -- run budgets -------------------------------------------------------------------------------


def test_a_token_budget_stops_the_run_before_the_calls_of_the_turn_that_spent_it() -> None:
    ran: list[str] = []

    def budgeted() -> Agent:
        agent = Agent(
            model=ScriptedModel([call("lookup", code="1"), call("lookup", code="2"), "done"]),
            storage="memory://",
            budget=Budget(max_run_tokens=10_000),
        )

        @agent.tool
        def lookup(code: str) -> str:
            """Look up."""
            ran.append(code)
            return code

        return agent

    within = budgeted().run("go")  # the agent's budget: room for every turn
    assert within.output == "done" and ran == ["1", "2"]
    ran.clear()
    result = budgeted().run("go", max_run_tokens=1)  # this run's own budget
    assert ran == [] and result.status == 206
    assert (result.loop_status, result.stopped_by) == ("budget_exceeded", "max_run_tokens")
    assert "budget is 1 (max_run_tokens)" in result.output
    assert ending_status(result) == "completed"


def test_a_cost_budget_needs_prices_and_counts_each_model_at_its_own() -> None:
    with pytest.raises(HermesAgentError, match="max_run_cost needs prices"):
        agent_with("ok").run("hi", max_run_cost=0.01)
    agent = agent_with(
        call("lookup", code="1"),
        "never",
        pricing=Pricing(prompt_per_1k=1000.0, completion_per_1k=1000.0),
        budget=Budget(max_run_cost=0.5),
    )
    result = agent.run("go")
    assert (result.loop_status, result.stopped_by, result.status) == (
        "budget_exceeded",
        "max_run_cost",
        206,
    )
    assert result.tool_calls == [] and result.cost is not None and result.cost >= 0.5


def test_an_answer_that_crosses_the_budget_is_kept_with_a_warning() -> None:
    result = agent_with("the answer").run("hi", max_run_tokens=1)
    assert result.output == "the answer" and result.status == 200
    assert any("over its max_run_tokens of 1" in w for w in result.warnings)


def test_run_timeout_s_ends_the_run_timed_out_and_leaves_the_session_as_it_was() -> None:
    agent = Agent(
        model=ScriptedModel([call("wait", seconds=5.0), "never"]),
        storage="memory://",
        budget=Budget(run_timeout_s=0.5),
    )

    @agent.tool
    async def wait(seconds: float) -> str:
        """Wait."""
        await asyncio.sleep(seconds)  # slow work on purpose: the run's deadline cuts it short
        return "waited"

    started = time.perf_counter()
    result = agent.run("go", session_id="t")
    assert time.perf_counter() - started < 3
    assert (result.status, result.loop_status, result.stopped_by) == (
        504,
        "timed_out",
        "run_timeout_s",
    )
    assert "run_timeout_s (0.5 s)" in (result.error or "")
    assert ending_status(result) == "timed_out"
    assert agent.sessions.load("t") == []
    assert trail(agent, result.request_id)[-1][1] == "output"


def test_budgets_are_checked_when_given() -> None:
    with pytest.raises(HermesAgentError, match="max_run_tokens must be a positive"):
        agent_with("ok").run("hi", max_run_tokens=0)
    config = parse_config(
        {"model": {"provider": "scripted", "responses": ["ok"]}, "agent": {"run_timeout_s": 9}}
    )
    assert Agent.from_settings(config).budget.run_timeout_s == 9


# -- hooks written the execute(context) way -----------------------------------------------------


HOOKS_MODULE = """
from hermes_agent import PostExecutionHook, PreThoughtHook

AUDIT = []


class UserProfileHook(PreThoughtHook):
    def execute(self, context):
        context.inject_variable("user_level", "vip")
        context.inject_variable("preferred_tool", "lookup")
        return context


class AuditHook(PostExecutionHook):
    def __init__(self, operator="op-1"):
        self.operator = operator

    def execute(self, context):
        AUDIT.append({
            "timestamp": context.timestamp,
            "session_id": context.session_id,
            "tool_name": context.tool_name,
            "input_params": str(context.input_params),
            "response_status": context.response.get("status", "unknown"),
            "operator_id": self.operator,
        })
        return context


class PlainExecute:
    def execute(self, context):
        context.variables["plain"] = "yes"
"""


def test_design_style_hook_config_loads_and_runs(tmp_path: Path, monkeypatch: Any) -> None:
    (tmp_path / "design_hooks.py").write_text(HOOKS_MODULE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = parse_config(
        {
            "model": {
                "provider": "scripted",
                "responses": [call("lookup", code="1") + call("lookup", code="2"), "ok"],
            },
            "agent": {"system_prompt": "Level {{ user_level }}, use {{ preferred_tool }}."},
            "pre_thought_hooks": [
                {"module": "design_hooks", "class": "UserProfileHook", "enabled": True},
                {"module": "design_hooks", "class": "PlainExecute"},
                {"module": "design_hooks", "class": "UserProfileHook", "enabled": False},
            ],
            "hooks": {"post_execution_hooks": [{"module": "design_hooks", "class": "AuditHook"}]},
        }
    )
    assert list(config.hooks) == ["post_execution", "pre_thought"]
    agent = build_agent(config)

    @agent.tool
    def lookup(code: str) -> str:
        """Look up."""
        return code

    result = agent.run("go", session_id="d")
    assert result.variables == {"user_level": "vip", "preferred_tool": "lookup", "plain": "yes"}
    system = agent.model.requests[0].messages[0].content  # type: ignore[attr-defined]
    assert system.startswith("Level vip, use lookup.")
    audit = sys.modules["design_hooks"].AUDIT
    assert [(a["tool_name"], a["input_params"], a["response_status"]) for a in audit] == [
        ("lookup", "{'code': '1'}", "success"),
        ("lookup", "{'code': '2'}", "success"),
    ]
    assert audit[0]["session_id"] == "d" and audit[0]["timestamp"].endswith("+00:00")
    # A hook class listed under another point is named as the mistake it is.
    wrong = parse_config(
        {
            "model": {"provider": "scripted", "responses": ["ok"]},
            "pre_input_hooks": [{"module": "design_hooks", "class": "AuditHook"}],
        }
    )
    with pytest.raises(ConfigError, match="is a post_execution hook"):
        build_agent(wrong)


def test_hook_classes_added_in_code_and_the_call_of_a_plain_post_execution_hook() -> None:
    class Profile(PreThoughtHook):
        def execute(self, context: HookContext) -> HookContext:
            context.inject_variable("lang", "en")
            return context

    seen: list[tuple[str, dict[str, Any], dict[str, Any]]] = []

    class Audit(PostExecutionHook):
        def execute(self, context: HookContext) -> None:
            seen.append((context.tool_name, context.input_params, context.response))

    agent = agent_with(call("lookup", code="1"), "ok")
    agent.add_hook(Profile())
    agent.add_hook(Audit())
    agent.add_hook("post_execution", lambda ctx: seen.append((ctx.tool_name, {}, {})))
    result = agent.run("go")
    assert result.variables == {"lang": "en"}
    assert seen[0] == (
        "lookup",
        {"code": "1"},
        {"status": "success", "data": {"code": "1", "pb": 4.2}, "error": None},
    )
    assert seen[1][0] == "lookup"  # one call in the step: a plain hook may ask for it too
    two = agent_with(call("lookup", code="1") + call("lookup", code="2"), "ok")
    two.add_hook("post_execution", lambda ctx: ctx.tool_name)
    failed = two.run("go")
    assert failed.status == 500 and "this step ran 2 calls" in (failed.error or "")
    with pytest.raises(ConfigError, match="is a pre_thought hook"):
        agent.add_hook("post_output", Profile())
    bad = agent_with("ok")
    bad.add_hook("pre_thought", lambda ctx: ctx.inject_variable("no such", 1))
    refused = bad.run("x")
    assert refused.status == 500 and "inject_variable('no such')" in (refused.error or "")


# -- over a real uvicorn ------------------------------------------------------------------------


COMPLIANCE_REFUSAL = "根据监管要求，我不能提供投资建议，请咨询持牌顾问"


def service_agent(tmp_path: Path) -> Agent:
    agent = Agent(
        model=ScriptedModel(lambda messages, tools: "PB is 4.2."),
        storage=f"sqlite:///{tmp_path / 'state.db'}",
        system_prompt="Reply in {{ lang }}.",
    )

    def refuse(ctx: HookContext) -> None:
        if "应该买" in ctx.user_message:
            ctx.finish(
                COMPLIANCE_REFUSAL, reason=f"advice asked by {ctx.variables.get('operator_id')}"
            )

    agent.add_hook("pre_input", refuse)
    return agent


def test_variables_and_hook_answers_over_the_service(tmp_path: Path) -> None:
    agent = service_agent(tmp_path)
    app = create_app(agent=agent, settings=ServiceSettings(auth="none"))
    with serve(app) as url:
        client = httpx.Client(base_url=url, timeout=30)
        ok = client.post("/v1/runs", json={"message": "pb?", "variables": {"lang": "zh"}})
        assert ok.status_code == 200, ok.text
        body = ok.json()
        assert body["variables"] == {"lang": "zh"}
        system = agent.model.requests[-1].messages[0].content  # type: ignore[attr-defined]
        assert system == "Reply in zh."
        roles = [role for _, role, _ in trail(agent, body["request_id"])]
        assert roles[:3] == ["accepted", "user", "variables"]

        refused = client.post(
            "/v1/runs", json={"message": "300750 应该买吗?", "variables": {"operator_id": "op-7"}}
        )
        assert refused.status_code == 200
        result = refused.json()
        assert result["output"] == COMPLIANCE_REFUSAL
        assert result["loop_status"] == "answered_by_hook"
        assert result["answered_by"]["reason"] == "advice asked by op-7"
        run = client.get(f"/v1/runs/{result['request_id']}").json()
        assert run["status"] == "completed"

        too_big = client.post("/v1/runs", json={"message": "x", "variables": {"v": "y" * 20_000}})
        assert too_big.status_code == 413 and "characters of JSON" in too_big.text
        bad_name = client.post("/v1/runs", json={"message": "x", "variables": {"a-b": 1}})
        assert bad_name.status_code == 422 and "variable name" in bad_name.text

        with connect(url.replace("http", "ws") + "/v1/ws") as ws:
            ws.send(json.dumps({"type": "run", "message": "pb?", "variables": {"lang": "en"}}))
            while True:
                message = json.loads(ws.recv(timeout=20))
                if message["type"] == "event" and message["event"]["kind"] == "result":
                    assert message["event"]["result"]["variables"] == {"lang": "en"}
                    break
                assert message["type"] != "error", message

        chat = client.post(
            "/v1/chat/completions",
            json={
                "model": "hermes-agent",
                "messages": [{"role": "user", "content": "pb?"}],
                "metadata": {"lang": "fr"},
            },
        )
        assert chat.status_code == 200, chat.text
        system = agent.model.requests[-1].messages[0].content  # type: ignore[attr-defined]
        assert system == "Reply in fr."


def test_the_gate_bounds_variables_for_every_door() -> None:
    from hermes_agent.runs.gate import Gate, GateLimits, RunRejected
    from hermes_agent.runs.principal import Principal
    from hermes_agent.runs.request import RunRequest

    class NoQuota:
        def applies_to(self, user_id: str) -> bool:
            return False

    gate = Gate(GateLimits(max_variables_chars=50), NoQuota())  # type: ignore[arg-type]
    agent = agent_with("ok")
    principal = Principal("alice")
    gate.check(principal, RunRequest(message="hi", variables={"lang": "zh"}), agent, 200)
    with pytest.raises(RunRejected) as too_big:
        gate.check(principal, RunRequest(message="hi", variables={"v": "x" * 60}), agent, 200)
    assert too_big.value.status_code == 413
    with pytest.raises(RunRejected) as deep:
        gate.check(principal, RunRequest(message="hi", variables={"v": [[[[1]]]]}), agent, 200)
    assert deep.value.status_code == 422


def test_usage_counts_toward_the_cost_budget_per_model() -> None:
    agent = agent_with("ok", pricing=Pricing(prompt_per_1k=1.0, completion_per_1k=2.0))
    assert cost_of(agent, {"scripted": Usage(1000, 1000)}) == 3.0


def test_a_queued_run_keeps_its_variables_for_its_worker() -> None:
    from hermes_agent.runs.request import QueuedRequest

    queued = QueuedRequest(message="hi", variables={"lang": "zh", "tier": ["gold", 2]})
    payload = queued.model_dump(mode="json", exclude_defaults=True)  # as the store keeps it
    assert QueuedRequest.model_validate(payload).variables == {"lang": "zh", "tier": ["gold", 2]}


def test_a_callers_schema_text_is_never_rendered_as_the_prompt_template() -> None:
    """Variables fill the agent's own system prompt; a ``{{ name }}`` inside a caller's
    output schema (its description) stays as written, so request text cannot pull a hook's
    variables into the prompt."""
    from hermes_agent import Agent, ScriptedModel

    seen: list[str] = []

    def model(messages: Any, _tools: Any) -> str:
        seen.append(str(messages[0].content))
        return '{"n": 1}'

    agent = Agent(ScriptedModel(model), system_prompt="Answer in {{ lang }}.")
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "description": "leak {{ secret }}"}},
        "required": ["n"],
    }
    result = agent.run("hi", variables={"lang": "fr", "secret": "s3cr3t"}, output_type=schema)
    assert result.data == {"n": 1}
    assert seen and seen[0].startswith("Answer in fr.")
    assert "leak {{ secret }}" in seen[0] and "s3cr3t" not in seen[0]


def test_a_renderer_is_told_the_channel_and_the_runs_variables() -> None:
    """One renderer can serve several channels and languages: it sees which channel the
    answer is for and the run's variables."""
    from hermes_agent import Agent, ScriptedModel

    seen: list[tuple[Any, Any]] = []

    def card(view: Any) -> str:
        seen.append((view.channel, view.variables.get("lang")))
        title = "回答" if view.variables.get("lang") == "zh" else "Answer"
        return f"[{view.channel}] {title}: {view.output}"

    agent = Agent(
        ScriptedModel(["hello", "hello"]), channel_formats={"wecom": "card", "slack": "card"}
    )
    agent.add_renderer("card", card)
    zh = agent.run("hi", channel="wecom", variables={"lang": "zh"})
    en = agent.run("hi", channel="slack")
    assert zh.rendered.content == "[wecom] 回答: hello"
    assert en.rendered.content == "[slack] Answer: hello"
    assert seen == [("wecom", "zh"), ("slack", None)]
