"""The few data types shared by every layer of Hermes Agent.

Internal records are plain dataclasses (cheap to build on the hot path); anything parsed from the
outside world (config files) is pydantic and lives in ``config.py``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import types
from dataclasses import dataclass, field
from typing import Any, Generic, Literal

from typing_extensions import TypeVar

Role = Literal["system", "user", "assistant", "tool"]
ToolChoiceMode = Literal["auto", "required", "none"]
ToolChoice = ToolChoiceMode | str
"""``"auto"`` (text or calls), ``"required"`` (at least one call), ``"none"`` (text only),
or the name of one tool that must be called."""
TOOL_CHOICE_MODES: tuple[ToolChoiceMode, ...] = ("auto", "required", "none")
LoopStatus = Literal[
    "completed",
    "max_iterations",
    "dry_run_complete",
    "client_tool_calls",
    "failed",
    "answered_by_hook",
    "budget_exceeded",
    "timed_out",
]
"""How a run's loop ended."""


def new_call_id() -> str:
    """A short unique id for a tool call, in the style OpenAI-compatible servers use."""
    return "call_" + os.urandom(12).hex()


@dataclass(slots=True)
class ToolCall:
    """One call of one tool, as the model asked for it."""

    name: str
    arguments: dict[str, Any]
    id: str = field(default_factory=new_call_id)
    text_arguments: bool = False
    """The model wrote each argument as untyped text (Qwen3-style XML parameters), so every
    value is a ``str``; the ToolSelector decodes them by the tool's schema before checking."""
    needs_approval: bool = False
    """The approver must approve this call whatever its tool says (a call the model wrote
    inside its thought, under the thought policy ``ask``)."""


@dataclass(slots=True)
class ParseError:
    """A block of model output that could not be turned into a tool call.

    ``block`` is the raw text of the block (what sat between the tags), ``message`` says what was
    wrong in words the model can act on when it is fed back.
    """

    block: str
    message: str


@dataclass(slots=True)
class Completion:
    """A model turn after parsing: free text, tool calls, scratch pad, and what failed to parse."""

    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    scratch_pad: str | None = None
    errors: list[ParseError] = field(default_factory=list)
    thought: str | None = None
    """What a thinking model wrote inside ``<think>...</think>`` (or a server's reasoning
    field); never a source of tool calls."""
    notes: list[str] = field(default_factory=list)
    """What the parser saw and deliberately did not act on (a ``<tool_call>`` inside a
    thought, a thought that never closed), for the trail; not errors, not fed back."""
    thought_calls: list[ToolCall] = field(default_factory=list)
    """The calls a ``<tool_call>`` inside the thought holds: never among ``tool_calls``; the
    model's thought policy (``models.profiles``) says whether they are ignored,
    run, or run once approved."""


@dataclass(slots=True)
class ToolResult:
    """The outcome of one tool call, as fed back to the model inside ``<tool_response>``."""

    call_id: str
    name: str
    content: Any
    status_code: int = 200
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(slots=True)
class Message:
    """One turn of a conversation, protocol-neutral.

    An assistant message may carry ``tool_calls``; a ``tool`` message carries the ``tool_results``
    of one assistant turn (the Hermes protocol sends all results of a turn in one message).
    """

    role: Role
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_results: list[ToolResult] = field(default_factory=list)
    scratch_pad: str | None = None
    raw: str | None = None
    """For an assistant turn that did not parse cleanly: the model's text verbatim. Hermes
    rendering replays it as is, so the model sees exactly what it wrote before the error."""


@dataclass(slots=True)
class Usage:
    """Token counts; ``requests`` counts model calls."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    requests: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def add(self, other: Usage) -> None:
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.requests += other.requests


@dataclass(slots=True)
class ModelResponse:
    """What a model returns from one ``complete`` call.

    ``text`` is the raw completion as the model produced it (for native tool calls, the calls
    rendered as Hermes ``<tool_call>`` text), so that what reached us is always inspectable.
    """

    completion: Completion
    text: str
    usage: Usage = field(default_factory=Usage)
    model_name: str = ""
    finish_reason: str = ""
    """How the model said the turn ended (``stop``, ``length``, ``tool_calls``...); empty when
    the model does not say. A turn that ended on ``length`` was cut at ``max_tokens``."""


@dataclass(slots=True)
class StreamChunk:
    """One piece of a streamed completion: raw Hermes-format text, and usage (and the finish
    reason, when the model gives one) on the last piece."""

    text: str
    usage: Usage | None = None
    finish_reason: str = ""


@dataclass(slots=True)
class ToolCallRecord:
    """A tool call the run made, with its validated arguments and its result."""

    name: str
    arguments: dict[str, object]
    result: object
    status_code: int = 200
    error: str | None = None
    id: str = ""
    metadata: dict[str, object] = field(default_factory=dict)
    """execution_time_ms, cache_hit, truncated, fallback_for, ..."""


@dataclass(slots=True)
class Step:
    """One iteration of the loop: what the model said and what the tools returned."""

    index: int
    completion_text: str
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    parse_errors: list[str] = field(default_factory=list)
    status_code: int = 200
    duration_ms: float = 0.0
    usage: Usage = field(default_factory=Usage)
    tool_choice_enforcement: str | None = None
    """For a turn where a tool call was required: how the model was held to it (see
    ``ModelProfile.tool_choice_enforcement``); the pipeline checks that a call came either way."""
    model: str = ""
    """The name of the model that served this turn (with ``answer_model``, either model)."""
    reason: str | None = None
    """Explain mode: the one-line reason the model gave for this turn, when it gave one."""
    thought: str | None = None
    """A thinking model's thought for this turn (``Completion.thought``)."""
    notes: list[str] = field(default_factory=list)
    """What the parser saw in this turn and did not act on (``Completion.notes``)."""


@dataclass(slots=True)
class RenderedMessage:
    """The answer as rendered for its channel."""

    content: str
    format: str
    metadata: dict[str, object] = field(default_factory=dict)


OutputT = TypeVar("OutputT", covariant=True, default=Any)
"""The type of ``RunResult.data``: the ``output_type`` of the run (``Any`` when none is named)."""


@dataclass(slots=True)
class RunResult(Generic[OutputT]):
    """The answer to one ``Agent.run``: output, status and everything that happened on the way.

    Generic in ``data``'s type: ``agent.run(..., output_type=City)`` is a ``RunResult[City]``."""

    output: str
    status: int
    request_id: str
    session_id: str
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    steps: list[Step] = field(default_factory=list)
    duration_ms: float = 0.0
    error: str | None = None
    loop_status: LoopStatus = "completed"
    """How the loop ended: ``completed`` (the model answered), ``max_iterations``,
    ``dry_run_complete`` (stopped after the ToolSelector; nothing ran),
    ``client_tool_calls`` (ended with calls of the caller's own tools for the caller to run;
    ``pipeline.client_tools``), ``answered_by_hook`` (a hook gave the answer: ``answered_by``),
    ``budget_exceeded`` (``max_run_tokens`` or ``max_run_cost`` spent: status 206,
    ``stopped_by`` names it), ``timed_out`` (``run_timeout_s`` passed: status 504) or
    ``failed``."""
    answered_by: dict[str, str] | None = None
    """When a hook ended the run with its reply: ``{"hook", "point", "reason"}``."""
    stopped_by: str | None = None
    """The bound that stopped the loop before an answer: ``max_iterations``,
    ``max_run_tokens``, ``max_run_cost`` or ``run_timeout_s``; ``None`` otherwise."""
    variables: dict[str, object] = field(default_factory=dict)
    """The run's variables as its hooks left them (``Agent.run(variables=...)``)."""
    approvals: list[dict[str, object]] = field(default_factory=list)
    """Each approval decision: tool, arguments, approved, reason."""
    rendered: RenderedMessage | None = None
    """The answer rendered for its channel."""
    cost: float | None = None
    """In the config's currency, when prices per 1k tokens are set."""
    warnings: list[str] = field(default_factory=list)
    """What went wrong around the run without changing its answer: a turn that could not be
    saved to the session, audit records that could not be written, text that was escaped so
    that the store could hold it. Empty when all went well."""
    data: OutputT | None = None
    """With ``output_type``: the answer, validated — an instance of the pydantic model (a
    ``dict`` for a JSON Schema); ``None`` without one, or when the run ended without an
    answer."""
    output_retries: int = 0
    """With ``output_type``: how many times an answer failed validation and the model was
    asked again (each retry is a step)."""
    usage_by_model: dict[str, Usage] = field(default_factory=dict)
    """``usage`` split by the name of the model that used it (two with ``answer_model``)."""
    cost_by_model: dict[str, float] = field(default_factory=dict)
    """``cost`` split the same way, for the models whose prices are set."""

    def __str__(self) -> str:
        """The answer itself, so that ``print(agent.run(...))`` prints what the agent said;
        ``repr`` stays the full dataclass repr for debugging."""
        return self.output

    def to_dict(self) -> dict[str, object]:
        """A JSON-safe dict (``hermes-agent run --json`` prints this)."""
        data: dict[str, Any] = as_plain(self)
        data["usage"]["total_tokens"] = self.usage.total_tokens
        for name, usage in self.usage_by_model.items():
            data["usage_by_model"][name]["total_tokens"] = usage.total_tokens
        if self.data is not None:
            from pydantic_core import to_jsonable_python

            data["data"] = to_jsonable_python(self.data)
        return data


# -- dataclasses as plain dicts -------------------------------------------------------------

_ATOMIC = frozenset(
    {
        type(None),
        bool,
        int,
        float,
        str,
        complex,
        bytes,
        type(Ellipsis),
        type(NotImplemented),
        types.CodeType,
        types.BuiltinFunctionType,
        types.FunctionType,
        type,
        range,
        property,
    }
)
"""What ``copy.deepcopy`` returns as it is (``copy._deepcopy_atomic``)."""


def as_plain(value: Any) -> Any:
    """``dataclasses.asdict`` of a dataclass instance, and the same copy of anything else:
    dataclasses become dicts of their fields, lists, tuples and dicts are rebuilt around their
    items, and other values are deep copies. Its result is CPython 3.12's ``asdict``'s (3.11's
    raises on a ``defaultdict``, which this rebuilds around its factory); it returns the values
    ``deepcopy`` would return as they are (strings, numbers, ``None``) without calling it, and
    reads a class's field names once, where CPython 3.11's ``asdict`` did neither: a run's
    result and events went through it for every run the service answered."""
    kind: Any = type(value)
    try:
        if kind in _ATOMIC:
            return value
        names = _field_names(kind)
    except TypeError:  # a class its metaclass made unhashable: looked up, not cached
        names = _field_names.__wrapped__(kind)
    if names is not None:
        return {name: as_plain(getattr(value, name)) for name in names}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return kind(*[as_plain(item) for item in value])
    if isinstance(value, (list, tuple)):
        return kind(as_plain(item) for item in value)
    if isinstance(value, dict):
        if hasattr(kind, "default_factory"):  # a defaultdict takes its factory first
            rebuilt = kind(value.default_factory)  # type: ignore[attr-defined]
            for key, item in value.items():
                rebuilt[as_plain(key)] = as_plain(item)
            return rebuilt
        return kind((as_plain(key), as_plain(item)) for key, item in value.items())
    return copy.deepcopy(value)


@functools.lru_cache(maxsize=1024)
def _field_names(kind: Any) -> tuple[str, ...] | None:
    """The field names of a dataclass (``None`` for any other class; a bounded cache, as
    classes may be made at run time)."""
    if not dataclasses.is_dataclass(kind):
        return None
    return tuple(f.name for f in dataclasses.fields(kind))
