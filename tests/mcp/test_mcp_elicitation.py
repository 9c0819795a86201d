"""An approval the agent needs is asked of the MCP caller by elicitation, where it can answer.

A call of a tool that needs approval (not pre-approved with ``--approve``) asks the caller's
client: its answer decides, a refusal or a cancel denies. A client that declared no elicitation
gets the denial as before, saying how to pre-approve. Through the agent's MCP server and the
SDK's client (initialize handshake), in memory.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hermes_agent import Agent, ScriptedModel, tool

pytest.importorskip("mcp")

from mcp import Client
from mcp.types import ElicitRequestParams, ElicitResult

from hermes_agent.mcp.server import AgentMcpServer

ran: list[str] = []


@tool(requires_approval=True)
def delete_file(path: str) -> str:
    """Delete a file.

    Args:
        path: Which.
    """
    ran.append(path)
    return f"deleted {path}"


def call(answer: ElicitResult | None, **server: Any) -> tuple[Any, list[str]]:
    """Call ``delete_file`` over a handshake session whose client answers ``answer`` (no
    elicitation declared when ``None``); the result and the messages the client was shown."""
    agent = Agent(ScriptedModel(["unused"]), tools=[delete_file])
    mcp_server = AgentMcpServer(agent, **server)
    shown: list[str] = []

    async def elicit(_context: Any, params: ElicitRequestParams) -> ElicitResult:
        shown.append(params.message)
        assert answer is not None
        return answer

    async def main() -> Any:
        callback = elicit if answer is not None else None
        async with Client(
            mcp_server.lowlevel(), mode="legacy", elicitation_callback=callback
        ) as client:
            return await client.call_tool("delete_file", {"path": "notes.txt"})

    try:
        return asyncio.run(asyncio.wait_for(main(), 60)), shown
    finally:
        mcp_server.close()
        agent.close()


def test_the_caller_approves_and_the_call_runs() -> None:
    ran.clear()
    result, shown = call(ElicitResult(action="accept", content={"approve": True}))
    assert not result.is_error and result.content[0].text == "deleted notes.txt"
    assert ran == ["notes.txt"]
    (message,) = shown
    assert "delete_file" in message and "notes.txt" in message


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (ElicitResult(action="accept", content={"approve": False}), "declined"),
        (ElicitResult(action="decline"), "declined"),
        (ElicitResult(action="cancel"), "cancelled"),
    ],
)
def test_a_caller_that_does_not_approve_denies_the_call(answer: ElicitResult, said: str) -> None:
    ran.clear()
    result, shown = call(answer)
    assert result.is_error and f"the MCP caller {said} the approval" in result.content[0].text
    assert ran == [] and len(shown) == 1


def test_a_caller_that_cannot_answer_is_not_asked() -> None:
    ran.clear()
    result, shown = call(None)
    assert result.is_error and "--approve delete_file" in result.content[0].text
    assert ran == [] and shown == []


def test_pre_approved_tools_and_an_own_approver_ask_nobody() -> None:
    ran.clear()
    refused = ElicitResult(action="decline")
    approved, asked = call(refused, approve=["delete_file"])
    assert not approved.is_error and asked == []
    denied, asked = call(refused, approver=lambda _call, _tool: (False, "not today"))
    assert denied.is_error and "not today" in denied.content[0].text and asked == []
    assert ran == ["notes.txt"]


# -- the agent's MCP client answering a server's request for input ------------------------------


def form(required: list[str], **fields: dict[str, Any]) -> Any:
    from mcp.types import ElicitRequestFormParams

    schema = {"type": "object", "properties": fields, "required": required}
    return ElicitRequestFormParams(message="Who are you?", requested_schema=schema)


def answer(params: Any, approver: Any) -> ElicitResult:
    from hermes_agent.tools.mcp.client import answer_elicitation

    return asyncio.run(answer_elicitation("crm", approver, params))


def test_the_client_answers_with_the_forms_defaults_when_the_approver_approves() -> None:
    asked: list[tuple[str, dict[str, Any], str]] = []

    def approver(call: Any, tool: Any) -> tuple[bool, str]:
        asked.append((call.name, call.arguments, tool.name))
        return True, "yes"

    params = form(
        ["name"],
        name={"type": "string", "default": "Ada"},
        age={"type": "integer", "default": 36},
        note={"type": "string"},
    )
    result = answer(params, approver)
    assert result.action == "accept" and result.content == {"name": "Ada", "age": 36}
    ((name, arguments, tool),) = asked
    assert name == tool == "mcp_elicitation"
    assert arguments == {"server": "crm", "message": "Who are you?", "answer": result.content}


def test_the_client_declines_what_the_approver_denies_or_it_cannot_fill_in() -> None:
    from mcp.types import ElicitRequestURLParams

    async def deny(call: Any, tool: Any) -> bool:  # an async approver is awaited
        return False

    asked: list[Any] = []
    params = form([], name={"type": "string", "default": "Ada"})
    assert answer(params, deny).action == "decline"
    # A required field without a default, or a page to open: nobody is asked.
    assert answer(form(["name"], name={"type": "string"}), asked.append).action == "decline"
    url = ElicitRequestURLParams(message="Sign in", url="https://example.com", elicitation_id="1")
    assert answer(url, asked.append).action == "decline"
    assert asked == []


def test_an_agent_built_from_a_config_puts_a_servers_question_to_its_approver_then(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from hermes_agent import build_agent
    from hermes_agent.config import parse_config
    from hermes_agent.tools.mcp import client

    given: list[Any] = []

    class NoServers:
        def __init__(self, *_args: Any, approver: Any = None, **_kw: Any) -> None:
            self.tools: list[Any] = []
            given.append(approver)

        def close(self) -> None:
            pass

    monkeypatch.setattr(client, "open_mcp_toolsets", NoServers)
    servers = {"crm": {"command": "crm-server"}}
    config = parse_config({"model": {"provider": "scripted"}, "mcp_servers": servers})
    agent = build_agent(config, model=ScriptedModel(["unused"]))
    try:
        [ask] = given
        assert ask(None, None) is False  # no approver yet: the question is declined
        asked: list[str] = []
        # Set after loading, as the command line sets its own.
        agent.approver = lambda call, _tool: asked.append(call) or True
        assert ask("question", None) is True and asked == ["question"]
    finally:
        agent.close()
