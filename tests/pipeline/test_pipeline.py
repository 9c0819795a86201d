"""The five-stage pipeline: hooks, subprocess sandbox, approvals, cache, fallback, rate limit,
result shape, renderers."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hermes_agent import Agent, Message, ScriptedModel, Tool
from hermes_agent.pipeline.context import RunContext
from hermes_agent.testing import tool_call as call
from processes import alive, gone_within
from server_harness import scripted, wait_for

# -- subprocess execution -------------------------------------------------------------------


def sleep_forever() -> str:
    """Never returns."""
    while True:
        time.sleep(1)  # a tool that hangs: the timeout must kill it


def report_pid() -> int:
    """The worker's process id."""
    return os.getpid()


def test_subprocess_tool_that_hangs_is_killed_within_timeout_plus_one_second() -> None:
    agent = Agent(model=scripted(call("report_pid"), call("hang"), "It hung."))
    agent.add_tool(Tool.from_function(report_pid, execution_mode="subprocess", timeout=1))
    agent.add_tool(
        Tool.from_function(sleep_forever, name="hang", execution_mode="subprocess", timeout=1)
    )
    # Other tests of the session may have left children of their own (a forkserver, say).
    earlier = set(_children())
    started = time.monotonic()
    result = agent.run("go")
    elapsed = time.monotonic() - started
    assert elapsed < 1 + 1.5, elapsed  # the model and the first call take well under 0.5 s
    first, hung = result.tool_calls
    assert first.result != os.getpid()  # it really ran in another process
    assert hung.status_code == 408 and hung.error == "tool 'hang' timed out after 1 s"
    assert result.output == "It hung." and result.status == 200
    # The worker that hung is gone (killed and reaped); no worker of that tool is left.
    assert agent.runtime.pool(agent.registry.get("hang")).pids() == []  # type: ignore[arg-type]
    assert not [p for p in _children() if p != first.result and p not in earlier]
    agent.close()
    assert not alive(first.result)


def _children() -> list[int]:
    children = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
    return [int(pid) for pid in children.read_text().split()] if children.exists() else []


def allocate(megabytes: int) -> int:
    """Allocates memory."""
    return len(bytearray(megabytes * 1024 * 1024))


def crash() -> None:
    """Exits the process abruptly."""
    os._exit(7)


def test_memory_limit_and_crash_give_error_results_and_the_agent_continues() -> None:
    agent = Agent(
        model=scripted(
            call("allocate", megabytes=512), call("crash"), call("allocate", megabytes=1), "done"
        )
    )
    agent.add_tool(Tool.from_function(allocate, execution_mode="subprocess", memory_limit_mb=256))
    agent.add_tool(Tool.from_function(crash, execution_mode="subprocess"))
    result = agent.run("go")
    too_big, crashed, small = result.tool_calls
    assert too_big.status_code == 500
    assert "memory limit" in (too_big.error or "")
    assert crashed.status_code == 500
    assert (
        crashed.error == "tool 'crash' failed in its process: the tool process exited with code 7"
    )
    assert small.status_code == 200 and small.result == 1024 * 1024
    assert result.output == "done"
    agent.close()


# -- hooks ----------------------------------------------------------------------------------


def test_pre_thought_hook_variable_reaches_the_rendered_prompt() -> None:
    model = scripted("Welcome, expert.")
    agent = Agent(model=model, system_prompt="Answer for a {{ user_level }} user.")
    agent.add_hook("pre_thought", lambda ctx: ctx.variables.update(user_level="expert"))
    agent.run("hi")
    assert model.requests[0].messages[0] == Message("system", "Answer for a expert user.")


def test_pre_execution_hook_vetoes_a_call() -> None:
    paid: list[int] = []
    agent = Agent(model=scripted(call("pay", amount=5000), "The payment was refused."))

    @agent.tool
    def pay(amount: int) -> str:
        """Pay an amount."""
        paid.append(amount)
        return "paid"

    def block_large_payments(ctx: RunContext) -> None:
        for plan in list(ctx.planned):
            if plan.tool.name == "pay" and plan.arguments["amount"] > 1000:
                ctx.veto(plan, "payments over 1000 need a manager")

    agent.add_hook("pre_execution", block_large_payments)
    result = agent.run("pay 5000")
    assert paid == []
    assert result.tool_calls[0].status_code == 403
    assert (
        result.tool_calls[0].error == "call to 'pay' was refused: payments over 1000 need a manager"
    )


def test_post_execution_hook_rewrites_a_result_and_post_output_changes_the_answer() -> None:
    model = scripted(call("secret"), "ok")
    agent = Agent(model=model)

    @agent.tool
    def secret() -> str:
        """Returns a secret."""
        return "hunter2"

    def redact(ctx: RunContext) -> None:
        for result in ctx.last_results:
            ctx.rewrite_result(result.call_id, "[redacted]")

    agent.add_hook("post_execution", redact)
    agent.add_hook("post_output", lambda ctx: setattr(ctx, "output", ctx.output.upper()))
    result = agent.run("tell me")
    assert model.requests[1].messages[-1].tool_results[0].content["data"] == "[redacted]"
    assert result.tool_calls[0].result == "[redacted]"
    assert result.output == "OK"


def test_a_raising_hook_ends_the_run_with_500_and_a_message() -> None:
    def broken(ctx: RunContext) -> None:
        raise KeyError("profile")

    model = scripted("never used")
    agent = Agent(model=model)
    agent.add_hook("pre_thought", broken)
    result = agent.run("hi")
    assert result.status == 500
    assert result.error == (
        "hook test_a_raising_hook_ends_the_run_with_500_and_a_message.<locals>.broken "
        "(pre_thought) failed: KeyError: 'profile'"
    )
    assert result.output.startswith("The request could not be completed: hook")
    assert model.requests == []


def test_async_hooks_are_awaited() -> None:
    async def later(ctx: RunContext) -> None:
        ctx.variables["when"] = "now"

    model = scripted("ok")
    agent = Agent(model=model, system_prompt="It is {{ when }}; {{ unknown }} stays.")
    agent.add_hook("pre_input", later)
    agent.run("hi")
    assert model.requests[0].messages[0].content == "It is now; {{ unknown }} stays."


HOOKS_MODULE = """
class UserProfileHook:
    def __init__(self, level="beginner"):
        self.level = level

    def __call__(self, ctx):
        ctx.variables["user_level"] = self.level


class AuditHook:
    seen = []

    def __call__(self, ctx):
        AuditHook.seen.extend(r.name for r in ctx.last_results)


class VetoAll:
    def __call__(self, ctx):
        for plan in list(ctx.planned):
            ctx.veto(plan, "vetoed by config")
"""


def test_hooks_and_tool_settings_from_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "myhooks"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "profile.py").write_text(textwrap.dedent(HOOKS_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    config = tmp_path / "config.yaml"
    config.write_text(
        textwrap.dedent(
            f"""
            model:
              provider: scripted
              responses:
                - {json.dumps(call("weather", city="Oslo"))}
                - "Sunny."
            agent:
              system_prompt: "User level: {{{{ user_level }}}}"
            hooks:
              pre_thought:
                - {{module: myhooks.profile, class: UserProfileHook, enabled: true,
                   options: {{level: expert}}}}
              post_execution:
                - {{module: myhooks.profile, class: AuditHook, enabled: true}}
              pre_execution:
                - {{module: myhooks.profile, class: VetoAll, enabled: false}}
            tools:
              get_weather: {{execution_mode: subprocess, timeout: 8, cache_ttl: 60,
                             max_result_chars: 2000, requires_approval: false,
                             aliases: ["weather"]}}
            """
        )
    )
    agent = Agent.from_config(config)

    @agent.tool
    def get_weather(city: str) -> dict:
        """Weather for a city."""
        return {"city": city, "pid": os.getpid()}

    tool = agent.registry.get("weather")
    assert tool is not None and tool.name == "get_weather"
    assert (tool.execution_mode, tool.timeout, tool.cache_ttl) == ("subprocess", 8, 60)
    result = agent.run("weather in Oslo")
    assert result.output == "Sunny."
    assert result.tool_calls[0].name == "get_weather"  # called through its alias
    assert result.tool_calls[0].result["pid"] != os.getpid()
    model = agent.model
    assert isinstance(model, ScriptedModel)
    assert model.requests[0].messages[0].content == "User level: expert"
    assert sys.modules["myhooks.profile"].AuditHook.seen == ["get_weather"]
    agent.close()


def test_bad_hook_config_is_a_clear_error(tmp_path: Path) -> None:
    from hermes_agent import ConfigError

    config = tmp_path / "config.yaml"
    config.write_text("hooks:\n  pre_thought:\n    - {module: no_such_module_xyz, class: X}\n")
    with pytest.raises(
        ConfigError, match=r"hooks\.pre_thought: cannot import module 'no_such_module_xyz'"
    ):
        Agent.from_config(config, model=scripted())
    config.write_text("hooks:\n  pre_thinking:\n    - {module: os, class: X}\n")
    with pytest.raises(ConfigError, match=r"hooks\.pre_thinking: unknown hook point"):
        Agent.from_config(config, model=scripted())


# -- approvals ------------------------------------------------------------------------------


def transfer_agent(approver: object = None) -> tuple[Agent, list[int]]:
    sent: list[int] = []
    agent = Agent(model=scripted(call("transfer", amount=10), "Reported."), approver=approver)  # type: ignore[arg-type]

    @agent.tool(requires_approval=True)
    def transfer(amount: int) -> str:
        """Transfer money."""
        sent.append(amount)
        return "sent"

    return agent, sent


def test_approval_allowed() -> None:
    asked: list[tuple[str, dict]] = []

    def approve(proposed: object, tool: Tool) -> bool:
        asked.append((tool.name, proposed.arguments))  # type: ignore[attr-defined]
        return True

    agent, sent = transfer_agent(approve)
    result = agent.run("send 10")
    assert sent == [10] and asked == [("transfer", {"amount": 10})]
    assert result.approvals == [
        {"tool": "transfer", "arguments": {"amount": 10}, "approved": True, "reason": "approved"}
    ]


def test_approval_denied_is_a_403_the_model_must_report() -> None:
    agent, sent = transfer_agent(lambda call, tool: (False, "over the daily limit"))
    result = agent.run("send 10")
    assert sent == []
    assert result.tool_calls[0].status_code == 403
    assert "denied (over the daily limit)" in (result.tool_calls[0].error or "")
    assert result.approvals[0]["approved"] is False


def test_no_approver_means_deny() -> None:
    agent, sent = transfer_agent(None)
    result = agent.run("send 10")
    assert sent == [] and result.tool_calls[0].status_code == 403
    assert "no approver is configured" in (result.tool_calls[0].error or "")


def test_cli_without_a_terminal_denies_approval(tmp_path: Path) -> None:
    import subprocess

    tools_file = tmp_path / "tools.py"
    tools_file.write_text(
        "from hermes_agent import tool\n\n"
        "@tool(requires_approval=True)\n"
        "def delete_all() -> str:\n"
        '    """Deletes everything."""\n'
        "    return 'deleted'\n"
    )
    config = tmp_path / "config.yaml"
    config.write_text(
        "model:\n  provider: scripted\n  responses:\n"
        f"    - {json.dumps(call('delete_all'))}\n    - Not done.\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hermes_agent",
            "run",
            "--json",
            "--no-demo-tools",
            "--config",
            str(config),
            "--tools",
            str(tools_file),
            "delete everything",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    result = json.loads(done.stdout)
    assert result["tool_calls"][0]["status_code"] == 403
    assert (
        result["approvals"][0]["reason"] == "no terminal to ask for approval (non-interactive run)"
    )


# -- cache, fallback, rate limit, result shape ----------------------------------------------


def test_cache_hit_within_ttl_and_miss_after() -> None:
    runs: list[str] = []
    agent = Agent(model=scripted(*[call("lookup", key="a"), "ok"] * 3))

    @agent.tool(cache_ttl=0.5)
    def lookup(key: str) -> str:
        """Looks a key up."""
        runs.append(key)
        return f"value-{len(runs)}"

    first = agent.run("a").tool_calls[0]
    second = agent.run("a").tool_calls[0]
    time.sleep(0.6)  # a measured duration: the 0.5 s time to live runs out
    third = agent.run("a").tool_calls[0]
    assert runs == ["a", "a"]
    assert (first.result, first.metadata["cache_hit"]) == ("value-1", False)
    assert (second.result, second.metadata["cache_hit"]) == ("value-1", True)
    assert (third.result, third.metadata["cache_hit"]) == ("value-2", False)


def test_fallback_tool_is_used_when_the_primary_is_unavailable() -> None:
    agent = Agent(model=scripted(call("live_price", symbol="ACME"), "about 99"))

    @agent.tool(check_fn=lambda: False, fallback="cached_price")
    def live_price(symbol: str) -> float:
        """Live price."""
        raise AssertionError("must not run")

    @agent.tool
    def cached_price(symbol: str) -> float:
        """Yesterday's closing price."""
        return 99.0

    result = agent.run("price?")
    used = result.tool_calls[0]
    assert (used.name, used.result, used.status_code) == ("cached_price", 99.0, 200)
    assert used.metadata["fallback_for"] == "live_price"


def test_rate_limit_gives_429() -> None:
    agent = Agent(model=scripted(call("ping") + call("ping") + call("ping"), "done"))

    @agent.tool(rate_limit=2)
    def ping() -> str:
        """Ping."""
        return "pong"

    result = agent.run("ping thrice")
    assert [c.status_code for c in result.tool_calls] == [200, 200, 429]
    assert "rate-limited (2 calls per minute)" in (result.tool_calls[2].error or "")


def test_results_are_normalised_json_safe_and_truncated_with_a_note() -> None:
    model = scripted(call("big") + call("odd"), "ok")
    agent = Agent(model=model)

    @agent.tool(max_result_chars=50)
    def big() -> str:
        """A long text."""
        return "x" * 500

    @agent.tool
    def odd() -> dict:
        """Values JSON cannot hold."""
        return {"when": time, "none": None, "text": "北京"}

    result = agent.run("go")
    big_result, odd_result = model.requests[1].messages[-1].tool_results
    assert big_result.content["data"].startswith("x" * 50 + "… [truncated: the result has 500")
    assert set(big_result.content) == {"status", "data", "error"}  # the note is in the data
    assert result.tool_calls[0].metadata["truncated"] is True
    assert set(result.tool_calls[0].metadata) >= {"tool_name", "execution_time_ms", "cache_hit"}
    from hermes_agent.protocol.chatml import render_tool_results

    wire = render_tool_results([odd_result])
    payload = json.loads(wire.split("\n")[1])
    assert payload["content"]["data"]["none"] is None
    assert payload["content"]["data"]["text"] == "北京"  # real UTF-8, not \\u escapes
    assert payload["content"]["data"]["when"].startswith("<module 'time'")


# -- renderers ------------------------------------------------------------------------------


def orders_agent() -> Agent:
    agent = Agent(
        model=ScriptedModel(
            lambda messages, tools: call("orders") if len(messages) == 1 else "Two orders."
        )
    )

    @agent.tool
    def orders() -> list[dict]:
        """Recent orders."""
        return [{"id": 1, "item": "tea", "total": 4.5}, {"id": 2, "item": "cake|slice", "total": 3}]

    return agent


def test_table_markdown_and_json_renderers() -> None:
    agent = orders_agent()
    table = agent.run("orders?", output_format="table").rendered
    assert table.format == "table"
    assert table.content == (  # cells padded to their column's width (pipeline/test_tables.py)
        "| id  | item        | total |\n"
        "|-----|-------------|-------|\n"
        "| 1   | tea         | 4.5   |\n"
        "| 2   | cake\\|slice | 3     |"
    )
    assert table.metadata["source_tools"] == ["orders"] and table.metadata["rendered_at"] > 0
    markdown = agent.run("orders?", output_format="markdown").rendered.content
    assert markdown.startswith("Two orders.\n\n| id  | item        | total |")
    document = json.loads(agent.run("orders?", channel="api").rendered.content)
    assert document["output"] == "Two orders." and document["status"] == 200
    assert document["tool_results"][0]["data"][0]["item"] == "tea"
    assert agent.run("orders?").rendered.content == "Two orders."


def test_custom_renderer() -> None:
    agent = orders_agent()
    agent.add_renderer("sms", lambda view: view.output[:5] + "…")
    assert agent.run("orders?", output_format="sms").rendered.content == "Two o…"
    with pytest.raises(Exception, match="unknown output format 'fax'"):
        agent.run("orders?", output_format="fax")


def test_a_tool_that_mutates_its_arguments_cannot_rewrite_the_record() -> None:
    agent = Agent(model=scripted(call("grow", items=[1, 2]), "ok"))

    @agent.tool
    def grow(items: list[int]) -> int:
        """Appends to the list it was given."""
        items.append(99)
        return len(items)

    result = agent.run("go")
    assert result.tool_calls[0].arguments == {"items": [1, 2]}
    assert result.tool_calls[0].result == 3


def test_cli_asks_for_approval_on_a_terminal(tmp_path: Path) -> None:
    import pty
    import subprocess

    tools_file = tmp_path / "tools.py"
    tools_file.write_text(
        "from hermes_agent import tool\n\n"
        "@tool(requires_approval=True)\n"
        "def restart(service: str) -> str:\n"
        '    """Restarts a service."""\n'
        "    return f'{service} restarted'\n"
    )
    config = tmp_path / "config.yaml"
    config.write_text(
        "model:\n  provider: scripted\n  responses:\n"
        f"    - {json.dumps(call('restart', service='web'))}\n    - Restarted.\n"
        f"storage:\n  url: sqlite:///{tmp_path / 'state.db'}\n"
    )
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hermes_agent",
            "run",
            "--json",
            "--no-demo-tools",
            "--config",
            str(config),
            "--tools",
            str(tools_file),
            "restart the web service",
        ],
        stdin=terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(terminal)
    os.write(controller, b"y\n")
    out, err = process.communicate(timeout=60)
    os.close(controller)
    assert "restart" in err and "needs approval" in err
    result = json.loads(out)
    assert result["tool_calls"][0]["result"] == "web restarted"
    assert result["approvals"][0] == {
        "tool": "restart",
        "arguments": {"service": "web"},
        "approved": True,
        "reason": "approved at the terminal",
    }


def test_a_worker_busy_when_the_agent_closes_is_killed_when_its_call_returns(
    tmp_path: Path,
) -> None:
    import threading

    from hermes_agent.tools.sandbox import Limits, SubprocessPool

    started, release = tmp_path / "started", tmp_path / "release"

    def slow_pid() -> int:
        started.touch()
        wait_for(release.exists, what="the test releasing the tool")  # busy until then
        return os.getpid()

    pool = SubprocessPool(slow_pid, Limits())
    box: list[int] = []
    worker = threading.Thread(target=lambda: box.append(pool.call({}, 10)))
    worker.start()
    wait_for(started.exists, what="the tool running in its worker")
    pool.close()  # the worker is busy: nothing idle to kill yet
    release.touch()
    worker.join(10)
    assert box and box[0] != os.getpid()
    assert gone_within(box[0], 5)
    assert pool.pids() == []
