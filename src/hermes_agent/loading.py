"""Build an agent from a config file and Python tools files: the one way to do it.

    from hermes_agent import build_agent

    agent = build_agent("config.yaml", tools_files=["my_tools.py"])
    print(agent.run("What is 17 * 23?").output)

The command line, a service and a worker all build their agents here. Every problem with the
config or a tools file is a ``ConfigError`` whose message names the file and the fix; nothing
here prints or exits.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Unpack

from hermes_agent.agent import Agent, add_config_wiring
from hermes_agent.config import HermesConfig, load_config
from hermes_agent.errors import ConfigError, ToolDefinitionError
from hermes_agent.options import AgentOptions, agent_options
from hermes_agent.pipeline.renderers import BUILTIN_RENDERERS
from hermes_agent.pipeline.tables import TableRenderer
from hermes_agent.tools.registry import Tool
from hermes_agent.types import ToolCall

__all__ = ["ToolsFileError", "build_agent", "load_tools_file"]


class ToolsFileError(ConfigError):
    """A tools file cannot be loaded: ``path`` names it, ``problem`` says what is wrong (for
    an import that raised: where, as ``file:line (in function)``, and the exception);
    ``details`` is the whole traceback when there is one (``--debug`` prints it)."""

    def __init__(
        self, path: str | os.PathLike[str], problem: str, *, details: str | None = None
    ) -> None:
        super().__init__(f"tools file {path}: {problem}")
        self.path = path
        self.problem = problem
        self.details = details


def build_agent(
    config: str | os.PathLike[str] | HermesConfig | None = None,
    *,
    tools_files: Sequence[str | os.PathLike[str]] = (),
    **overrides: Unpack[AgentOptions],
) -> Agent:
    """The agent a config describes, with the tools of ``tools_files`` added.

    ``config`` is a YAML file or an already-validated ``HermesConfig``; ``None`` gives
    ``Agent()``'s defaults (the embedded model, loaded on first use). Keyword arguments override
    what the config says, as in ``Agent.from_settings`` (``storage="sqlite:///..."``,
    ``model=...``, ``tools=[...]``). A tool from a tools file replaces a tool of the same name.
    Storage is opened only where the config's ``storage:`` section or ``storage=`` says. The
    config's ``mcp_servers`` are started (or connected to) and their tools added; the agent's
    ``close`` stops them (docs/mcp.md).

    Raises ``ConfigError`` for an invalid config or tools file (``ToolsFileError`` for the
    latter), before any storage is opened; and when an MCP server cannot be reached
    (``MissingDependencyError`` without the ``mcp`` extra).
    """
    settings = config if isinstance(config, HermesConfig) or config is None else load_config(config)
    # Tools files run user code that may fail; load them before the agent opens its storage.
    loaded = [tool for path in tools_files for tool in load_tools_file(path)]
    if settings is not None and settings.mcp_servers:
        # Their header and environment secrets are masked like the model's API key.
        secrets = [s for server in settings.mcp_servers.values() for s in server.secrets()]
        configured = agent_options(settings).get("secrets", ())
        overrides["secrets"] = [*overrides.get("secrets", configured), *secrets]
    agent = Agent(**overrides) if settings is None else Agent.from_settings(settings, **overrides)
    try:
        if settings is not None and settings.mcp_servers:
            _add_mcp_tools(agent, settings)
        for item in loaded:
            agent.add_tool(item, replace=True)
    except BaseException:
        agent.close()
        raise
    return agent


def on_owned_loops(config: HermesConfig) -> HermesConfig:
    """``config`` for a process that owns its event loops and closes what its runs open on
    them before they end (the service, a worker; ``Agent.close_connections``): an endpoint
    model left at ``transport: auto`` sends its requests through aiohttp where it is
    installed (less CPU a request under load); elsewhere ``auto`` is httpx. A copy: the
    config given is left as it is."""
    from hermes_agent.config import OpenAIConfig

    sections = {"model": config.model, "answer_model": config.answer_model}
    automatic = {
        key: section
        for key, section in sections.items()
        if isinstance(section, OpenAIConfig) and section.transport == "auto"
    }
    if not automatic:
        return config
    from hermes_agent.models.openai import aiohttp_available

    if not aiohttp_available():
        return config
    chosen = {
        key: section.model_copy(update={"transport": "aiohttp"})
        for key, section in automatic.items()
    }
    return config.model_copy(update=chosen)


def _wire_tracing(agent: Agent, config: HermesConfig) -> None:
    """The config's ``tracing:`` section: instrument the agent from outside, through its hooks
    (OpenTelemetry is imported only when tracing is on)."""
    if not config.tracing.enabled:
        return
    from hermes_agent.tracing import instrument

    t = config.tracing
    instrument(
        agent,
        capture_content=t.capture_content,
        agent_name=t.agent_name,
        redact_patterns=t.redact_patterns,
    )


def _wire_presentation(agent: Agent, config: HermesConfig) -> None:
    """The config's ``agent.toolsets`` (unless the agent was given its own), its tables
    (``output.table``, for the built-in ``table`` and ``markdown`` formats a config renderer
    has not replaced), in ``agent.language`` (the agent itself writes its messages in it,
    ``Agent(language=...)``, or in a run's ``lang`` variable)."""
    if config.agent.toolsets is not None and agent.toolsets is None:
        agent.toolsets = list(config.agent.toolsets)
    table = config.output.table
    for name, with_answer in (("table", False), ("markdown", True)):
        if agent.renderers.get(name) is BUILTIN_RENDERERS[name]:
            renderer = TableRenderer(
                columns=dict(table.columns),
                max_rows=table.max_rows,
                max_cell_chars=table.max_cell_chars,
                only_mapped=table.only_mapped,
                language=config.agent.language,
                with_answer=with_answer,
            )
            agent.add_renderer(name, renderer)


def _wire_tool_search(agent: Agent, config: HermesConfig) -> None:
    """The config's ``agent.tool_search_*``: many tools are searched for, not all shown."""
    agent.limits.tool_search_threshold = config.agent.tool_search_threshold
    agent.limits.tool_search_top_k = config.agent.tool_search_top_k


# Every agent built from a config — Agent.from_config, Agent.from_settings, build_agent — gets
# the config's tracing, though the agent itself knows nothing of tracing.
add_config_wiring(_wire_presentation)
add_config_wiring(_wire_tool_search)
add_config_wiring(_wire_tracing)


def _add_mcp_tools(agent: Agent, settings: HermesConfig) -> None:
    """Start the config's MCP servers and give the agent their tools; ``agent.close`` stops
    the servers. The SDK is imported only here, when the config names a server."""
    from hermes_agent.tools.mcp.client import open_mcp_toolsets
    from hermes_agent.tools.mcp.oauth import OAuthSignIn, default_oauth_folder
    from hermes_agent.tools.mcp.pins import PinStore, default_pins_path

    pins = PinStore(settings.mcp_pins or default_pins_path(settings.source))
    # OAuth tokens and registrations: .hermes/mcp_oauth/ beside the config file.
    sign_in = OAuthSignIn(default_oauth_folder(settings.source))

    def agents_approver(call: ToolCall, tool: Tool) -> object:
        # A server's request for input goes to the approver the agent has when it comes (the
        # CLI sets its own after loading); with none, it is declined.
        approver = agent.approver
        return False if approver is None else approver(call, tool)

    toolsets = open_mcp_toolsets(
        settings.mcp_servers,
        source=settings.source,
        pins=pins,
        approver=agents_approver,
        sign_in=sign_in,
    )
    agent.on_close(toolsets.close)
    for item in toolsets.tools:
        try:
            agent.add_tool(item)
        except ToolDefinitionError as exc:
            raise ConfigError(
                f"{settings.source}: mcp_servers: {exc}; give the server a tool_prefix"
            ) from None


def load_tools_file(path: str | os.PathLike[str]) -> list[Tool]:
    """The tools a Python file defines: every ``Tool`` at module level (made with
    ``@hermes_agent.tool``), the tools registered on an ``Agent`` at module level (a file
    written as a script: ``agent = Agent()`` and ``@agent.tool``), and the functions or Tools
    listed in a ``TOOLS`` variable. Only the tools of such an agent are taken, not its model,
    prompt or hooks.

    Raises ``ToolsFileError`` (a ``ConfigError``) when the file is missing, fails to import, or
    defines no tool.
    """
    file = Path(path)
    if not file.is_file():
        raise ToolsFileError(path, "no such file")
    # A name unique per file, so two tools files with the same name do not replace each other.
    module_name = f"hermes_user_tools_{abs(hash(file.resolve()))}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise ToolsFileError(path, "cannot import it as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise ToolsFileError(
            path,
            f"importing it failed{_where(exc, file)}: {type(exc).__name__}: {exc}",
            details="".join(traceback.format_exception(exc)),
        ) from exc
    found: dict[str, Tool] = {}
    for value in vars(module).values():
        if isinstance(value, Tool):
            found[value.name] = value
        elif isinstance(value, Agent):
            found.update((made.name, made) for made in value.tools)
    for item in getattr(module, "TOOLS", []):
        try:
            made = item if isinstance(item, Tool) else Tool.from_function(item)
        except ToolDefinitionError as exc:
            raise ToolsFileError(path, f"TOOLS: {exc}") from exc
        found[made.name] = made
    if not found:
        raise ToolsFileError(
            path,
            "no tools found; decorate functions with @hermes_agent.tool (or @agent.tool on "
            "an agent = Agent() in the file) or list them in TOOLS = [...]",
        )
    return list(found.values())


def _where(exc: BaseException, file: Path) -> str:
    """`` at FILE:LINE (in NAME)``: the innermost frame of the traceback inside the tools file
    (where its author can act), else the innermost one; for a syntax error, its own line."""
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno:
        return f" at {exc.filename}:{exc.lineno}"
    frames = traceback.extract_tb(exc.__traceback__)
    target = str(file.resolve())
    own = [f for f in frames if _resolved(f.filename) == target]
    frame = own[-1] if own else (frames[-1] if frames else None)
    if frame is None:
        return ""
    return f" at {frame.filename}:{frame.lineno} (in {frame.name})"


def _resolved(filename: str) -> str:
    try:
        return str(Path(filename).resolve())
    except (OSError, ValueError):
        return filename
