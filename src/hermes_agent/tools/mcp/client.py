"""MCP servers' tools as ordinary ``Tool``s (the ``mcp_servers:`` section of the config).

    mcp_servers:
      calc:                                   # toolset "calc"
        command: python
        args: [calc_server.py]
        env: {CALC_TOKEN: "${CALC_TOKEN}"}
      weather:
        url: http://127.0.0.1:8931/mcp
        headers: {Authorization: "Bearer ${WEATHER_TOKEN}"}
        requires_approval: true
      notes:
        url: https://notes.example.com/mcp
        oauth: {}                             # sign in with OAuth when asked (``oauth``)

``open_mcp_toolsets`` starts each server (or connects to it), lists its tools and wraps each in a
``Tool`` whose schema is the server's (made strict where that is safe: ``schemas``). From there
on an MCP tool is a tool like any other: the ToolSelector validates its arguments (bad ones never
reach the server), asks for approval, the ToolExecutor enforces its timeout, caches, audits, and
a dry run stops before it. Only the call itself goes to the server.

The SDK's traps, and what is done about each:

- **No default read timeout; ``initialize`` can hang on a dead server.** Connecting (start,
  handshake, listing) is bounded by ``connect_timeout`` (with ``oauth.sign_in_timeout`` on
  top for a server that may send the user to sign in) and every call by its tool's timeout,
  both on the SDK's side (``read_timeout_seconds``) and around it.
- **A session must be closed by the task that opened it** (its transport holds anyio cancel
  scopes). One supervisor task per server opens the ``Client``, hands it out, waits for a stop
  signal and closes it, all in that one task; calls run in their own tasks and only send
  requests on the session.
- **The session is bound to its event loop.** Sessions live on a loop of their own, on a
  background thread (``_loop.LoopThread``), that outlives single runs; a call from any loop (a
  sync ``Agent.run``, ``arun`` in a service) is handed over to it.
- **A server that dies or hangs.** A lost connection makes the call an error result and stops
  the supervisor; the next call starts the server again. When a call times out, the session
  is checked at once (a tools listing that must come back within 2 s); a server that does not
  answer is stopped, and the next call starts it again. Connecting again after failures waits
  with exponential backoff (0.5 s doubling, at most 30 s); a call that cannot wait that long
  fails at once, saying when the next try is.
- **The child process outlives us.** ``McpToolsets.close`` (called by ``Agent.close``, and at
  interpreter exit) stops every supervisor, which closes stdin, then terminates and kills the
  server's process group.
- **Errors arrive as exception groups.** ``describe`` flattens a group into one line that names
  each distinct cause.
- **A server decides how much it sends.** What a server can make the agent hold is bounded:
  a listing of more than ``max_tools`` tools (all pages together, at most ``MAX_TOOL_PAGES``
  pages) is refused when the server is loaded; one call's result larger than
  ``max_result_bytes`` (as JSON) is an error result, never kept, shown to the model or written
  to the trail; and a call that never ends, or streams forever, ends at its timeout.
- **The SDK reads a message whole, then parses it holding the GIL.** A listing of 44 MB
  stalled every thread of the process for seconds before ``max_tools`` could count it. Each
  message is bounded while it arrives (``_transport``: twice ``max_result_bytes``, at least
  1 MiB): past it, reading stops and the session fails, saying so.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import math
import re
import sys
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from hermes_agent.config import McpServerConfig
from hermes_agent.errors import (
    ConfigError,
    HermesAgentError,
    MissingDependencyError,
    ToolDefinitionError,
)
from hermes_agent.tools.mcp._loop import LoopThread
from hermes_agent.tools.mcp.elicitation import Approver, answer_elicitation
from hermes_agent.tools.mcp.pins import PinStore, definition_hash, refusal
from hermes_agent.tools.mcp.results import McpError as McpError
from hermes_agent.tools.mcp.results import bounded, bounded_result, describe, tool_result
from hermes_agent.tools.mcp.schemas import normalise
from hermes_agent.tools.registry import Tool

if TYPE_CHECKING:
    from mcp import Client
    from mcp.client.session import ClientRequestContext
    from mcp.types import ElicitRequestParams, ElicitResult
    from mcp.types import Tool as McpTool

    from hermes_agent.tools.mcp._transport import ReadProblem
    from hermes_agent.tools.mcp.oauth import OAuthSignIn

logger = logging.getLogger("hermes_agent.mcp")


BACKOFF_START = 0.5
BACKOFF_MAX = 30.0
PROBE_TIMEOUT = 2.0
"""Seconds a session whose call timed out has to answer a check (a tools listing)."""
CLOSE_TIMEOUT = 10.0
"""Seconds a server gets to shut down (the SDK escalates to SIGTERM and SIGKILL within it)."""
DEADLINE_BACKUP = 0.5
"""Seconds past a tool's timeout at which the session gives up on a call the executor, whose
deadline is the tool's timeout, has not already ended."""
MAX_TOOL_PAGES = 100
_SERVER_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
SDK_SSE_TOO_LARGE = "Server-sent event exceeded the"
"""How the SDK's event-stream reader says an event was past ``max_sse_event_size``."""


@dataclass(frozen=True, slots=True)
class McpToolInfo:
    """Where an MCP tool came from: its server, its name there, and how its schema was
    normalised (``schemas.normalise``'s notes; empty when it was strict already)."""

    server: str
    remote_name: str
    schema_notes: tuple[str, ...] = ()
    original_schema: dict[str, Any] = field(default_factory=dict)


def require_sdk() -> None:
    """Raise ``MissingDependencyError`` (naming the extra) when the ``mcp`` SDK is missing."""
    try:
        import mcp  # noqa: F401
    except ImportError as exc:
        raise MissingDependencyError(
            'MCP needs the official mcp SDK: pip install "hermes-agent-core[mcp]"'
        ) from exc


class McpConnection:
    """One MCP server and the session to it, restarted on demand.

    Everything but ``__init__`` runs on the background loop: the state is touched by one
    thread only.
    """

    def __init__(
        self,
        name: str,
        config: McpServerConfig,
        pins: PinStore | None = None,
        approver: Approver | None = None,
        sign_in: OAuthSignIn | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self.pins = pins
        self.approver = approver
        self.sign_in = sign_in
        """Where an ``oauth:`` server's tokens are kept and how the user signs in (``None``:
        in memory, and the browser)."""
        if sign_in is None and config.oauth is not None:
            from hermes_agent.tools.mcp.oauth import OAuthSignIn

            self.sign_in = OAuthSignIn()  # one for the connection: its tokens outlive a session
        """Answers the server's elicitation requests (``answer_elicitation``); ``None``: the
        client declares no elicitation, and the server cannot ask."""
        self.definitions: dict[str, str] = {}
        """The hash of each tool's definition (``pins.definition_hash``) in the last listing."""
        self._listed: Client | None = None  # the session whose listing ``definitions`` holds
        self._client: Client | None = None
        self._ready: asyncio.Future[Client] | None = None
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._lock: asyncio.Lock | None = None
        self._probe: asyncio.Task[None] | None = None
        self._failures = 0
        self._retry_at = 0.0
        self._noted: ReadProblem | None = None  # what the current session's transport saw
        self.last_error: str | None = None
        self.starts = 0
        """How many sessions were opened (1 + restarts)."""

    # -- calls --------------------------------------------------------------------------------

    async def list_tools(self) -> list[McpTool]:
        """Every tool the server lists (all pages), connecting first if need be."""
        # Connecting is bounded by the supervisor (which then stops the server: allow for it).
        client = await self._connected(
            time.monotonic() + self.config.connect_budget + CLOSE_TIMEOUT
        )
        return await self._list(client, time.monotonic() + self.config.connect_timeout)

    async def _list(self, client: Client, deadline: float) -> list[McpTool]:
        """The listing of ``client``'s server, bounded in count (``max_tools``, each page cut
        as it comes) and, by the transport, in bytes per message; its definitions noted."""
        tools: list[McpTool] = []
        cursor: str | None = None
        limit = self.config.max_tools
        for _ in range(MAX_TOOL_PAGES):
            try:
                with _fail_at(deadline):
                    page = await client.list_tools(cursor=cursor)
            except Exception as exc:
                self._raise_if_too_large(client, exc)
                raise
            tools.extend(page.tools[: limit + 1 - len(tools)])
            if len(tools) > limit:
                raise McpError(
                    f"MCP server {self.name!r} lists more than {limit} tools (max_tools); "
                    "raise max_tools if that many are meant"
                )
            cursor = page.next_cursor
            if not cursor:
                break
        self.definitions = {
            tool.name: definition_hash(tool.name, tool.description, tool.input_schema)
            for tool in tools
        }
        self._listed = client
        return tools

    async def _check_pin(self, client: Client, tool: str, deadline: float) -> None:
        """Raise ``McpError`` when ``tool``'s definition, as the server lists it in this
        session, is not the one approved. Each new session is listed again first: a server
        that was restarted, updated or reconnected to is checked. (Within one session the
        model only ever reads the definitions listed when the agent was built.)"""
        if self.pins is None:
            return
        if self._listed is not client:
            await self._list(client, deadline)
        digest = self.definitions.get(tool)
        if digest is None:
            raise McpError(f"MCP server {self.name!r} no longer lists tool {tool!r}")
        if self.pins.changed(self.name, {tool: digest}):
            logger.warning("MCP server %r changed tool %r: calls refused", self.name, tool)
            raise McpError(refusal(self.name, tool))

    async def call(self, tool: str, arguments: dict[str, Any], timeout: float) -> Any:
        """Call ``tool`` with ``arguments`` within ``timeout`` seconds (connecting, or starting
        the server again, included): the result as JSON data, or ``McpError`` /
        ``TimeoutError``."""
        from mcp import MCPError
        from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        deadline = time.monotonic() + timeout
        client = await self._connected(deadline)
        await self._check_pin(client, tool, deadline)
        remaining = max(deadline - time.monotonic(), 0.001)
        try:
            # The SDK's own read timeout, and one around it: the SDK's covers the request it
            # tracks, ours whatever else may wait (a transport that stopped delivering).
            with _fail_at(deadline + 0.5):
                result = await client.call_tool(tool, arguments, read_timeout_seconds=remaining)
        except (asyncio.CancelledError, TimeoutError):
            self._check_soon(client)  # timed out or cancelled mid-call: is the server alive?
            raise
        except MCPError as exc:
            self._raise_if_too_large(client, exc)
            if exc.code == REQUEST_TIMEOUT:
                self._check_soon(client)
                raise TimeoutError(f"MCP server {self.name!r} did not answer in time") from None
            if exc.code == CONNECTION_CLOSED:
                self._lost(client, exc)
                raise McpError(
                    f"MCP server {self.name!r} closed the connection during the call (did it "
                    f"exit?); it is {self._again} on the next call"
                ) from None
            raise McpError(
                f"MCP server {self.name!r} refused the call: {bounded(exc.message)} "
                f"(error {exc.code})"
            ) from None
        except Exception as exc:  # transport failures, exception groups from task groups
            self._raise_if_too_large(client, exc)
            self._lost(client, exc)
            raise McpError(
                f"MCP server {self.name!r} failed during the call: {describe(exc)}; "
                f"it is {self._again} on the next call"
            ) from None
        return bounded_result(tool_result(result), self.config.max_result_bytes, self.name)

    async def aclose(self) -> None:
        """Stop the supervisor (which closes the session and stops the server) and forget
        the session; the next call connects again."""
        task, stop, probe = self._task, self._stop, self._probe
        self._client = self._ready = self._stop = self._task = self._probe = None
        self._lock = None
        if probe is not None:
            probe.cancel()
        if stop is not None:
            stop.set()
        if task is not None and not task.done():
            done, _ = await asyncio.wait({task}, timeout=CLOSE_TIMEOUT)
            if not done:
                task.cancel()
                await asyncio.wait({task}, timeout=1.0)

    # -- the session's life -------------------------------------------------------------------

    @property
    def _again(self) -> str:
        return "started again" if self.config.command is not None else "connected to again"

    async def _connected(self, deadline: float) -> Client:
        """The open session: the current one (once a check of it in flight has passed), or a
        new one (after the backoff, if the last attempts failed)."""
        probe = self._probe
        if probe is not None and not probe.done():
            try:
                with _fail_at(deadline):
                    await asyncio.shield(probe)
            except TimeoutError:
                raise TimeoutError(
                    f"MCP server {self.name!r} was being checked when the call's time ran out"
                ) from None
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            client = self._client
            if client is not None:
                return client
            ready = self._ready
            if ready is None:
                wait = self._retry_at - time.monotonic()
                if wait > 0:
                    if time.monotonic() + wait >= deadline:
                        raise McpError(
                            f"MCP server {self.name!r} is unavailable ({self.last_error}); "
                            f"the next attempt to connect is in {wait:.1f} s"
                        )
                    await asyncio.sleep(wait)
                ready = self._start()
        # Outside the lock: calls that wait for the same connection wait together, and a call
        # whose time runs out leaves the connection to the next one.
        try:
            with _fail_at(deadline):
                return await asyncio.shield(ready)
        except TimeoutError:
            raise TimeoutError(
                f"MCP server {self.name!r} was still connecting when the call's time ran out"
            ) from None

    def check_current(self) -> None:
        """Check the current session at once (a call on it was cancelled from outside)."""
        if self._client is not None:
            self._check_soon(self._client)

    def _check_soon(self, client: Client) -> None:
        """Check at once whether the server behind ``client`` still answers (a call of it
        timed out or was cancelled): a request that must come back within ``PROBE_TIMEOUT``;
        when it does not, the session is stopped (and the server with it), so that the next
        call starts afresh instead of waiting on a hung server."""
        if self._client is client and (self._probe is None or self._probe.done()):
            self._probe = asyncio.get_running_loop().create_task(self._check(client))

    async def _check(self, client: Client) -> None:
        try:
            with _fail_at(time.monotonic() + PROBE_TIMEOUT):
                await client.list_tools()  # ``ping`` is gone from the 2026 protocol
        except Exception as exc:
            if self._client is client:
                logger.warning("MCP server %r does not answer; stopping it", self.name)
                self._lost(client, exc)

    def _start(self) -> asyncio.Future[Client]:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[Client] = loop.create_future()
        ready.add_done_callback(_retrieve)
        stop = asyncio.Event()
        self._ready, self._stop = ready, stop
        self._task = loop.create_task(self._supervise(ready, stop), name=f"mcp-{self.name}")
        return ready

    async def _supervise(self, ready: asyncio.Future[Client], stop: asyncio.Event) -> None:
        """Open the session, hand it out, wait for ``stop``, close it: one task from open to
        close, as the SDK's cancel scopes require."""
        import anyio

        try:
            # An ``oauth:`` server may send the user to sign in: that time is on top.
            connect_by = anyio.current_time() + self.config.connect_budget
            with anyio.CancelScope(deadline=connect_by) as scope:
                async with self._client_context() as client:
                    scope.deadline = math.inf  # connected: from now on only ``stop`` ends it
                    self._connected_ok(ready, client)
                    await stop.wait()
            if scope.cancelled_caught and not ready.done():
                self._connect_failed(
                    ready,
                    f"no answer within connect_timeout ({self.config.connect_timeout:g} s"
                    + (" and oauth.sign_in_timeout)" if self.config.oauth else ")"),
                )
        except Exception as exc:
            if not ready.done():
                self._connect_failed(ready, describe(exc))
            else:
                self.last_error = describe(exc)
                logger.warning("MCP server %r: session ended: %s", self.name, self.last_error)
        finally:
            if not ready.done():
                self._connect_failed(ready, "closed before it connected")
            if self._ready is ready:  # still the current session: forget it
                self._client = self._ready = None

    def _connected_ok(self, ready: asyncio.Future[Client], client: Client) -> None:
        self._client = client
        self._failures = 0
        self._retry_at = 0.0
        self.starts += 1
        ready.set_result(client)

    def _connect_failed(self, ready: asyncio.Future[Client], problem: str) -> None:
        self._failures += 1
        delay = min(BACKOFF_START * 2 ** (self._failures - 1), BACKOFF_MAX)
        self._retry_at = time.monotonic() + delay
        self.last_error = problem
        ready.set_exception(McpError(f"cannot connect to MCP server {self.name!r}: {problem}"))

    def _raise_if_too_large(self, client: Client, exc: BaseException) -> None:
        """When ``exc`` came of a message past the bound (the transport stopped reading),
        stop the session and raise ``McpError`` saying so; else return."""
        noted = self._noted
        problem = noted.problem if noted is not None else None
        if problem is None and noted is not None and SDK_SSE_TOO_LARGE in describe(exc):
            noted.too_large("an event")
            problem = noted.problem
        if problem is None:
            return
        self._lost(client, exc)
        raise McpError(
            f"MCP server {self.name!r} is unusable: {problem}; it is {self._again} on the next call"
        ) from None

    def _lost(self, client: Client, exc: BaseException) -> None:
        """The session to ``client`` is unusable: stop its supervisor (the server is stopped
        with it) so that the next call starts afresh."""
        self.last_error = describe(exc)
        if self._client is client:
            if self._stop is not None:
                self._stop.set()
            self._client = self._ready = self._stop = None

    def _client_context(self) -> AbstractAsyncContextManager[Client]:
        from mcp import Client

        from hermes_agent.tools.mcp._transport import (
            ReadProblem,
            bounded_http_client,
            bounded_stdio_client,
        )

        config = self.config
        # Every message is bounded while it is read (``_transport``): a server cannot make
        # the agent read, hold and parse more than that before max_tools or
        # max_result_bytes could be applied.
        noted = self._noted = ReadProblem(config.max_result_bytes)
        if config.command is not None:
            from mcp import StdioServerParameters

            parameters = StdioServerParameters(
                command=config.command, args=config.args, env=config.env or None, cwd=config.cwd
            )
            transport: Any = bounded_stdio_client(parameters, _errlog(), noted)
        else:
            from mcp.client.streamable_http import streamable_http_client

            auth = None
            if config.oauth is not None:
                from hermes_agent.tools.mcp._oauth_flow import oauth_provider

                assert self.sign_in is not None
                auth = oauth_provider(self.name, str(config.url), config.oauth, self.sign_in)
            http = bounded_http_client(config.headers, config.timeout, noted, auth)
            session = streamable_http_client(
                str(config.url), http_client=http, max_sse_event_size=noted.limit
            )
            transport = _closing(session, http)
        approver, server = self.approver, self.name

        async def elicit(
            context: ClientRequestContext, params: ElicitRequestParams
        ) -> ElicitResult:
            assert approver is not None
            return await answer_elicitation(server, approver, params)

        return Client(
            transport,
            read_timeout_seconds=config.timeout,
            cache=None,
            elicitation_callback=elicit if approver is not None else None,
        )


class McpToolsets:
    """The MCP servers of one agent, their tools, and the loop their sessions live on.

    ``close`` stops every server (they start again on the next call); it runs at interpreter
    exit too, for toolsets still open then.
    """

    def __init__(
        self,
        configs: Mapping[str, McpServerConfig],
        pins: PinStore | None = None,
        approver: Approver | None = None,
        sign_in: OAuthSignIn | None = None,
    ) -> None:
        self.connections = {
            name: McpConnection(name, config, pins, approver, sign_in)
            for name, config in configs.items()
        }
        self.pins = pins
        self.refused: dict[str, list[str]] = {}
        """Per server, the tools left out because their definition changed since approved."""
        self.unusable: dict[str, dict[str, str]] = {}
        """Per server, the tools left out because their definition cannot be used, and why
        (a schema refused, a name no tool may have)."""
        self.tools: list[Tool] = []
        self.info: dict[str, McpToolInfo] = {}
        self._loop = LoopThread()
        _open_toolsets.add(self)

    def run(self, coroutine: Any, timeout: float) -> Any:
        """Run ``coroutine`` on the sessions' loop and wait for it (from sync code)."""
        future = self._loop.submit(coroutine)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    async def call(self, server: str, tool: str, arguments: dict[str, Any], timeout: float) -> Any:
        """Call ``tool`` of ``server`` from any event loop (or thread with a loop)."""
        connection = self.connections[server]
        future = self._loop.submit(connection.call(tool, arguments, timeout))
        # Cancelling the wrapper (a run's timeout or cancellation) cancels the call there.
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            # The cancelled call reaches its own check of the server only after the SDK's
            # cleanup, some loop turns later; a next call handed over meanwhile would take
            # the suspect session. Scheduled now, the check starts before any later call.
            self._loop.loop.call_soon_threadsafe(connection.check_current)
            raise

    def close(self) -> None:
        """Stop every server and the loop (both start again on the next call)."""
        if self._loop.in_loop():
            raise HermesAgentError("McpToolsets.close cannot run on its own loop")
        if not self._loop.running:
            return  # nothing was started since the last close
        connections = list(self.connections.values())

        async def close_all() -> None:
            await asyncio.gather(*(c.aclose() for c in connections), return_exceptions=True)

        try:
            self.run(close_all(), CLOSE_TIMEOUT + 5)
        except Exception as exc:  # closing must not fail the caller's own shutdown
            logger.warning("closing the MCP servers failed: %s", describe(exc))
        self._loop.stop()

    def load(self, *, source: str = "<config>") -> list[Tool]:
        """Connect to every server (at once) and build its tools; ``ConfigError`` naming the
        server when one cannot be reached. A tool that cannot be used is left out, with a
        warning (``.unusable``); the server's other tools are kept."""
        names = list(self.connections)

        async def list_all() -> list[list[McpTool] | BaseException]:
            found = await asyncio.gather(
                *(self.connections[name].list_tools() for name in names), return_exceptions=True
            )
            return list(found)

        longest = max((c.config.connect_budget for c in self.connections.values()), default=0)
        listings = self.run(list_all(), longest + CLOSE_TIMEOUT)
        tools: list[Tool] = []
        for name, listing in zip(names, listings, strict=True):
            if isinstance(listing, BaseException):
                raise ConfigError(
                    f"{source}: mcp_servers.{name}: {describe(listing)}; check the command or "
                    "url (the server's own messages are on standard error)"
                )
            tools.extend(self._tools_of(name, listing, source))
        self.tools = tools
        return tools

    def _tools_of(self, server: str, listing: Sequence[McpTool], source: str) -> list[Tool]:
        config = self.connections[server].config
        where = f"{source}: mcp_servers.{server}"
        offered = {tool.name for tool in listing}
        unknown = sorted(set(config.tools or ()) - offered)
        if unknown:
            raise ConfigError(
                f"{where}.tools: the server has no tool {', '.join(unknown)} "
                f"(it offers: {', '.join(sorted(offered)) or 'none'})"
            )
        wanted = [
            remote
            for remote in listing
            if (config.tools is None or remote.name in config.tools)
            and remote.name not in config.exclude_tools
        ]
        changed: set[str] = set()
        if self.pins is not None:
            definitions = self.connections[server].definitions
            changed = set(self.pins.changed(server, {r.name: definitions[r.name] for r in wanted}))
            if changed:
                self.refused[server] = sorted(changed)
                logger.warning(
                    "%s: tools %s changed since they were approved and are left out; review "
                    "them and run `hermes-agent mcp approve-tools %s`",
                    where,
                    ", ".join(sorted(changed)),
                    server,
                )
        tools = []
        for remote in wanted:
            if remote.name in changed:
                continue
            name = config.tool_prefix + remote.name
            holder: list[Tool] = []
            try:
                schema, notes = normalise(remote.input_schema, strict=config.strict_schemas)
                made = Tool(
                    name=name,
                    description=remote.description or remote.title or "",
                    parameters=schema,
                    function=self._caller(server, remote.name, holder),
                    toolset=config.toolset or server,
                    timeout=config.timeout,
                    requires_approval=config.requires_approval,
                    outside_schema=True,  # the server's schema: RE2 patterns, a step budget
                )
            except (ToolDefinitionError, ValueError) as exc:
                # One bad definition costs that tool, not the server (as a changed one does).
                self.unusable.setdefault(server, {})[remote.name] = str(exc)
                logger.warning(
                    "%s: tool %r cannot be used and is left out: %s; silence this with "
                    "exclude_tools: [%s]",
                    where,
                    remote.name,
                    exc,
                    remote.name,
                )
                continue
            holder.append(made)
            tools.append(made)
            if notes:
                logger.debug("MCP tool %r of %r: %s", remote.name, server, "; ".join(notes))
            self.info[name] = McpToolInfo(
                server, remote.name, tuple(notes), dict(remote.input_schema or {})
            )
        return tools

    def _caller(self, server: str, remote_name: str, made: list[Tool]) -> Any:
        """The tool's function: hand the call to the server's session, within the tool's
        timeout as it is now (a ``tools:`` setting may have changed it)."""
        toolsets = self
        default = self.connections[server].config.timeout

        async def call_mcp_tool(**arguments: Any) -> Any:
            timeout = made[0].timeout if made and made[0].timeout is not None else default
            # The executor's deadline ends the call (a 408 the model reads as a timeout); the
            # session's own, a little later, only backs it up. Were both the same, the
            # session's could fire first, and its TimeoutError would read as the tool's own
            # failure (500).
            return await toolsets.call(server, remote_name, arguments, timeout + DEADLINE_BACKUP)

        call_mcp_tool.__name__ = f"mcp_{server}_{remote_name}".replace("-", "_").replace(".", "_")
        return call_mcp_tool


def open_mcp_toolsets(
    configs: Mapping[str, McpServerConfig],
    *,
    source: str = "<config>",
    pins: PinStore | None = None,
    approver: Approver | None = None,
    sign_in: OAuthSignIn | None = None,
) -> McpToolsets:
    """Start (or connect to) the servers of ``configs`` and list their tools (in
    ``.tools``). The caller adds the tools to its agent and calls ``close`` when done.

    With ``pins``, each tool's definition is pinned when first seen, and a tool whose
    definition changed since is left out (``.refused``) and its calls refused (``pins``).
    A tool whose definition cannot be used (its schema refused: ``schemas``) is left out too,
    with a warning that says why (``.unusable``); the server's other tools are kept.

    With ``approver`` (an agent's ``Approver``), the client declares elicitation and a
    server's request for input is put to it as an approval (``answer_elicitation``);
    without one the server cannot ask.

    ``sign_in`` serves the servers configured with ``oauth:`` (``oauth.OAuthSignIn``): where
    their tokens are kept (default: in memory) and how the user is sent to sign in (default:
    the browser).

    Raises ``MissingDependencyError`` without the ``mcp`` extra, ``ConfigError`` when a server
    cannot be reached within its ``connect_timeout``.
    """
    for name in configs:
        if not _SERVER_NAME.match(name):
            raise ConfigError(
                f"{source}: mcp_servers.{name}: a server name is letters, digits, '_', '.' and "
                "'-' (at most 64 characters)"
            )
    require_sdk()
    toolsets = McpToolsets(configs, pins, approver, sign_in)
    try:
        toolsets.load(source=source)
    except BaseException:
        toolsets.close()
        raise
    return toolsets


# -- helpers ---------------------------------------------------------------------------------


def _fail_at(deadline: float) -> Any:
    """A cancel scope that raises ``TimeoutError`` when ``time.monotonic()`` passes
    ``deadline`` (anyio's, as the SDK's own code uses)."""
    import anyio

    return anyio.fail_after(max(deadline - time.monotonic(), 0.0))


def _errlog() -> TextIO:
    """Where a stdio server's standard error goes: ours, or the process's own when ours is not
    a real file (a test runner capturing it)."""
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return sys.__stderr__ or sys.stderr
    return sys.stderr


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a connection's failure as seen, so asyncio does not log it as never retrieved."""
    if not future.cancelled():
        future.exception()


class _closing:
    """A transport context that also closes the HTTP client it was given."""

    def __init__(self, transport: AbstractAsyncContextManager[Any], http: Any) -> None:
        self._transport, self._http = transport, http

    async def __aenter__(self) -> Any:
        return await self._transport.__aenter__()

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        try:
            return await self._transport.__aexit__(*exc_info)
        finally:
            await self._http.aclose()


_open_toolsets: weakref.WeakSet[McpToolsets] = weakref.WeakSet()
_exit_lock = threading.Lock()


@atexit.register
def _close_at_exit() -> None:
    """Stop the servers of toolsets nobody closed (their child processes would outlive us)."""
    with _exit_lock:
        for toolsets in list(_open_toolsets):
            toolsets.close()
