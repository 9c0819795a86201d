"""An agent's tools as an MCP server (``hermes-agent mcp serve``), over stdio or streamable HTTP.

    from hermes_agent.mcp.server import AgentMcpServer

    server = AgentMcpServer(agent, ask=True, approve=["delete_file"])
    await server.run_stdio()                   # or: uvicorn.run(server.http_app(), ...)

Each ``tools/call`` is one run of the agent whose model turn is the call itself (a model that
makes exactly the call it was handed, then stops): the ToolSelector and the ToolExecutor treat it
as they treat any call — schema validation (a 400 comes back as an error result), visibility,
approval, rate limits, the timeout, the cache, hooks — and the audit trail records it as a run
of its own (user message ``MCP tools/call <name>``). No model is loaded for it.

Approvals: nobody can be asked at a terminal (over stdio, standard input *is* the protocol).
A tool named in ``approve`` (``--approve NAME``) is approved; for any other tool with
``requires_approval`` the MCP caller is asked (a form of one boolean, ``approve``) when its
client declared elicitation: on a session of 2025-11-25 or before by an elicitation request,
at 2026-07-28 by an input-required result (``input_required``: the call waits for the retry
that brings the answer). Else the call is denied. An ``approver`` of the caller's own replaces
all of that. A tool asks its caller for input the same way (``asking.ask_caller``), and its
log lines reach the caller as log messages (``outbox``).

With ``ask=True`` the agent itself is one more tool, ``ask(message, session_id?)``: a whole
run with the agent's model, whose answer comes back as text (and, structured, with the run's
status, request id and session id).

Where runs go: through a run backend (``runs.backend.RunBackend``), the seam every front door
of the service uses. ``ask`` starts a run there and follows its events (an approval it asks
for is answered by this server's policy, a cancelled MCP request cancels the run), so it runs
in process or on the queue's workers as the service does, counted with the service's own
runs when the server is mounted in it (``service.mcp``). A direct tool call has no model turn
to queue: it runs here, admitted by the same gate (``backend.admitted``). Given no backend, the
server builds its own where every door's is built (``backends.build_backend``): in process,
with the service's default limits.

Who calls: every call runs as a ``Principal`` and passes the run layer's gate. Over HTTP with
``keys`` the caller sends the service's API key (``Authorization: Bearer <key>``; anything else
is a 401) and runs as that key's user; otherwise (stdio, or HTTP without keys, which only a
loopback address allows) as the configured local user ``mcp!<name>`` — an id no API key or
channel user can have. A session id given to ``ask`` is the caller's own (the store keeps it as
``<user>:<session>``, as the REST service does), so no MCP client can name another user's
conversation.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import aclosing, suppress
from typing import TYPE_CHECKING, Any

from hermes_agent.agent import Agent
from hermes_agent.errors import HermesAgentError
from hermes_agent.mcp.asking import (
    Answer,
    Asker,
    Caller,
    CallerCannotAnswer,
    Capability,
    Question,
    Request,
    Roots,
    Sampling,
    asking,
    can_ask,
    stop_asking,
)
from hermes_agent.mcp.input_required import Exchange, Exchanges, StateRefused
from hermes_agent.mcp.outbox import Outbox, SessionLevels, install
from hermes_agent.mcp.sessions import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_SESSIONS_PER_USER,
    SessionsPerUser,
)
from hermes_agent.models.base import ModelBase, ModelSettings
from hermes_agent.pipeline.context import Approver
from hermes_agent.protocol.chatml import to_json, wrap_tool_call
from hermes_agent.runs.backend import ApprovalConflict, RunBackend, RunNotFound, RunView
from hermes_agent.runs.events import ApprovalRequiredEvent, read_known
from hermes_agent.runs.gate import RunRejected, widening
from hermes_agent.runs.keys import authenticate
from hermes_agent.runs.principal import (
    Principal,
    is_loopback,
    mcp_local_user,
    stored_session_id,
)
from hermes_agent.runs.request import RunRequest
from hermes_agent.tools.mcp.content import content_blocks
from hermes_agent.tools.mcp.progress import listen, reset
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
        EmptyResult,
        InputRequiredResult,
        ListToolsResult,
        PaginatedRequestParams,
        SetLevelRequestParams,
    )
    from starlette.applications import Starlette

    from hermes_agent.backends import Backends
    from hermes_agent.runs.keys import KeyStore
    from hermes_agent.runs.quotas import Quotas
    from hermes_agent.runs.settings import ServiceSettings

INSTRUCTIONS = "Tools of a Hermes agent; each call goes through its checks and trail."
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


KEEPALIVE_S = 15.0
"""How often following an ``ask`` run wakes without an event (nothing is sent then)."""


class AgentMcpServer:
    """The MCP face of an agent: ``tools/list`` lists its visible tools (``toolsets`` limits
    them) with their schemas, ``tools/call`` runs a call through its tool pipeline.

    ``approve`` names tools whose calls are approved; ``approver`` replaces that policy with
    your own. ``ask=True`` adds the ``ask`` tool (the agent answering a message).

    ``backend`` is where ``ask`` runs go (the service's, when mounted in it); without one the
    server keeps one of its own over ``agent``, built by ``backends.build_backend`` with
    ``settings`` (the service's defaults when ``None``) and, when given, ``quotas``."""

    def __init__(
        self,
        agent: Agent,
        *,
        ask: bool = False,
        toolsets: Iterable[str] | None = None,
        approve: Iterable[str] = (),
        approver: Approver | None = None,
        name: str = "hermes-agent",
        keys: KeyStore | None = None,
        local_user: Principal | None = None,
        backend: RunBackend | None = None,
        settings: ServiceSettings | None = None,
        quotas: Quotas | None = None,
    ) -> None:
        from hermes_agent import __version__

        self.agent = agent
        self.keys = keys
        """Over HTTP: the service's API keys every caller must present (``None``: none)."""
        self.local_user = local_user or mcp_local_user()
        self._own: Backends | None = None
        if backend is None:  # built where every door's is (its callers present no keys to it)
            from hermes_agent.backends import build_backend
            from hermes_agent.runs.settings import ServiceSettings

            self._own = build_backend(
                agent, settings or ServiceSettings(), with_keys=False, quotas=quotas
            )
            backend = self._own.backend
        self.backend: RunBackend = backend
        self.ask = ask
        if toolsets is not None:  # the server may narrow the operator's agent, never widen it
            refusal = widening(toolsets, None, agent)
            if refusal is not None:
                raise ValueError(refusal.message)
        self.toolsets = list(toolsets) if toolsets is not None else agent.toolsets
        self.name = name
        self.version = __version__
        self.policy: Approver = approver if approver is not None else approve_only(approve)
        """Who answers the approvals of this server's calls and runs."""
        self._ask_the_caller = approver is None
        self._exchanges = Exchanges()
        """Calls waiting for their 2026-07-28 callers' answers (input-required results)."""
        self._log_levels = SessionLevels()
        self._state_key = os.urandom(32)
        """Seals the ``requestState`` of this process's input-required results."""
        self._direct = agent.fork(model=DirectCallModel(), approver=self._approve)
        if ask and ASK_TOOL in self.tools():
            raise ValueError(f"the agent has a tool named {ASK_TOOL!r}; it cannot also serve ask")

    def tools(self) -> dict[str, Tool]:
        """The tools this server offers (the agent's, as they are now)."""
        return {tool.name: tool for tool in self.agent.registry.visible(self.toolsets)}

    def close(self) -> None:
        """Release what the server's runs used: their threads, worker processes and the MCP
        servers their tools talk to (which start again on the next call)."""
        self._direct.close()
        if self._own is not None:
            self._own.close()

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

    def principal(self, ctx: ServerRequestContext[Any] | None) -> Principal | None:
        """Who is calling: the API key's user over HTTP with keys (``None`` when the request
        has no valid key), else the local user."""
        request = ctx.request if ctx is not None else None
        if self.keys is None or request is None:
            return self.local_user
        headers = getattr(request, "headers", None)
        return authenticate(self.keys, headers.get("authorization") if headers else None)

    async def call_tool(
        self, ctx: ServerRequestContext[Any], params: CallToolRequestParams
    ) -> CallToolResult | InputRequiredResult:
        from mcp import MCPError
        from mcp.types import INVALID_PARAMS

        principal = self.principal(ctx)
        if principal is None:  # the HTTP middleware refuses these first; never run anonymously
            return _failure("missing or invalid API key: send 'Authorization: Bearer <key>'")
        arguments = dict(params.arguments or {})
        if params.request_state is not None:  # a retry answering a waiting call's questions
            try:
                return await self._exchanges.resume(
                    principal.user_id, params.request_state, params.input_responses, ctx
                )
            except StateRefused as exc:
                raise MCPError(INVALID_PARAMS, str(exc)) from None
        if params.name == ASK_TOOL and not self.ask:
            raise MCPError(INVALID_PARAMS, "unknown tool 'ask': this server was started without it")
        tools = self.tools()
        if params.name not in tools and not (self.ask and params.name == ASK_TOOL):
            known = ", ".join([*tools, *([ASK_TOOL] if self.ask else [])]) or "none"
            raise MCPError(INVALID_PARAMS, f"unknown tool {params.name!r}; known: {known}")
        declared = _capabilities(ctx)
        if not declared:
            return await self._handle(ctx, params.name, arguments, principal, Caller(None))
        if ctx.protocol_version < "2026-07-28":
            caller = Caller(_session_asker(ctx), declared)
            return await self._handle(ctx, params.name, arguments, principal, caller)

        async def run(exchange: Exchange) -> CallToolResult:
            caller = Caller(exchange.ask, declared)
            return await self._handle(ctx, params.name, arguments, principal, caller, exchange)

        return await self._exchanges.start(principal.user_id, run)

    async def _handle(
        self,
        ctx: ServerRequestContext[Any] | None,
        name: str,
        arguments: dict[str, Any],
        principal: Principal,
        caller: Caller,
        exchange: Exchange | None = None,
    ) -> CallToolResult:
        """One call, its approvals and questions put to ``caller`` (through ``exchange`` at
        2026-07-28). A call that failed for want of a capability its caller did not declare
        is, at 2026-07-28, the protocol's error ``-32021`` naming the capability."""
        legacy = ctx is not None and ctx.protocol_version < "2026-07-28"
        outbox = Outbox(ctx, self._log_levels.get(ctx) if legacy else None)
        if exchange is not None:  # each retry comes in on a request of its own
            exchange.on_resume = lambda request: setattr(outbox, "ctx", request or outbox.ctx)
        token, asked = listen(outbox.progress), asking(caller)
        try:
            if name == ASK_TOOL and self.ask:
                return await self._ask(arguments, principal)
            try:
                record = await self.call(name, arguments, principal)
            except RunRejected as exc:
                return _failure(f"refused ({exc.status_code}): {exc.message}")
        finally:
            stop_asking(asked)
            reset(token)
            await outbox.close()  # every report and log line goes before the result
        if record.status_code == 200:
            return _success(record.result)
        refusal = caller.refusal  # the call failed of it only if the tool let it through
        let_through = refusal is not None and (record.error or "").endswith(
            f"{type(refusal).__name__}: {refusal}"
        )
        if refusal is not None and let_through and ctx is not None and not legacy:
            raise _missing_capability(refusal)
        return _failure(record.error or f"the call ended with status {record.status_code}")

    async def set_logging_level(
        self, ctx: ServerRequestContext[Any], params: SetLevelRequestParams
    ) -> EmptyResult:
        """``logging/setLevel`` (2025-11-25 and before): the least severe level of the log
        messages this session's calls send (``outbox``)."""
        from mcp.types import EmptyResult

        self._log_levels.set(ctx, params.level)
        return EmptyResult()

    async def call(
        self, name: str, arguments: dict[str, Any], principal: Principal | None = None
    ) -> ToolCallRecord:
        """Run one call of tool ``name`` through the agent's pipeline as ``principal`` (the
        local user by default); its record (status, result or error). ``RunRejected`` when
        the gate refuses it. It runs here, admitted by the backend's gate: counted among the
        runs in flight and against the day's quota."""
        who = principal or self.local_user
        message = CALL_PREFIX + to_json({"name": name, "arguments": arguments})
        toolsets = list(self.toolsets) if self.toolsets is not None else None
        request = RunRequest(
            message=message, session_id=f"mcp-{uuid.uuid4().hex}", toolsets=toolsets
        )
        async with self.backend.admitted(who, request, f"mcp tools/call {name}"):
            result = await self._direct.arun(  # no model: its turn is the call itself
                message,
                session_id=stored_session_id(who.user_id, str(request.session_id)),
                tool_choice="auto",
                toolsets=self.toolsets,
                new_session=True,  # made up above: there is no history to read
            )
        if result.tool_calls:
            return result.tool_calls[0]
        problem = result.error or result.output or "the call did not run"
        return ToolCallRecord(name, arguments, None, result.status, problem)

    async def _ask(self, arguments: dict[str, Any], principal: Principal) -> CallToolResult:
        message, session_id = arguments.get("message"), arguments.get("session_id")
        if not isinstance(message, str) or not message.strip():
            return _failure("ask needs a non-empty 'message' (a string)")
        if session_id is not None and not isinstance(session_id, str):
            return _failure("'session_id' must be a string")
        unknown = sorted(set(arguments) - {"message", "session_id"})
        if unknown:
            return _failure(f"unknown argument {', '.join(unknown)} (allowed: message, session_id)")
        toolsets = list(self.toolsets) if self.toolsets is not None else None
        request = RunRequest(message=message, session_id=session_id, toolsets=toolsets)
        unheard = asking(None)  # the run's own tools cannot ask this caller, in either engine
        try:
            view = await self.backend.start(principal, request, listening=True)
        except RunRejected as exc:
            return _failure(f"refused ({exc.status_code}): {exc.message}")
        except HermesAgentError as exc:  # refused before it started (a bad session id)
            return _failure(f"{type(exc).__name__}: {exc}")
        finally:
            stop_asking(unheard)
        try:
            view = await self._follow(view.request_id, principal)
        except asyncio.CancelledError:  # the MCP client cancelled its request: so is the run
            with suppress(RunNotFound):
                await asyncio.shield(self.backend.cancel(view.request_id, principal))
            raise
        return _answer(view)

    async def _follow(self, request_id: str, principal: Principal) -> RunView:
        """Follow an ``ask`` run to its end, answering its approvals by this server's policy;
        the run as it ended."""
        following = await self.backend.events(request_id, principal, 0, KEEPALIVE_S, started=True)
        async with aclosing(following) as items:
            async for item in items:
                event = read_known(item[1]) if item is not None else None
                if isinstance(event, ApprovalRequiredEvent):
                    approved, reason = await self._decide(event)
                    with suppress(ApprovalConflict, RunNotFound):  # expired, or answered
                        await self.backend.answer(event.approval_id, principal, approved, reason)
        view = await self.backend.view(request_id, principal)
        while not view.done:  # the log ended before the run did (a service shutting down)
            view = await self.backend.wait(request_id, principal)
            if not view.done:
                await asyncio.sleep(0.1)
        return view

    async def _decide(self, asked: ApprovalRequiredEvent) -> tuple[bool, str]:
        """One approval of an ``ask`` run, as this server's policy decides it (``approve``, or
        the ``approver`` given): nobody can be asked over MCP."""
        tool = self.agent.registry.get(asked.tool)
        if tool is None:
            return False, f"no tool {asked.tool!r} is served"
        return await self._approve(ToolCall(name=asked.tool, arguments=asked.arguments), tool)

    async def _approve(self, call: ToolCall, tool: Tool) -> tuple[bool, str]:
        """An approval of a call this server runs: the policy's answer; where the built-in
        policy (``approve``) would deny, the MCP caller is asked instead when its client
        declared elicitation (by elicitation, or at 2026-07-28 an input-required result)."""
        decision = self.policy(call, tool)
        if inspect.isawaitable(decision):
            decision = await decision
        if isinstance(decision, tuple):
            approved, reason = bool(decision[0]), str(decision[1])
        else:
            approved = bool(decision)
            reason = f"{'approved' if approved else 'denied'} by the MCP server's approver"
        if approved or not self._ask_the_caller or not can_ask():
            return approved, reason
        return await _ask_approval(call, tool)

    # -- transports -----------------------------------------------------------------------------

    def lowlevel(self) -> Server[Any]:
        """The SDK's low-level ``Server`` answering for this agent."""
        import warnings

        from mcp.server import Server
        from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
        from mcp.shared.exceptions import MCPDeprecationWarning

        install()  # a tool's log lines reach its caller (outbox)
        with warnings.catch_warnings():  # logging is deprecated at 2026-07-28, not before
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            server = Server(
                self.name,
                version=self.version,
                instructions=INSTRUCTIONS,
                on_list_tools=self.list_tools,
                on_call_tool=self.call_tool,
                on_set_logging_level=self.set_logging_level,
            )
        security = RequestStateSecurity(
            keys=[self._state_key], ttl=self._exchanges.ttl_s, bind_principal=self._state_owner
        )
        server.middleware.append(RequestStateBoundary(security, default_audience=self.name))
        return server

    def _state_owner(self, ctx: ServerRequestContext[Any]) -> str | None:
        """Whom a ``requestState`` is bound to: the caller's principal."""
        principal = self.principal(ctx)
        return principal.user_id if principal is not None else None

    async def run_stdio(self) -> None:
        """Serve one client over this process's standard input and output until it leaves."""
        from mcp.server.stdio import stdio_server

        server = self.lowlevel()
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())

    def http_app(
        self,
        *,
        host: str = "127.0.0.1",
        path: str = "/mcp",
        max_sessions_per_user: int = DEFAULT_MAX_SESSIONS_PER_USER,
        session_idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
    ) -> Starlette:
        """A Starlette app serving streamable HTTP at ``path`` (serve it with uvicorn). On a
        loopback ``host`` the SDK refuses other Host and Origin headers (DNS rebinding). With
        ``keys`` every request must carry a valid API key (401 otherwise); without them only
        a loopback ``host`` is allowed (``ValueError``). Each user holds at most
        ``max_sessions_per_user`` sessions (429 beyond); a session idle for
        ``session_idle_timeout_s`` is closed (``sessions.SessionsPerUser``)."""
        if self.keys is None and not is_loopback(host):
            raise ValueError(
                f"an MCP server on {host} without API keys would let anyone on the network run "
                "the agent's tools; give it the service's keys (--auth keys) or listen on "
                "127.0.0.1"
            )
        app = self.lowlevel().streamable_http_app(
            streamable_http_path=path, host=host, session_idle_timeout=session_idle_timeout_s
        )
        app.add_middleware(
            SessionsPerUser,
            identify=self._identify,
            max_sessions_per_user=max_sessions_per_user,
            idle_timeout_s=session_idle_timeout_s,
        )
        return app

    async def _identify(self, authorization: str | None) -> Principal | None:
        """The caller of an HTTP request: its API key's user (``None`` without a valid
        one), or the local user when the server has no keys."""
        if self.keys is None:
            return self.local_user
        from starlette.concurrency import run_in_threadpool

        return await run_in_threadpool(authenticate, self.keys, authorization)


def _answer(view: RunView) -> CallToolResult:
    """An ``ask`` run's ending as the tool's result: the answer's text, and in structured
    form the run's status, ids and error."""
    result = view.result or {}
    output = result.get("output") or view.output or ""
    error = view.error or result.get("error")
    code = result.get("status", view.status_code)
    details: dict[str, Any] = {
        "output": output,
        "status": code,
        "run_status": view.status,
        "request_id": view.request_id,
        "session_id": view.session_id,
    }
    if error:
        details["error"] = error
    failed = view.status != "completed" or (isinstance(code, int) and code >= 400)
    return _result(output or error or view.status, details, error=failed)


APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "approve": {
            "type": "boolean",
            "title": "Approve",
            "description": "Let the agent run this call.",
        }
    },
    "required": ["approve"],
}


def _capabilities(ctx: ServerRequestContext[Any]) -> frozenset[Capability]:
    """What the caller can be asked: what its client declared of elicitation, sampling and
    roots (on its session, or at 2026-07-28 in the request's ``_meta``)."""
    from mcp.types import (
        ClientCapabilities,
        ElicitationCapability,
        RootsCapability,
        SamplingCapability,
    )

    wanted: dict[Capability, ClientCapabilities] = {
        "elicitation": ClientCapabilities(elicitation=ElicitationCapability()),
        "sampling": ClientCapabilities(sampling=SamplingCapability()),
        "roots": ClientCapabilities(roots=RootsCapability()),
    }
    try:
        return frozenset(
            name for name, caps in wanted.items() if ctx.session.check_client_capability(caps)
        )
    except Exception:  # no session to ask
        return frozenset()


def _missing_capability(refusal: CallerCannotAnswer) -> Exception:
    """The protocol's error for a call that needed what its caller did not declare, with the
    capability as the SDK's own resolvers name it (``requiredCapabilities``)."""
    from mcp import MCPError
    from mcp.types import (
        MISSING_REQUIRED_CLIENT_CAPABILITY,
        ClientCapabilities,
        ElicitationCapability,
        FormElicitationCapability,
        MissingRequiredClientCapabilityErrorData,
        RootsCapability,
        SamplingCapability,
    )

    required = {
        "elicitation": ClientCapabilities(
            elicitation=ElicitationCapability(form=FormElicitationCapability())
        ),
        "sampling": ClientCapabilities(sampling=SamplingCapability()),
        "roots": ClientCapabilities(roots=RootsCapability()),
    }[refusal.capability]
    data = MissingRequiredClientCapabilityErrorData(required_capabilities=required)
    message = f"the call needs the client capability {refusal.capability}, not declared"
    return MCPError(
        MISSING_REQUIRED_CLIENT_CAPABILITY,
        f"{message}: CallerCannotAnswer: {refusal}",
        data.model_dump(by_alias=True, mode="json", exclude_none=True),
    )


def _session_asker(ctx: ServerRequestContext[Any]) -> Asker:
    """Requests put to the caller of a session (2025-11-25 and before) as requests of the
    server's own, sent while the call waits."""

    async def ask(request: Request) -> Answer:
        try:
            if isinstance(request, Sampling):
                return await _sample(ctx, request)
            if isinstance(request, Roots):
                return await _list_roots(ctx)
            answer = await ctx.session.elicit_form(
                request.message, request.schema, related_request_id=ctx.request_id
            )
        except Exception:  # the caller could not be asked, or refused: nobody answered
            return Answer("cancel")
        if answer.action == "accept":
            return Answer("accept", dict(answer.content or {}))
        return Answer(answer.action)

    return ask


async def _sample(ctx: ServerRequestContext[Any], request: Sampling) -> Answer:
    """A completion of the caller's model, asked on the call's own request stream."""
    import warnings

    from mcp.types import SamplingMessage

    messages = [SamplingMessage.model_validate(m) for m in request.messages]
    with warnings.catch_warnings():  # deprecated at 2026-07-28 (stateless), not before
        warnings.simplefilter("ignore")
        result = await ctx.session.create_message(
            messages,
            max_tokens=request.max_tokens,
            system_prompt=request.system,
            related_request_id=ctx.request_id,
        )
    return Answer("accept", result.model_dump(by_alias=True, mode="json", exclude_none=True))


async def _list_roots(ctx: ServerRequestContext[Any]) -> Answer:
    """The caller's roots, asked on the call's own request stream (a client need not open
    the standalone one that ``session.list_roots`` would use)."""
    from mcp.shared.message import ServerMessageMetadata
    from mcp.types import ListRootsRequest, ListRootsResult

    roots = await ctx.session.send_request(
        ListRootsRequest(),
        ListRootsResult,
        metadata=ServerMessageMetadata(related_request_id=ctx.request_id),
    )
    return Answer("accept", roots.model_dump(by_alias=True, mode="json", exclude_none=True))


async def _ask_approval(call: ToolCall, tool: Tool) -> tuple[bool, str]:
    """Ask the MCP caller to approve ``call`` (a form of one boolean)."""
    from hermes_agent.mcp.asking import ask

    arguments = to_json(call.arguments)
    if len(arguments) > 500:
        arguments = arguments[:500] + "…"
    message = f"The agent's tool {tool.name!r} needs approval to run with {arguments}. Approve?"
    answer = await ask(Question(message, APPROVAL_SCHEMA, key="approval"))
    if answer.action == "accept" and answer.content.get("approve") is True:
        return True, "approved by the MCP caller"
    said = "cancelled" if answer.action == "cancel" else "declined"
    return False, f"the MCP caller {said} the approval"


def _success(value: Any) -> CallToolResult:
    blocks = content_blocks(value)
    if blocks is not None:
        try:
            return _blocks(blocks)
        except ValueError:  # not blocks MCP knows: sent as the JSON they are
            pass
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


def _blocks(blocks: list[dict[str, Any]]) -> CallToolResult:
    """A ``Content`` result's blocks as MCP content blocks (``ValueError`` when one is not a
    valid block)."""
    from mcp.types import CallToolResult, ContentBlock
    from pydantic import TypeAdapter

    adapter: TypeAdapter[ContentBlock] = TypeAdapter(ContentBlock)
    return CallToolResult(
        content=[adapter.validate_python(block) for block in blocks], is_error=False
    )
