"""An agent's tools as an MCP server (``hermes-agent mcp serve``), over stdio or streamable HTTP.

    from hermes_agent.mcp.server import AgentMcpServer

    server = AgentMcpServer(agent, ask=True, approve=["delete_file"])
    await server.run_stdio()                   # or: uvicorn.run(server.http_app(), ...)

Each ``tools/call`` is one run of the agent whose model turn is the call itself (a model that
makes exactly the call it was handed, then stops): the ToolSelector and the ToolExecutor treat it
as they treat any call — schema validation (a 400 comes back as an error result), visibility,
approval, rate limits, the timeout, the cache, hooks — and the audit trail records it as a run
of its own (user message ``MCP tools/call <name>``). No model is loaded for it.

Approvals: an MCP client cannot be asked at a terminal (over stdio, standard input *is* the
protocol), so a tool with ``requires_approval`` is denied unless it is named in ``approve``
(``--approve NAME``), or the caller passes an ``approver`` of its own.

With ``ask=True`` the agent itself is one more tool, ``ask(message, session_id?)``: a whole
run with the agent's model, whose answer comes back as text (and, structured, with the run's
status, request id and session id).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from hermes_agent.agent import Agent
from hermes_agent.models.base import ModelBase, ModelSettings
from hermes_agent.pipeline.context import Approver
from hermes_agent.protocol.chatml import to_json, wrap_tool_call
from hermes_agent.tools.registry import Tool
from hermes_agent.types import (
    Completion,
    Message,
    ModelResponse,
    StreamChunk,
    ToolCall,
    ToolCallRecord,
)

if TYPE_CHECKING:
    from mcp.server import Server
    from mcp.server.context import ServerRequestContext
    from mcp.types import (
        CallToolRequestParams,
        CallToolResult,
        ListToolsResult,
        PaginatedRequestParams,
    )
    from starlette.applications import Starlette

CALL_PREFIX = "MCP tools/call "
"""How a call's run starts its user message (the trail shows it so)."""
ASK_TOOL = "ask"
ASK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "message": {"type": "string", "description": "What to ask the agent."},
        "session_id": {
            "type": "string",
            "description": "Continue this conversation (omit for a new one).",
        },
    },
    "required": ["message"],
    "additionalProperties": False,
}


class DirectCallModel(ModelBase):
    """The model of an MCP call's run: its first turn is the call written in the user message
    (``CALL_PREFIX`` + JSON ``{"name", "arguments"}``), its second a short final answer. It
    keeps nothing between requests, so one instance serves any number of concurrent calls."""

    name = "mcp-direct-call"

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        settings: ModelSettings,
    ) -> ModelResponse:
        if messages and messages[-1].role == "tool":
            return ModelResponse(Completion(content="done"), "done", model_name=self.name)
        user = next(m for m in reversed(messages) if m.role == "user")
        request = json.loads(str(user.content).removeprefix(CALL_PREFIX))
        call = ToolCall(name=request["name"], arguments=request["arguments"])
        text = wrap_tool_call(to_json({"name": call.name, "arguments": call.arguments}))
        return ModelResponse(Completion(tool_calls=[call]), text, model_name=self.name)

    async def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        settings: ModelSettings,
    ) -> AsyncIterator[StreamChunk]:
        response = await self.complete(messages, tools, settings)
        yield StreamChunk(response.text)


def approve_only(names: Iterable[str]) -> Approver:
    """An approver that allows the tools in ``names`` and denies the others, saying how to
    allow them."""
    allowed = frozenset(names)

    def approver(call: ToolCall, tool: Tool) -> tuple[bool, str]:
        if tool.name in allowed:
            return True, "approved by --approve when the MCP server was started"
        return False, (
            f"no one can approve calls over MCP; start the server with --approve {tool.name} "
            "to allow this tool"
        )

    return approver


class AgentMcpServer:
    """The MCP face of an agent: ``tools/list`` lists its visible tools (``toolsets`` limits
    them) with their schemas, ``tools/call`` runs a call through its tool pipeline.

    ``approve`` names tools whose calls are approved; ``approver`` replaces that policy with
    your own. ``ask=True`` adds the ``ask`` tool (the agent answering a message)."""

    def __init__(
        self,
        agent: Agent,
        *,
        ask: bool = False,
        toolsets: Iterable[str] | None = None,
        approve: Iterable[str] = (),
        approver: Approver | None = None,
        name: str = "hermes-agent",
    ) -> None:
        from hermes_agent import __version__

        self.agent = agent
        self.ask = ask
        self.toolsets = list(toolsets) if toolsets is not None else agent.toolsets
        self.name = name
        self.version = __version__
        policy = approver if approver is not None else approve_only(approve)
        self._direct = agent.fork(model=DirectCallModel(), approver=policy)
        self._asker = agent.fork(approver=policy)
        if ask and ASK_TOOL in self.tools():
            raise ValueError(f"the agent has a tool named {ASK_TOOL!r}; it cannot also serve ask")

    def tools(self) -> dict[str, Tool]:
        """The tools this server offers (the agent's, as they are now)."""
        return {tool.name: tool for tool in self.agent.registry.visible(self.toolsets)}

    def close(self) -> None:
        """Release what the server's runs used: their threads, worker processes and the MCP
        servers their tools talk to (which start again on the next call)."""
        for fork in (self._direct, self._asker):
            fork.close()

    # -- the protocol ---------------------------------------------------------------------------

    async def list_tools(
        self, _ctx: ServerRequestContext[Any], _params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        from mcp.types import ListToolsResult
        from mcp.types import Tool as McpTool

        listed = [
            McpTool(name=tool.name, description=tool.description, input_schema=tool.parameters)
            for tool in self.tools().values()
        ]
        if self.ask:
            description = "Ask the agent; it may use its tools to answer."
            listed.append(McpTool(name=ASK_TOOL, description=description, input_schema=ASK_SCHEMA))
        return ListToolsResult(tools=listed)

    async def call_tool(
        self, _ctx: ServerRequestContext[Any], params: CallToolRequestParams
    ) -> CallToolResult:
        from mcp import MCPError
        from mcp.types import INVALID_PARAMS

        arguments = dict(params.arguments or {})
        if self.ask and params.name == ASK_TOOL:
            return await self._ask(arguments)
        tools = self.tools()
        if params.name not in tools:
            known = ", ".join([*tools, *([ASK_TOOL] if self.ask else [])]) or "none"
            raise MCPError(INVALID_PARAMS, f"unknown tool {params.name!r}; known: {known}")
        record = await self.call(params.name, arguments)
        if record.status_code == 200:
            return _success(record.result)
        return _failure(record.error or f"the call ended with status {record.status_code}")

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolCallRecord:
        """Run one call of tool ``name`` through the agent's pipeline; its record (status,
        result or error)."""
        message = CALL_PREFIX + to_json({"name": name, "arguments": arguments})
        result = await self._direct.arun(
            message,
            session_id=f"mcp-{uuid.uuid4().hex}",
            tool_choice="auto",
            toolsets=self.toolsets,
        )
        if result.tool_calls:
            return result.tool_calls[0]
        problem = result.error or result.output or "the call did not run"
        return ToolCallRecord(name, arguments, None, result.status, problem)

    async def _ask(self, arguments: dict[str, Any]) -> CallToolResult:
        message, session_id = arguments.get("message"), arguments.get("session_id")
        if not isinstance(message, str) or not message.strip():
            return _failure("ask needs a non-empty 'message' (a string)")
        if session_id is not None and not isinstance(session_id, str):
            return _failure("'session_id' must be a string")
        unknown = sorted(set(arguments) - {"message", "session_id"})
        if unknown:
            return _failure(f"unknown argument {', '.join(unknown)} (allowed: message, session_id)")
        try:
            result = await self._asker.arun(message, session_id=session_id)
        except Exception as exc:  # a run that cannot start (bad session id, broken model)
            return _failure(f"{type(exc).__name__}: {exc}")
        details = {
            "output": result.output,
            "status": result.status,
            "request_id": result.request_id,
            "session_id": result.session_id,
        }
        if result.error:
            details["error"] = result.error
        return _result(result.output or result.error or "", details, error=result.status >= 400)

    # -- transports -----------------------------------------------------------------------------

    def lowlevel(self) -> Server[Any]:
        """The SDK's low-level ``Server`` answering for this agent."""
        from mcp.server import Server

        return Server(
            self.name,
            version=self.version,
            instructions="Tools of a Hermes agent; each call goes through its checks and trail.",
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
        )

    async def run_stdio(self) -> None:
        """Serve one client over this process's standard input and output until it leaves."""
        from mcp.server.stdio import stdio_server

        server = self.lowlevel()
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())

    def http_app(self, *, host: str = "127.0.0.1", path: str = "/mcp") -> Starlette:
        """A Starlette app serving streamable HTTP at ``path`` (serve it with uvicorn). On a
        loopback ``host`` the SDK refuses other Host and Origin headers (DNS rebinding)."""
        return self.lowlevel().streamable_http_app(streamable_http_path=path, host=host)


def _success(value: Any) -> CallToolResult:
    text = value if isinstance(value, str) else to_json(value)
    return _result(text, value if isinstance(value, dict) else None, error=False)


def _failure(message: str) -> CallToolResult:
    return _result(message, None, error=True)


def _result(text: str, structured: dict[str, Any] | None, *, error: bool) -> CallToolResult:
    from mcp.types import CallToolResult, TextContent

    return CallToolResult(
        content=[TextContent(type="text", text=text)],
        structured_content=structured,
        is_error=error,
    )
