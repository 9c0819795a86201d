"""A call that needs its caller's input asks for it, at each revision: at 2026-07-28 (stateless)
by an input-required result whose sealed ``requestState`` the retry brings back with the
answer, the call waiting in between; on a 2025-11-25 session by an elicitation request. What
is asked: an approval the agent needs, or a tool's own ``ask_caller``. And a tool's log lines
reach the caller at the level it asked for. A real ``hermes-agent mcp serve --transport http``
on loopback, driven by the SDK's client."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hermes_agent import Agent, ScriptedModel, tool
from hermes_agent.storage import open_storage

pytest.importorskip("mcp")

from mcp import Client, MCPError
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp.types import ElicitRequestParams, ElicitResult, InputRequiredResult

from mcp_project import make_project
from test_mcp_server import HttpServer, api_key

ASKING_TOOLS = '''

import logging

from hermes_agent.mcp import ask_caller

log = logging.getLogger("project.tools")
log.setLevel(logging.DEBUG)


@tool
async def greet() -> str:
    """Greet the caller by the name it gives."""
    log.info("asking for a name")
    form = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    answer = await ask_caller("What is your name?", form, key="user_name")
    log.warning("answered")
    return f"Hello, {answer['name']}!" if answer else "No name given."
'''


@pytest.fixture
def server(tmp_path: Path) -> Iterator[HttpServer]:
    project = make_project(tmp_path)
    with (project / "tools.py").open("a", encoding="utf-8") as tools:
        tools.write(ASKING_TOOLS)
    with HttpServer(project) as served:
        yield served


def client(url: str, key: str, answer: ElicitResult | None = None, **options: Any) -> Client:
    """The SDK's client (stateless 2026-07-28 unless ``mode="legacy"``) for the key's user,
    answering every question with ``answer`` (declaring no elicitation when ``None``)."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    async def elicit(_context: Any, params: ElicitRequestParams) -> ElicitResult:
        asked.append(params.message)
        assert answer is not None
        return answer

    asked: list[str] = []
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=30)
    made = Client(
        streamable_http_client(url, http_client=http),
        read_timeout_seconds=30,
        elicitation_callback=elicit if answer is not None else None,
        **options,
    )
    made.asked = asked  # type: ignore[attr-defined]
    return made


def run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, 120))


YES = ElicitResult(action="accept", content={"approve": True})


def test_an_approval_is_asked_by_an_input_required_result_and_the_retry_answers_it(
    server: HttpServer,
) -> None:
    project = server.project
    ada, bob = api_key(project, "ada"), api_key(project, "bob")

    async def main() -> None:
        async with client(server.url, ada, YES) as caller:
            first = await caller.session.call_tool(
                "drop_table", {"table": "users"}, allow_input_required=True
            )
            assert isinstance(first, InputRequiredResult)
            assert first.result_type == "input_required" and first.request_state
            ((key, request),) = first.input_requests.items()
            assert key == "approval" and request.method == "elicitation/create"
            assert "drop_table" in request.params.message and "users" in request.params.message
            assert not (project / "ran.txt").exists()  # it waits, unrun

            yes = {key: YES}
            # A tampered state is refused before anything runs.
            with pytest.raises(MCPError, match="requestState") as tampered:
                await caller.session.call_tool(
                    "drop_table",
                    {"table": "users"},
                    input_responses=yes,
                    request_state=first.request_state + "x",
                    allow_input_required=True,
                )
            assert tampered.value.error.code == -32602
            # So is the state on other arguments than those it was minted for.
            with pytest.raises(MCPError, match="requestState"):
                await caller.session.call_tool(
                    "drop_table",
                    {"table": "orders"},
                    input_responses=yes,
                    request_state=first.request_state,
                    allow_input_required=True,
                )
            # And another caller's: bob cannot answer ada's approval.
            async with client(server.url, bob, YES) as other:
                with pytest.raises(MCPError, match="requestState"):
                    await other.session.call_tool(
                        "drop_table",
                        {"table": "users"},
                        input_responses=yes,
                        request_state=first.request_state,
                        allow_input_required=True,
                    )
            # A retry without the answer is asked again; the old state is spent then.
            again = await caller.session.call_tool(
                "drop_table",
                {"table": "users"},
                input_responses={"something_else": YES},
                request_state=first.request_state,
                allow_input_required=True,
            )
            assert isinstance(again, InputRequiredResult) and "approval" in again.input_requests
            assert again.request_state != first.request_state
            with pytest.raises(MCPError, match="answered already"):
                await caller.session.call_tool(
                    "drop_table",
                    {"table": "users"},
                    input_responses=yes,
                    request_state=first.request_state,
                    allow_input_required=True,
                )
            done = await caller.session.call_tool(
                "drop_table",
                {"table": "users"},
                input_responses=yes,
                request_state=again.request_state,
                allow_input_required=True,
            )
            assert not done.is_error and done.content[0].text == "dropped users"  # type: ignore[union-attr]
            # Answered: its state resumes nothing any more.
            with pytest.raises(MCPError, match="requestState"):
                await caller.session.call_tool(
                    "drop_table",
                    {"table": "users"},
                    input_responses=yes,
                    request_state=again.request_state,
                    allow_input_required=True,
                )

    run(main())
    assert (project / "ran.txt").read_text().split() == ["drop_table"]
    assert server.stop() == 0
    storage = open_storage(f"sqlite:///{project / 'state.db'}")
    try:  # the call is a run of the trail, as any call is
        runs = [s["request_id"] for s in storage.requests(limit=50)]
        executed = [
            str(r.content)
            for rid in runs
            for r in storage.records(rid)
            if r.stage == "ToolExecutor" and r.role == "tool"
        ]
        assert any("dropped users" in text for text in executed)
    finally:
        storage.close()


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (YES, None),
        (ElicitResult(action="accept", content={"approve": False}), "declined"),
        (ElicitResult(action="decline"), "declined"),
        (ElicitResult(action="cancel"), "cancelled"),
    ],
)
@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_the_sdk_client_answers_an_approval_at_each_revision(
    server: HttpServer, answer: ElicitResult, said: str | None, mode: str
) -> None:
    key = api_key(server.project, "ada")

    async def main() -> Any:
        async with client(server.url, key, answer, mode=mode) as caller:
            result = await caller.call_tool("drop_table", {"table": "users"})
            return result, caller.asked  # type: ignore[attr-defined]

    result, asked = run(main())
    assert len(asked) == 1 and "drop_table" in asked[0]
    if said is None:
        assert not result.is_error and result.content[0].text == "dropped users"
    else:
        assert result.is_error and f"the MCP caller {said} the approval" in result.content[0].text


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_a_tool_asks_its_caller_and_its_log_lines_reach_it(server: HttpServer, mode: str) -> None:
    from mcp.types import LoggingMessageNotificationParams

    key = api_key(server.project, "ada")
    logged: list[tuple[str, Any]] = []

    async def log(params: LoggingMessageNotificationParams) -> None:
        logged.append((params.level, params.data))

    async def main() -> tuple[Any, Any, list[str]]:
        named = ElicitResult(action="accept", content={"name": "Ada"})
        options: dict[str, Any] = {"mode": mode, "logging_callback": log}
        if mode == "auto":
            options["log_level"] = "warning"  # at 2026-07-28 the request asks for its level
        async with client(server.url, key, named, **options) as caller:
            if mode == "legacy":
                with warnings.catch_warnings():  # deprecated at 2026-07-28, not before
                    warnings.simplefilter("ignore", MCPDeprecationWarning)
                    await caller.set_logging_level("warning")
            greeted = await caller.call_tool("greet", {})
        async with client(server.url, key, None, mode=mode) as unable:
            try:
                unanswered = await unable.call_tool("greet", {})
            except MCPError as exc:  # at 2026-07-28: the protocol's missing-capability error
                unanswered = exc
        return greeted, unanswered, caller.asked  # type: ignore[attr-defined]

    greeted, unanswered, asked = run(main())
    assert not greeted.is_error and greeted.content[0].text == "Hello, Ada!"
    assert asked == ["What is your name?"]
    assert logged == [("warning", "answered")]  # below the level asked for: not sent
    if mode == "legacy":  # an error result the caller's model reads
        assert unanswered.is_error and "CallerCannotAnswer" in unanswered.content[0].text
    else:  # a call that needed an undeclared capability: -32021, naming it
        assert isinstance(unanswered, MCPError) and unanswered.error.code == -32021
        assert unanswered.error.data == {"requiredCapabilities": {"elicitation": {"form": {}}}}
        assert "CallerCannotAnswer" in unanswered.error.message


def test_no_other_door_can_answer_a_tools_question() -> None:
    from hermes_agent.mcp import CallerCannotAnswer, ask_caller

    @tool
    async def needs_a_name() -> str:
        """Ask for a name."""
        try:
            await ask_caller("Name?", {"type": "object", "properties": {}})
        except CallerCannotAnswer:
            return "nobody to ask"
        return "asked"

    call = '<tool_call>{"name": "needs_a_name", "arguments": {}}</tool_call>'
    agent = Agent(ScriptedModel([call, "ok"]), tools=[needs_a_name])
    try:
        result = agent.run("go")
        assert result.tool_calls[0].result == "nobody to ask"
    finally:
        agent.close()


def test_a_call_whose_caller_never_comes_back_ends_with_its_question_cancelled() -> None:
    from mcp.types import CallToolResult, TextContent

    from hermes_agent.mcp.asking import Question
    from hermes_agent.mcp.input_required import Exchange, Exchanges, StateRefused

    async def main() -> None:
        exchanges = Exchanges(ttl_s=0.01)
        finished: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        async def call(exchange: Exchange) -> CallToolResult:
            answer = await exchange.ask(Question("Approve?", {"type": "object"}, "approval"))
            finished.set_result(answer.action)
            return CallToolResult(content=[TextContent(type="text", text=answer.action)])

        first = await exchanges.start("ada", call)
        assert isinstance(first, InputRequiredResult) and len(exchanges) == 1
        assert await finished == "cancel"  # expired unanswered: the call goes on, denied
        assert len(exchanges) == 0
        with pytest.raises(StateRefused):
            await exchanges.resume("ada", first.request_state or "", {})

    asyncio.run(asyncio.wait_for(main(), 30))


def test_log_lines_no_one_else_takes_are_still_printed() -> None:
    """The handler that passes a tool's log lines to its caller sits on the root logger: a
    record no other handler takes still reaches standard error, as Python's last resort did
    (in a process of its own: pytest's handlers take every record of its own)."""
    import subprocess
    import sys

    script = (
        "import logging\n"
        "from hermes_agent.mcp.outbox import install\n"
        "install()\n"
        "logging.getLogger('a.tool').warning('the disk is nearly full')\n"
        "logging.getLogger('a.tool').info('below the last resort level')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stderr == "the disk is nearly full\n"
