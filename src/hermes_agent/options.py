"""The grouped options of ``Agent``: settings a few agents change, each group one frozen object.

The options most agents set stay plain keywords of ``Agent`` (``model``, ``tools``,
``system_prompt``, ``max_iterations``, ``storage``, ...); the rest come in four groups:

    from hermes_agent import Agent, Budget, Memory, Pricing, ScriptedModel, ToolExecution

    agent = Agent(
        ScriptedModel(["Hello."]),
        pricing=Pricing(prompt_per_1k=0.5, completion_per_1k=1.5),
        budget=Budget(max_run_cost=0.10, run_timeout_s=60),
        memory=Memory(history_window=4),
        tool_execution=ToolExecution(default_timeout=10, max_result_chars=20_000),
    )

A config file sets the same values under its own keys (``agent.history_window``,
``model.price_per_1k_prompt``, ...): ``Agent.from_settings`` maps them onto these objects, in
that one place. Each object checks its values when it is made (``HermesAgentError`` naming
the field), and is immutable: give the agent a new one (``dataclasses.replace``) to change it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, TypedDict

from hermes_agent.config import HermesConfig
from hermes_agent.errors import HermesAgentError
from hermes_agent.memory.session import SessionStore
from hermes_agent.models.base import Model
from hermes_agent.pipeline.context import Approver
from hermes_agent.pricing import Prices
from hermes_agent.storage.base import Storage
from hermes_agent.tools.registry import Tool
from hermes_agent.tools.runtime import DEFAULT_MAX_RESULT_CHARS
from hermes_agent.types import ToolChoice

__all__ = [
    "AgentOptions",
    "Budget",
    "Memory",
    "Pricing",
    "ToolExecution",
    "ToolSettings",
    "agent_options",
]


def _check(owner: str, minimum: float, inclusive: bool, **values: float | None) -> None:
    """``HermesAgentError`` for the first of ``values`` (``None``: not set) that is not a
    number above ``minimum`` (or at it, when ``inclusive``)."""
    for name, value in values.items():
        if value is None:
            continue
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or value < minimum or (value == minimum and not inclusive):
            bound = f"at least {minimum}" if inclusive else f"more than {minimum}"
            raise HermesAgentError(f"{owner}.{name} must be a number {bound}, got {value!r}")


@dataclass(frozen=True, slots=True)
class Pricing:
    """What the models cost per 1,000 tokens (in your currency), for ``RunResult.cost`` and
    ``Budget.max_run_cost``. ``prompt_per_1k`` and ``completion_per_1k`` price ``model``;
    ``answer_*`` price ``answer_model``. ``None``: the price the model's ``ModelProfile``
    declares, if any; a run with no price at all has no cost (``None``, never ``0.0``).
    The config's ``price_per_1k_prompt`` and ``price_per_1k_completion`` keys of ``model:``
    and ``answer_model:`` set these."""

    prompt_per_1k: float | None = None
    completion_per_1k: float | None = None
    answer_prompt_per_1k: float | None = None
    answer_completion_per_1k: float | None = None

    def __post_init__(self) -> None:
        _check(
            "Pricing",
            0,
            True,
            prompt_per_1k=self.prompt_per_1k,
            completion_per_1k=self.completion_per_1k,
            answer_prompt_per_1k=self.answer_prompt_per_1k,
            answer_completion_per_1k=self.answer_completion_per_1k,
        )

    @property
    def model(self) -> Prices:
        """The prices of ``model``."""
        return Prices(self.prompt_per_1k, self.completion_per_1k)

    @property
    def answer_model(self) -> Prices:
        """The prices of ``answer_model``."""
        return Prices(self.answer_prompt_per_1k, self.answer_completion_per_1k)


@dataclass(frozen=True, slots=True)
class Budget:
    """What one run may spend (``None``: unbounded): tokens of every model turn, cost at the
    agent's ``Pricing`` (it needs prices), and seconds from its start (then it ends timed out,
    504). A run may set its own (``agent.run(..., max_run_tokens=...)``); see
    ``pipeline.budget``. The config's ``agent:`` section has the same keys."""

    max_run_tokens: int | None = None
    max_run_cost: float | None = None
    run_timeout_s: float | None = None

    def __post_init__(self) -> None:
        _check(
            "Budget",
            0,
            False,
            max_run_tokens=self.max_run_tokens,
            max_run_cost=self.max_run_cost,
            run_timeout_s=self.run_timeout_s,
        )


@dataclass(frozen=True, slots=True)
class Memory:
    """What the prompt carries of a session's earlier turns: the last ``history_window`` turns
    verbatim, and older ones as a summary of at most ``summary_max_chars`` characters (0: no
    summary). ``summarize_with_model``: the model writes the summary (``None``: only a model
    whose profile says it can, ``ModelProfile.can_summarize``); otherwise it is extracted. See
    ``memory.history``. The config's ``agent:`` section has the first two keys."""

    history_window: int = 10
    summary_max_chars: int = 200
    summarize_with_model: bool | None = None

    def __post_init__(self) -> None:
        _check(
            "Memory",
            0,
            True,
            history_window=self.history_window,
            summary_max_chars=self.summary_max_chars,
        )
        if self.summarize_with_model not in (None, True, False):
            raise HermesAgentError(
                f"Memory.summarize_with_model must be true, false or None, "
                f"got {self.summarize_with_model!r}"
            )


@dataclass(frozen=True, slots=True)
class ToolExecution:
    """How tool calls run: ``default_timeout`` seconds for a tool without its own timeout,
    ``max_concurrency`` calls at once, ``max_calls_per_turn`` calls of one model turn (the
    excess is refused, 429), and ``max_result_chars``, the longest result a call keeps
    (characters of its JSON; a tool's own larger ``max_result_chars`` raises it for that
    tool): a longer one is cut, with a note, before it is stored or sent. The config's
    ``agent:`` section has the same keys."""

    default_timeout: float = 30.0
    max_concurrency: int = 8
    max_calls_per_turn: int = 32
    max_result_chars: int = DEFAULT_MAX_RESULT_CHARS

    def __post_init__(self) -> None:
        _check(
            "ToolExecution",
            0,
            False,
            default_timeout=self.default_timeout,
            max_concurrency=self.max_concurrency,
            max_calls_per_turn=self.max_calls_per_turn,
            max_result_chars=self.max_result_chars,
        )


class AgentOptions(TypedDict, total=False):
    """``Agent``'s keyword arguments, ``model`` among them: what ``Agent.from_config``,
    ``Agent.from_settings`` and ``build_agent`` take to override a config (a test holds it to
    ``Agent``'s signature)."""

    model: Model | None
    answer_model: Model | None
    system_prompt: str | None
    preamble: str | None
    tools: Iterable[Tool | Callable[..., object]]
    tool_choice: ToolChoice
    toolsets: Iterable[str] | None
    scratch_pad: bool
    explain: bool
    temperature: float | None
    max_tokens: int | None
    max_iterations: int
    max_retries: int
    storage: Storage | str | None
    session_store: SessionStore | None
    audit: bool
    secrets: Iterable[str]
    redact_patterns: Iterable[str]
    approver: Approver | None
    output_format: str
    channel_formats: Mapping[str, str] | None
    tool_settings: Mapping[str, Mapping[str, object]] | None
    language: str
    pricing: Pricing
    budget: Budget
    memory: Memory
    tool_execution: ToolExecution


class ToolSettings(TypedDict, total=False):
    """A tool's settings beyond its name, toolset and timeout, as ``@agent.tool(...)`` and
    ``agent.register_tool(...)`` take them (``Tool`` says what each does; a test holds these
    to ``tools.registry.SETTINGS``)."""

    execution_mode: Literal["in_process", "subprocess", "inline"]
    memory_limit_mb: int | None
    cpu_time_limit_s: int | None
    cache_ttl: float | None
    max_result_chars: int | None
    requires_approval: bool
    fallback: str | None
    aliases: list[str]
    rate_limit: int | None
    max_concurrent: int | None
    idempotent: bool


def agent_options(config: HermesConfig) -> AgentOptions:
    """The options of ``Agent`` a config sets: the one place where the config's keys become
    ``Agent``'s options (``Agent.from_settings`` and ``build_agent`` build from them). The flat
    keys of its ``agent:`` section and the prices of its model sections are grouped here into
    ``Pricing``, ``Budget``, ``Memory`` and ``ToolExecution``; the models themselves, hooks,
    renderers and MCP servers are built by those callers."""
    a = config.agent
    answering = config.answer_model
    return {
        "system_prompt": a.system_prompt,
        "preamble": config.prompt.preamble,
        "tool_choice": a.tool_choice,
        "scratch_pad": a.scratch_pad,
        "explain": a.explain,
        "temperature": config.model.temperature,
        "max_tokens": config.model.max_tokens,
        "max_iterations": a.max_iterations,
        "max_retries": a.max_retries,
        "language": a.language,
        "output_format": config.output.format,
        "channel_formats": config.output.channel_formats,
        "tool_settings": {name: t.settings() for name, t in config.tools.items()},
        # Stored only where the config's storage section says: a library keeps nothing on
        # disk unless told (the CLI passes its documented default when the section is
        # absent).
        "storage": config.storage.url if config.storage else None,
        "audit": config.audit.enabled,
        "redact_patterns": config.audit.redact_patterns,
        "secrets": [*config.model.secrets(), *(answering.secrets() if answering else [])],
        "pricing": Pricing(
            prompt_per_1k=config.model.price_per_1k_prompt,
            completion_per_1k=config.model.price_per_1k_completion,
            answer_prompt_per_1k=answering.price_per_1k_prompt if answering else None,
            answer_completion_per_1k=answering.price_per_1k_completion if answering else None,
        ),
        "budget": Budget(
            max_run_tokens=a.max_run_tokens,
            max_run_cost=a.max_run_cost,
            run_timeout_s=a.run_timeout_s,
        ),
        "memory": Memory(history_window=a.history_window, summary_max_chars=a.summary_max_chars),
        "tool_execution": ToolExecution(
            default_timeout=a.default_timeout,
            max_concurrency=a.max_concurrency,
            max_calls_per_turn=a.max_calls_per_turn,
            max_result_chars=a.max_result_chars,
        ),
    }
