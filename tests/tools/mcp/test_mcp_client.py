"""MCP tools in: a real MCP server written with the official SDK (``mcp_fixture_server.py``),
started as a subprocess over stdio, and over streamable HTTP (uvicorn on loopback). Its tools are
listed, called, validated (bad arguments never reach it: it writes one line per call it serves),
approval-gated, cached, dry-run and audited like Python tools; killed in the middle of a call
it gives an error result, and the next call works again."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from hermes_agent import Agent, ScriptedModel, build_agent
from hermes_agent.config import parse_config
from hermes_agent.errors import ConfigError
from hermes_agent.testing import tool_call as call
from hermes_agent.types import Message, RunResult
from server_harness import await_for, free_port, process_gone, wait_for

pytest.importorskip("mcp")

FIXTURE = Path(__file__).resolve().parents[2] / "harness" / "mcp_fixture_server.py"
SECRET = "s3cr3t-token-for-the-trail"


def calls_in(path: Path) -> list[tuple[int, str, dict[str, Any]]]:
    """The calls the fixture server served: (pid, tool, arguments)."""
    if not path.exists():
        return []
    found = []
    for line in path.read_text(encoding="utf-8").splitlines():
        pid, tool, arguments = line.split(" ", 2)
        found.append((int(pid), tool, json.loads(arguments)))
    return found


def echo_the_user(messages: Sequence[Message], _tools: Sequence[dict[str, Any]]) -> str:
    """A model that makes the call written in the user message, then says what came back."""
    if messages[-1].role == "tool":
        return f"done: {messages[-1].content}"
    return str(next(m for m in reversed(messages) if m.role == "user").content)


class FixtureServer:
    """The fixture MCP server over one transport, with its call log."""

    def __init__(self, transport: str, folder: Path) -> None:
        self.transport = transport
        self.calls_file = folder / f"calls-{uuid.uuid4().hex[:6]}.txt"
        self.process: subprocess.Popen[bytes] | None = None
        self.port = free_port()
        if transport == "http":
            self.start()

    def config(self, **extra: Any) -> dict[str, Any]:
        if self.transport == "stdio":
            server = {
                "command": sys.executable,
                "args": [str(FIXTURE), "stdio"],
                "env": {"FIXTURE_CALLS": str(self.calls_file), "FIXTURE_API_KEY": SECRET},
            }
        else:
            server = {
                "url": f"http://127.0.0.1:{self.port}/mcp",
                "headers": {"Authorization": f"Bearer {SECRET}"},
            }
        return {**server, "timeout": 10, **extra}

    def start(self) -> None:
        """Start the HTTP server and wait until it accepts connections."""
        env = {**os.environ, "FIXTURE_CALLS": str(self.calls_file)}
        self.process = subprocess.Popen(
            [sys.executable, str(FIXTURE), "http", str(self.port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def accepts() -> bool:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
            except OSError:
                assert self.process is not None and self.process.poll() is None
                return False
            return True

        wait_for(accepts, 30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    @property
    def calls(self) -> list[tuple[int, str, dict[str, Any]]]:
        return calls_in(self.calls_file)


@pytest.fixture(params=["stdio", "http"])
def fixture_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FixtureServer]:
    server = FixtureServer(request.param, tmp_path)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def stdio_server(tmp_path: Path) -> FixtureServer:
    return FixtureServer("stdio", tmp_path)


def make_agent(
    server: FixtureServer, tmp_path: Path, model: Any = echo_the_user, **config: Any
) -> Agent:
    tools = config.pop("tools", {})
    data = {
        "model": {"provider": "scripted"},
        "storage": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
        "mcp_servers": {"fixture": server.config(**config)},
        "tools": tools,
    }
    return build_agent(parse_config(data), model=ScriptedModel(model))


def run(agent: Agent, name: str, **arguments: Any) -> RunResult:
    return agent.run(call(name, **arguments))


def test_the_servers_tools_are_a_toolset_with_their_schemas(
    fixture_server: FixtureServer, tmp_path: Path
) -> None:
    agent = make_agent(fixture_server, tmp_path)
    try:
        expected = {"add", "echo", "forecast", "slow", "fail", "delete_everything"}
        assert set(agent.registry.toolsets()["fixture"]) == expected
        add = agent.registry.get("add")
        assert add is not None and add.description == "Add two integers."
        assert add.parameters == {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
            "additionalProperties": False,  # made strict: the server's schema did not say
        }
        forecast = agent.registry.get("forecast")
        assert forecast is not None
        days = forecast.parameters["properties"]["days"]
        assert (days["minimum"], days["maximum"], days["default"]) == (1, 7, 1)
    finally:
        agent.close()


def test_a_call_reaches_the_server_and_is_audited(
    fixture_server: FixtureServer, tmp_path: Path
) -> None:
    agent = make_agent(fixture_server, tmp_path)
    try:
        result = run(agent, "add", a=2, b=3)
        [record] = result.tool_calls
        assert (record.status_code, record.result) == (200, {"result": 5})
        assert result.output.startswith("done")
        assert [(tool, args) for _, tool, args in fixture_server.calls] == [
            ("add", {"a": 2, "b": 3})
        ]
        trail = agent.storage.records(result.request_id) if agent.storage else []
        executed = [r for r in trail if r.stage == "ToolExecutor" and r.role == "tool"]
        assert executed and '"name": "add"' in executed[0].content
        assert '"data": {"result": 5}' in executed[0].content

        # a secret from the server's headers or environment never reaches the trail
        echoed = run(agent, "echo", text=f"the key is {SECRET}")
        assert echoed.tool_calls[0].status_code == 200
        stored = "\n".join(r.content for r in agent.storage.records(echoed.request_id))  # type: ignore[union-attr]
        assert "the key is" in stored and SECRET not in stored
    finally:
        agent.close()


def test_bad_arguments_are_refused_before_the_server(
    fixture_server: FixtureServer, tmp_path: Path
) -> None:
    agent = make_agent(fixture_server, tmp_path)
    try:
        refusals = [
            run(agent, "add", a="two", b=3),
            run(agent, "add", a=2),
            run(agent, "add", a=2, b=3, c=4),
            run(agent, "forecast", city="Oslo", days=9),
        ]
        errors = [r.tool_calls[0].error or "" for r in refusals]
        assert [r.tool_calls[0].status_code for r in refusals] == [400, 400, 400, 400]
        assert "'a' must be an integer" in errors[0]
        assert "missing required argument 'b'" in errors[1]
        assert "unknown argument 'c'" in errors[2]
        assert "'days'" in errors[3] and "7" in errors[3]
        assert fixture_server.calls == []  # none of them reached the server
    finally:
        agent.close()


def test_a_tool_that_needs_approval_runs_only_when_approved(
    fixture_server: FixtureServer, tmp_path: Path
) -> None:
    agent = make_agent(
        fixture_server, tmp_path, tools={"delete_everything": {"requires_approval": True}}
    )
    try:
        denied = run(agent, "delete_everything", confirm=True)
        assert denied.tool_calls[0].status_code == 403
        assert fixture_server.calls == []
        seen: list[str] = []
        agent.approver = lambda call, tool: seen.append(tool.name) or (True, "fine")
        allowed = run(agent, "delete_everything", confirm=True)
        assert (allowed.tool_calls[0].status_code, allowed.tool_calls[0].result) == (
            200,
            {"result": "deleted"},
        )
        assert seen == ["delete_everything"]
        assert [tool for _, tool, _ in fixture_server.calls] == ["delete_everything"]
        assert allowed.approvals[0]["approved"] is True
    finally:
        agent.close()


def test_the_server_killed_mid_call_gives_an_error_and_the_next_call_works(
    fixture_server: FixtureServer, tmp_path: Path
) -> None:
    agent = make_agent(fixture_server, tmp_path)
    try:
        first = run(agent, "add", a=1, b=1)
        assert first.tool_calls[0].status_code == 200
        old_pid = fixture_server.calls[0][0]

        async def kill_while_it_sleeps() -> RunResult:
            running = asyncio.create_task(agent.arun(call("slow", seconds=30)))
            await await_for(
                lambda: any(tool == "slow" for _, tool, _ in fixture_server.calls),
                what="the slow tool running",
            )
            os.kill(old_pid, signal.SIGKILL)
            return await asyncio.wait_for(running, 20)

        started = time.monotonic()
        killed = asyncio.run(kill_while_it_sleeps())
        assert time.monotonic() - started < 15  # not the tool's 30 s, nor the 10 s timeout
        [record] = killed.tool_calls
        assert record.status_code == 500
        assert "closed the connection during the call" in (record.error or "")
        if fixture_server.transport == "http":
            fixture_server.process = None  # killed above; a server comes back on the same port
            fixture_server.start()

        again = run(agent, "add", a=20, b=22)
        assert (again.tool_calls[0].status_code, again.tool_calls[0].result) == (
            200,
            {"result": 42},
        )
        new_pid = fixture_server.calls[-1][0]
        assert new_pid != old_pid
        if fixture_server.transport == "stdio":
            assert process_gone(old_pid)
    finally:
        agent.close()


def test_a_hung_server_times_out_and_is_restarted(
    stdio_server: FixtureServer, tmp_path: Path
) -> None:
    agent = make_agent(stdio_server, tmp_path, timeout=5)
    try:
        assert run(agent, "add", a=1, b=1).tool_calls[0].status_code == 200
        hung = stdio_server.calls[0][0]
        os.kill(hung, signal.SIGSTOP)  # alive, but answers nothing
        try:
            timed_out = run(agent, "add", a=2, b=2)
            assert timed_out.tool_calls[0].status_code == 408
            # the session was checked at once, did not answer and was stopped: the next
            # call starts a new server
            again = run(agent, "add", a=3, b=3)
            assert again.tool_calls[0].status_code == 200
            assert stdio_server.calls[-1][0] != hung
            wait_for(lambda: process_gone(hung), 20)  # the hung one was killed
        finally:
            if not process_gone(hung):
                os.kill(hung, signal.SIGKILL)
    finally:
        agent.close()


def test_dry_runs_and_the_cache_spare_the_server(
    stdio_server: FixtureServer, tmp_path: Path
) -> None:
    agent = make_agent(stdio_server, tmp_path, tools={"add": {"cache_ttl": 60}})
    try:
        planned = agent.run(call("add", a=4, b=5), dry_run=True)
        assert planned.loop_status == "dry_run_complete"
        assert [(c.name, c.arguments) for c in planned.tool_calls] == [("add", {"a": 4, "b": 5})]
        assert stdio_server.calls == []
        first, second = run(agent, "add", a=4, b=5), run(agent, "add", a=4, b=5)
        assert first.tool_calls[0].result == second.tool_calls[0].result == {"result": 9}
        assert second.tool_calls[0].metadata["cache_hit"] is True
        assert len(stdio_server.calls) == 1
    finally:
        agent.close()


def test_errors_of_the_tool_are_error_results(stdio_server: FixtureServer, tmp_path: Path) -> None:
    agent = make_agent(stdio_server, tmp_path)
    try:
        failed = run(agent, "fail", reason="boom")
        assert failed.tool_calls[0].status_code == 500
        assert "Error executing tool fail" in (failed.tool_calls[0].error or "")
        assert run(agent, "add", a=1, b=2).tool_calls[0].status_code == 200
    finally:
        agent.close()


def test_close_stops_the_server_and_the_agent_stays_usable(
    stdio_server: FixtureServer, tmp_path: Path
) -> None:
    agent = make_agent(stdio_server, tmp_path)
    try:
        run(agent, "add", a=1, b=1)
        pid = stdio_server.calls[0][0]
        agent.close()
        wait_for(lambda: process_gone(pid), 15)
        again = run(agent, "add", a=1, b=2)  # starts the server again
        assert again.tool_calls[0].result == {"result": 3}
        assert stdio_server.calls[-1][0] != pid
    finally:
        agent.close()


def test_calls_from_async_code_and_in_parallel(stdio_server: FixtureServer, tmp_path: Path) -> None:
    def two_at_once(messages: Sequence[Message], _tools: Sequence[dict[str, Any]]) -> str:
        if messages[-1].role == "tool":
            return "both done"
        user = str(next(m for m in reversed(messages) if m.role == "user").content)
        return (
            user
            if user.startswith("<tool_call>")
            else call("slow", seconds=1) + call("add", a=2, b=2)
        )

    agent = make_agent(stdio_server, tmp_path, model=two_at_once)

    async def from_a_loop() -> tuple[RunResult, RunResult]:
        parallel = await agent.arun("go")
        # the sync facade inside a running loop runs on a loop of its own, in a helper thread
        nested = agent.run(call("add", a=5, b=5))
        return parallel, nested

    try:
        parallel, nested = asyncio.run(asyncio.wait_for(from_a_loop(), 30))
        assert [(c.name, c.status_code) for c in parallel.tool_calls] == [
            ("slow", 200),
            ("add", 200),
        ]
        assert nested.tool_calls[0].result == {"result": 10}
        assert run(agent, "add", a=1, b=1).tool_calls[0].result == {"result": 2}  # and sync
    finally:
        agent.close()


def test_a_server_that_cannot_start_is_a_config_error(tmp_path: Path) -> None:
    missing = {"command": str(tmp_path / "no-such-server")}
    with pytest.raises(ConfigError, match=r"mcp_servers\.ghost: .*no-such-server"):
        build_agent(
            parse_config({"model": {"provider": "scripted"}, "mcp_servers": {"ghost": missing}})
        )

    marker = f"hang-{uuid.uuid4().hex}"
    hanging = {
        "command": sys.executable,
        # A server that hangs: it must be killed.
        "args": ["-c", "import sys, time; time.sleep(120)", marker],
        "connect_timeout": 1,
    }
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"mcp_servers\.mute: .*connect_timeout \(1 s\)"):
        build_agent(
            parse_config({"model": {"provider": "scripted"}, "mcp_servers": {"mute": hanging}})
        )
    assert time.monotonic() - started < 10

    def leftovers() -> list[str]:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(entry.name)
            except OSError:
                continue
        return found

    wait_for(lambda: not leftovers(), 10)  # the hanging server was killed


def test_tool_selection_prefixes_and_collisions(
    stdio_server: FixtureServer, tmp_path: Path
) -> None:
    data: dict[str, Any] = {
        "model": {"provider": "scripted"},
        "mcp_servers": {
            "fixture": stdio_server.config(
                tools=["add", "echo"], tool_prefix="fx_", toolset="maths", requires_approval=True
            )
        },
    }
    agent = build_agent(parse_config(data), model=ScriptedModel(echo_the_user))
    try:
        assert agent.registry.toolsets() == {"maths": ["fx_add", "fx_echo"]}
        assert all(t.requires_approval for t in agent.tools)
        agent.approver = lambda call, tool: True
        assert run(agent, "fx_add", a=1, b=2).tool_calls[0].result == {"result": 3}
    finally:
        agent.close()

    data["mcp_servers"]["fixture"] = stdio_server.config(tools=["add", "nope"])
    with pytest.raises(
        ConfigError, match=r"mcp_servers\.fixture\.tools: the server has no tool nope"
    ):
        build_agent(parse_config(data))

    data["mcp_servers"]["fixture"] = stdio_server.config(exclude_tools=["slow"])
    with pytest.raises(ConfigError, match=r"'add' is already registered.*tool_prefix"):
        build_agent(parse_config(data), tools=[_python_add()])


def _python_add() -> Any:
    from hermes_agent import tool

    @tool
    def add(a: int, b: int) -> int:
        """Add in Python."""
        return a + b

    return add


def test_nothing_imports_mcp_without_servers(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "import hermes_agent, hermes_agent.cli.app\n"
        "from hermes_agent import build_agent\n"
        "from hermes_agent.config import parse_config\n"
        "model = {'provider': 'scripted', 'responses': ['hi']}\n"
        "agent = build_agent(parse_config({'model': model}))\n"
        "assert agent.run('hello').output == 'hi'\n"
        "agent.close()\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('mcp', 'mcp_types'))\n"
        "print(loaded)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]"


def test_config_section_is_validated() -> None:
    base = {"model": {"provider": "scripted"}}
    with pytest.raises(ConfigError, match="give either command"):
        parse_config({**base, "mcp_servers": {"x": {"command": "a", "url": "http://b"}}})
    with pytest.raises(ConfigError, match="give either command"):
        parse_config({**base, "mcp_servers": {"x": {}}})
    with pytest.raises(ConfigError, match="headers are for a url server"):
        parse_config({**base, "mcp_servers": {"x": {"command": "a", "headers": {"A": "b"}}}})
    with pytest.raises(ConfigError, match="did you mean 'timeout'"):
        parse_config({**base, "mcp_servers": {"x": {"command": "a", "timout": 3}}})
    config = parse_config(
        {
            **base,
            "mcp_servers": {
                "web": {"url": "http://x/mcp", "headers": {"Authorization": "Bearer abc123"}},
                "cli": {"command": "srv", "env": {"API_KEY": "k-1", "MODE": "fast"}},
            },
        }
    )
    assert config.mcp_servers["web"].secrets() == ["Bearer abc123", "abc123"]
    assert config.mcp_servers["cli"].secrets() == ["k-1"]


def test_servers_nobody_closed_are_stopped_at_exit(stdio_server: FixtureServer) -> None:
    config = json.dumps(
        {"model": {"provider": "scripted"}, "mcp_servers": {"fixture": stdio_server.config()}}
    )
    code = (
        "import json\n"
        "from hermes_agent import build_agent\n"
        "from hermes_agent.config import parse_config\n"
        f"agent = build_agent(parse_config(json.loads({config!r})))\n"
        "print(len(agent.tools))\n"  # started, listed, never closed
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "6"
    started = [
        entry.name
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and _runs_the_fixture(entry, stdio_server.calls_file)
    ]
    assert started == []


def _runs_the_fixture(process: Path, calls_file: Path) -> bool:
    try:
        environ = (process / "environ").read_bytes()
    except OSError:
        return False
    return str(calls_file).encode() in environ


def test_reconnecting_backs_off(tmp_path: Path) -> None:
    from hermes_agent.config import McpServerConfig
    from hermes_agent.tools.mcp.client import McpError, McpToolsets

    toolsets = McpToolsets({"gone": McpServerConfig(command=str(tmp_path / "no-such-server"))})

    async def attempts() -> list[str]:
        seen = []
        for timeout in (5.0, 0.2, 5.0):
            try:
                await toolsets.call("gone", "add", {}, timeout)
            except McpError as exc:
                seen.append(str(exc))
        return seen

    try:
        started = time.monotonic()
        first, hurried, patient = asyncio.run(attempts())
        assert first.startswith("cannot connect to MCP server 'gone'")
        # 0.5 s to wait, more than the call has: it fails at once, saying when the next try is
        assert "is unavailable" in hurried and "the next attempt to connect is in 0." in hurried
        assert patient.startswith("cannot connect")  # waited out the backoff, tried again
        assert 0.4 < time.monotonic() - started < 5
        assert toolsets.connections["gone"].starts == 0
    finally:
        toolsets.close()
