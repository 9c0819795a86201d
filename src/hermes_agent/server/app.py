"""``create_app``: the agent as an HTTP, SSE and WebSocket service (FastAPI).

    from hermes_agent.server import ServiceSettings, create_app

    app = create_app("config.yaml", tools_files=["tools.py"], settings=ServiceSettings(port=8000))
    # uvicorn.run(app, host="127.0.0.1", port=8000)

The agent is built through ``hermes_agent.loading.build_agent`` (or given as ``agent=``) and
served through one fork of it whose approver asks the run's owner over the API. Endpoints:
``POST /v1/runs`` (JSON, 202 with pending approvals, or SSE), ``GET /v1/runs``,
``GET /v1/runs/{id}``, ``GET /v1/runs/{id}/events`` (``Last-Event-ID``),
``POST /v1/runs/{id}/cancel``, ``POST /v1/approvals/{id}``, ``GET|DELETE /v1/sessions[/{id}]``,
``GET /v1/runs/{id}/trace[.jsonl]``, ``/v1/ws``, ``/healthz``, ``/readyz``, ``/metrics``.

With ``execution: queue`` the runs go to the Celery workers of the config's ``queue:`` section
instead, and are read back from the store they share (``server.queued``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.responses import Response

from hermes_agent.agent import Agent
from hermes_agent.config import HermesConfig, load_config
from hermes_agent.errors import ConfigError, HermesAgentError
from hermes_agent.loading import build_agent, load_tools_file, on_owned_loops
from hermes_agent.runs.backend import ApprovalConflict, RunBackend, RunNotFound
from hermes_agent.runs.gate import RunRejected
from hermes_agent.runs.keys import KeyStore
from hermes_agent.runs.principal import LOCAL_USER, Principal
from hermes_agent.runs.principal import is_loopback as is_loopback
from hermes_agent.runs.settings import ServiceSettings, service_settings
from hermes_agent.runs.trail import StoreProbe
from hermes_agent.server import (
    routes_channels,
    routes_console,
    routes_data,
    routes_openai,
    routes_replay,
    routes_responses,
    routes_runs,
    stream_tokens,
    ws,
)
from hermes_agent.server.auth import LiveCheck
from hermes_agent.server.middleware import (
    BrowserGuard,
    LanguageMiddleware,
    ServiceMiddleware,
    not_json_body,
)
from hermes_agent.server.sse import OpenStreams

logger = logging.getLogger("hermes_agent.server")


def create_app(
    config: str | os.PathLike[str] | HermesConfig | None = None,
    *,
    agent: Agent | None = None,
    tools_files: Sequence[str | os.PathLike[str]] = (),
    settings: ServiceSettings | None = None,
    keys: KeyStore | None = None,
    warmup: bool = False,
) -> FastAPI:
    """The service app for the agent ``config`` describes (or ``agent``, which the app then
    uses but does not close). Keys, quotas and the engine are built by
    ``backends.build_backend``: API keys are kept in ``keys`` when given, else at
    ``ServiceSettings.keys_url``, else in the config's storage, else in the agent's own SQL
    database (where ``hermes-agent keys create`` puts them), else in memory, with a warning;
    the app closes them at shutdown. ``warmup=True`` (what ``hermes-agent serve`` does) runs
    ``Agent.warmup`` in the background at start-up; ``/readyz`` is 503 until it is done.
    Raises ``ConfigError`` for a bad config, tools file, ``auth: none`` on a host that is not
    loopback, or ``execution: queue`` without a ``queue:`` section and a SQL store."""
    # Inside the function: the composition root sits above this package, whose __init__
    # re-exports create_app (backends -> server.auth -> server/__init__ -> this module).
    from hermes_agent.backends import build_backend, check_backend

    hermes_config = (
        config if isinstance(config, HermesConfig) or config is None else load_config(config)
    )
    settings = settings or service_settings(hermes_config)  # the config's service: section
    if settings.auth == "none" and not is_loopback(settings.host):
        raise ConfigError(
            f"auth: none would let anyone who reaches {settings.host} run the agent; "
            "use auth: keys, or bind to 127.0.0.1"
        )
    # Before the agent is built: a config no backend can serve does not load a model first.
    check_backend(settings, hermes_config, agent.storage if agent is not None else None)
    owns_agent = agent is None
    if agent is None:
        # The service owns its loop and closes its models' connections at shutdown.
        owned = on_owned_loops(hermes_config) if hermes_config is not None else None
        base = build_agent(owned, tools_files=tools_files)
    else:
        base = agent
        for item in (tool for path in tools_files for tool in load_tools_file(path)):
            base.add_tool(item, replace=True)

    # Keys, quotas and the engine come from the one composition root (``backends``): one
    # fork of the agent serves every run; the keys are kept where the agent's storage is.
    try:
        composed = build_backend(base, settings, config=hermes_config, keys=keys)
    except BaseException:
        if owns_agent:
            base.close()
        raise
    served, keys = composed.agent, composed.keys
    assert served.storage is not None and keys is not None
    warm = WarmState(needed=warmup)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        warming = asyncio.create_task(warm.run(served)) if warmup else None
        if settings.auth == "none":
            logger.warning(
                "auth: none — every request is the user 'local'; use only on a trusted machine"
            )
        await asyncio.to_thread(composed.recover)  # in process: runs an earlier life left open
        try:
            yield
        finally:
            if warming is not None:
                warming.cancel()  # a load still going on is left to its thread
            # The models' connections were opened on this loop, which ends with the service
            # (a user's own agent included: they are of no use past it).
            await composed.shutdown(settings.shutdown_grace_s)
            if owns_agent:
                base.close()

    app = FastAPI(title="Hermes Agent", version="1", lifespan=lifespan)
    app.state.settings = settings
    app.state.backends = composed  # the composition, for the CLI's drain and for tests
    app.state.manager = composed.manager
    app.state.quotas = composed.manager.quotas
    app.state.metrics = composed.metrics
    app.state.storage = served.storage
    app.state.store_probe = StoreProbe(served.storage)  # /readyz: can the store be written?
    app.state.warm = warm  # /readyz: is the model loaded and its system prompt evaluated?
    app.state.keys = keys
    app.state.agent = served
    # The one seam the front doors run through, whichever engine runs the runs.
    backend: RunBackend = composed.backend
    app.state.backend = backend
    mcp_door = _mcp_door(settings, served, backend, keys) if settings.mcp is not None else None
    if mcp_door is not None:  # innermost: the service's own middleware guards it too
        app.add_middleware(McpDoorway, door=mcp_door, path=settings.mcp.path)  # type: ignore[union-attr]
    # Open connections check their key again (revocation), and count per user.
    app.state.stream_tokens = stream_tokens.stream_tokens_for(keys)
    app.state.live = LiveCheck(keys, app.state.stream_tokens, settings.key_check_s)
    app.state.streams = OpenStreams(settings.max_streams_per_user)
    # Inside the service middleware, so that its refusals are logged and carry the headers.
    app.add_middleware(
        BrowserGuard,
        auth=settings.auth,
        host=settings.host,
        allowed_hosts=settings.allowed_hosts,
        allowed_origins=settings.allowed_origins,
    )
    app.add_middleware(ServiceMiddleware, max_body_bytes=settings.max_body_bytes)
    # Outermost: every error's detail, the other middleware's refusals included, in the
    # caller's language (Accept-Language), else the served agent's.
    app.add_middleware(LanguageMiddleware, language=served.language)
    app.add_exception_handler(RunRejected, _rejected)
    app.add_exception_handler(RunNotFound, _not_found)
    app.add_exception_handler(ApprovalConflict, _conflict)
    app.add_exception_handler(HermesAgentError, _refused)
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.include_router(routes_runs.router)
    app.include_router(stream_tokens.router)
    app.include_router(routes_data.router)
    app.include_router(ws.router)
    app.include_router(routes_openai.router)
    app.include_router(routes_responses.router)
    app.include_router(routes_replay.router)
    app.include_router(routes_console.router)  # the web console, at /console/
    app.include_router(routes_channels.router_for(settings, served, keys, hermes_config))
    for door in _optional_doors():
        app.include_router(door)
    app.include_router(routes_openai.fallback)  # last: any other /v1/... path
    return app


def _optional_doors() -> list[Any]:
    """The routers of the doors whose protocol package is installed (extras ``agui``, ``a2a``)."""
    doors: list[Any] = []
    try:
        from hermes_agent.server import routes_agui
    except ImportError:  # pip install 'hermes-agent-core[agui]'
        logger.debug("AG-UI door off: ag-ui-protocol is not installed")
    else:
        doors.append(routes_agui.router)
    try:
        from hermes_agent.server import routes_a2a
    except ImportError:  # pip install 'hermes-agent-core[a2a]'
        logger.debug("A2A door off: a2a-sdk[http-server] is not installed")
    else:
        doors.append(routes_a2a.router)
    return doors


class WarmState:
    """Whether the served agent is warm (``Agent.warmup``): ``done`` at once when no warm-up
    was asked for; ``error`` says why a warm-up failed (the model could not be loaded)."""

    def __init__(self, *, needed: bool) -> None:
        self.done = not needed
        self.error: str | None = None
        self.seconds: float | None = None

    async def run(self, agent: Agent) -> None:
        try:
            self.seconds = await asyncio.to_thread(agent.warmup)
            logger.info(
                "warm: the model is loaded and the system prompt evaluated (%.1f s)", self.seconds
            )
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            logger.exception("warm-up failed: the model cannot answer")
        finally:
            self.done = True


def _mcp_door(settings: ServiceSettings, served: Agent, backend: RunBackend, keys: KeyStore) -> Any:
    """The MCP server of ``service.mcp``: the service's agent, engine (``backend``) and keys
    (under ``auth: none``, the service's local user); its Starlette app."""
    from hermes_agent.mcp.server import AgentMcpServer
    from hermes_agent.tools.mcp.client import require_sdk

    door = settings.mcp
    assert door is not None
    try:
        require_sdk()
        server = AgentMcpServer(
            served,
            ask=door.ask,
            toolsets=door.toolsets,
            approve=door.approve,
            keys=keys if settings.auth == "keys" else None,
            local_user=Principal(LOCAL_USER),
            backend=backend,
        )
    except (ImportError, ValueError, HermesAgentError) as exc:
        raise ConfigError(f"service.mcp: {exc}") from None
    return server.http_app(
        host=settings.host,
        path=door.path,
        max_sessions_per_user=door.max_sessions_per_user,
        session_idle_timeout_s=door.session_idle_timeout_s,
    )


class McpDoorway:
    """ASGI: requests for ``path`` go to the MCP server's app, the rest to the service; the
    MCP app's lifespan (its session manager) runs inside the service's."""

    def __init__(self, app: Any, door: Any, path: str) -> None:
        self.app = app
        self.door = door
        self.path = path.rstrip("/") or "/"

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            async with self.door.router.lifespan_context(self.door):
                await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if scope["type"] == "http" and (path == self.path or path == self.path + "/"):
            await self.door(scope, receive, send)
            return
        await self.app(scope, receive, send)


async def _rejected(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, RunRejected)
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after else None
    return JSONResponse({"detail": exc.message}, exc.status_code, headers=headers)


async def _not_found(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, RunNotFound)
    return JSONResponse({"detail": exc.message}, 404)


async def _conflict(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApprovalConflict)
    return JSONResponse({"detail": exc.message}, 409)


async def _invalid_request(request: Request, exc: Exception) -> Response:
    """A body that is not JSON is 400 with one ``detail`` line, as everywhere in the API
    (the OpenAI facade answers in its own shape); one that does not match its schema stays
    FastAPI's 422 with the list of issues."""
    assert isinstance(exc, RequestValidationError)
    if (refused := not_json_body(request, exc.errors())) is not None:
        return refused  # 415: a JSON body sent without saying it is JSON
    if any(issue.get("type") == "json_invalid" for issue in exc.errors()):
        return JSONResponse({"detail": "the request body is not valid JSON"}, 400)
    return await request_validation_exception_handler(request, exc)


async def _refused(_: Request, exc: Exception) -> Response:
    return JSONResponse({"detail": str(exc)}, 422)
