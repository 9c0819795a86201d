"""The state of one run, handed from stage to stage.

Stages read and write a ``RunContext``; none of them calls another. Everything a caller may want
afterwards (steps, tool calls, usage, status) is collected here and turned into a ``RunResult``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from hermes_agent.audit.recorder import Recorder
from hermes_agent.audit.redaction import Redactor
from hermes_agent.events import Event
from hermes_agent.memory.history import LoadedHistory, SummaryCall
from hermes_agent.models.base import Model, ModelSettings
from hermes_agent.pipeline.budget import RunBudget
from hermes_agent.pipeline.journal import RunJournal
from hermes_agent.pipeline.renderers import RenderedMessage, Renderer
from hermes_agent.pipeline.status import Status
from hermes_agent.pipeline.structured import OutputSpec
from hermes_agent.protocol.prompts import EXPLAIN_PROMPT, json_mode_prompt
from hermes_agent.tools.registry import Tool
from hermes_agent.tools.runtime import ToolRuntime, private_copy
from hermes_agent.types import (
    Completion,
    LoopStatus,
    Message,
    RunResult,
    Step,
    ToolCall,
    ToolCallRecord,
    ToolResult,
    Usage,
)

logger = logging.getLogger("hermes_agent")

EventListener = Callable[[Event], None]
StreamChoice = bool | Callable[[], bool]
"""Whether a run streams its model turns: always, never, or as a callable answers before each
turn (the service streams a run's turns while anyone follows its events)."""
HistorySource = Callable[[], Awaitable[LoadedHistory]]
"""Loads the session's history for the prompt (the InputParser calls it once per run)."""

Approver = Callable[[ToolCall, Tool], object]
"""Decides whether a call of a ``requires_approval`` tool may run: returns (or awaits to) a
bool, or a ``(bool, reason)`` pair."""


@dataclass(slots=True)
class LoopLimits:
    """The bounds of one run."""

    max_iterations: int = 5
    max_retries: int = 2
    """How many turns in a row may bring nothing usable (malformed output, only invalid calls)
    before the run stops with status 502 (403 when the approver refused calls of those
    turns)."""
    default_timeout: float = 30.0
    max_concurrency: int = 8
    max_calls_per_turn: int = 32
    """How many tool calls of one model turn may run; the excess is refused (429) with a
    message the model can act on."""
    tool_search_threshold: int | None = None
    """Past this many tools, the prompt carries a search tool and ``tool_search_top_k``
    definitions instead of all (``tools.search``); ``None``: always all."""
    tool_search_top_k: int = 5


@dataclass(slots=True)
class PlannedCall:
    """A call that passed the ToolSelector: the tool and the arguments to call it with.

    A ``pre_execution`` hook may change ``tool`` or ``arguments``. What the selector checked
    (and the approver, if any, saw) is kept apart in the run, out of the plan's reach
    (``RunContext.mark_checked`` / ``plan_changed``), so the ToolExecutor can tell a changed call
    from the checked one and check it again before it runs.
    """

    call: ToolCall
    tool: Tool
    arguments: dict[str, Any]
    fallback_for: str | None = None
    """The tool the model asked for, when this call goes to its fallback instead."""
    position: int = 0
    """Where the call stands in the model's turn (its result goes back in that place)."""


@dataclass(frozen=True, slots=True)
class ClientTurn:
    """What a run's caller brings: its own ``tools`` (built with ``client_tool``), the
    ``tool_choice`` among all the run's tools (``auto``, ``none``, ``required`` or a tool's
    name; ``None``: the run's own), and, when the run continues after the caller ran the calls
    the previous run handed out, their ``results`` (one ``tool`` turn, the run's input)."""

    tools: Sequence[Tool] = ()
    tool_choice: str | None = None
    results: Sequence[ToolResult] = field(default_factory=tuple)


@dataclass(slots=True)
class RunContext:
    """Everything one run knows. Created by the Agent, passed through the five stages."""

    request_id: str
    session_id: str
    user_message: str
    model: Model
    settings: ModelSettings
    limits: LoopLimits
    tools: dict[str, Tool]
    """The tools visible to this run, by name (what the model is shown)."""
    all_tool_names: list[str]
    executor: Executor
    client: ClientTurn | None = None
    """What the caller brought for this run: its own tools, their tool choice, or the
    results of the calls the previous run handed out (``pipeline.client_tools``)."""
    client_tools: frozenset[str] = frozenset()
    """Which of ``tools`` the caller runs itself (``pipeline.client_tools``)."""
    system_prompt: str | None = None
    """The agent's own system prompt: a template its ``{{ variables }}`` fill."""
    prompt_instructions: str | None = None
    """What this run adds after it (the output type's JSON instructions, explain mode): never
    rendered as a template, since it can hold a caller's text (an output schema)."""
    history: list[Message] = field(default_factory=list)
    load_history: HistorySource | None = None
    """Where ``history`` comes from; ``None``: the run starts with ``history`` as given."""
    summary_call: SummaryCall | None = None
    """The model call that summarised old turns for this run's prompt, if one was made."""
    listener: EventListener | None = None
    stream: StreamChoice = False
    dry_run: bool = False
    runtime: ToolRuntime = field(default_factory=ToolRuntime)
    approver: Approver | None = None
    renderer_name: str = "text"
    renderer: Renderer | None = None
    channel: str | None = None
    """The channel the answer is for (``Agent.run(channel=...)``), as the renderer is told."""
    variables: dict[str, Any] = field(default_factory=dict)
    """The run's variables (``Agent.run(variables=...)``): hooks read and fill them, and they
    fill ``{{ name }}`` placeholders in the system prompt."""
    budget: RunBudget = field(default_factory=RunBudget)
    """Tokens, cost and wall time this run may use (``pipeline.budget``)."""
    language: str = "en"
    """The language of the runtime's own messages in this run's output (``en`` or ``zh``:
    the run's ``lang`` variable, else the agent's ``language``; ``hermes_agent.messages``)."""
    recorder: Recorder | None = None
    """The audit trail of this run (``None``: auditing off, and free)."""
    redactor: Redactor | None = None
    """The agent's secrets and patterns: what hooks see of tool arguments and results is
    masked with it, as in the trail (``pipeline.hooks``)."""
    answer_model: Model | None = None
    """Model routing: the model that writes the final answer (``model`` makes the tool calls);
    ``None``: ``model`` does both."""
    output_spec: OutputSpec | None = None
    """Structured output: the schema the final answer must validate against."""
    explain: bool = False
    """Explain mode: the model is asked for a one-line reason with each turn."""
    journal: RunJournal | None = None
    """A durable run's journal (``pipeline.journal``): model turns and tool calls of earlier
    attempts are taken from it, not made again."""

    messages: list[Message] = field(default_factory=list)
    """The conversation as the model sees it: system, history, this run's turns."""
    new_messages: list[Message] = field(default_factory=list)
    """The messages this run added (saved to the session at the end, but for ``unsaved``)."""
    unsaved: list[Message] = field(default_factory=list)
    """Turns of ``new_messages`` that are for this run's prompts only (see ``add_message``)."""
    tool_specs: list[dict[str, Any]] = field(default_factory=list)
    step: int = 0
    steps: list[Step] = field(default_factory=list)
    prompt_rewrites: int = 0
    """Counts changes to messages already sent (trimming to fit, a changed system prompt)."""
    turn_settings: ModelSettings | None = None
    """The settings of the latest model request (tool_choice relaxes after the first turn)."""
    completion: Completion = field(default_factory=Completion)
    completion_text: str = ""
    planned: list[PlannedCall] = field(default_factory=list)
    rejected: list[tuple[int, ToolResult]] = field(default_factory=list)
    checked: dict[int, tuple[Tool, Any]] = field(default_factory=dict)
    """What the ToolSelector checked of each planned call, by position: the tool and a private
    copy of the arguments (see ``mark_checked``)."""
    """Calls refused by the ToolSelector, with their position in the model's turn."""
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    last_results: list[ToolResult] = field(default_factory=list)
    """The results of the latest ToolExecutor step, in call order (post_execution hooks)."""
    approvals: list[dict[str, Any]] = field(default_factory=list)
    approved_calls: dict[str, tuple[int, str]] = field(default_factory=dict)
    """Approvals granted in this run, by ``tool_selector.approval_key``, with the step that
    granted them and the approver's reason: an identical call of a later turn is not asked
    again."""
    rendered: RenderedMessage | None = None
    unusable_turns: int = 0
    denied_turns: int = 0
    """Of the ``unusable_turns`` in a row, those in which the approver refused a call."""
    last_denial: str | None = None
    """What the latest refused approval says (denied with its reason, or expired)."""
    answering: bool = False
    """The answer model has the turn (routing): the tool model made its last call."""
    asks_again: bool = False
    """The latest turn only leads to another model turn, with no call to run: the answer
    model takes over, or the answer failed its schema and the model is asked again."""
    reasks: int = 0
    """Turns that only re-asked for the answer (see ``step_limit``)."""
    output_retries: int = 0
    output_problems: list[str] = field(default_factory=list)
    """Structured output: what was wrong with the latest answer that failed validation."""
    reason: str | None = None
    """Explain mode: the reason the model gave for its latest turn."""
    data: Any = None
    """Structured output: the validated answer."""
    usage: Usage = field(default_factory=Usage)
    usage_by_model: dict[str, Usage] = field(default_factory=dict)
    output: str = ""
    status: int = Status.OK
    stage_status: int = Status.OK
    """The status of the stage that ran last."""
    error: str | None = None
    finished: bool = False
    """True once the model answered without calling a tool (or the run failed)."""
    loop_status: LoopStatus = "completed"
    answered_by: dict[str, Any] | None = None
    """The hook that ended the run with its reply (``answer_by_hook``)."""
    stopped_by: str | None = None
    """The bound that stopped the loop before an answer (``RunResult.stopped_by``)."""
    hook_notes: list[dict[str, Any]] = field(default_factory=list)
    """What hooks did to the run that the trail keeps (an answer, a rewritten message or
    history, a changed output, facts they noted), in order; the recorder writes each once."""
    history_loaded: bool = False
    """The session's history is in ``history`` (loaded before the ``pre_input`` hooks, which
    may rewrite it, or by the InputParser)."""
    warnings: list[str] = field(default_factory=list)
    """What the result's ``warnings`` say about the run itself (a budget overrun)."""
    started_ns: int = field(default_factory=time.perf_counter_ns)

    @property
    def step_limit(self) -> int:
        """How many model turns the loop may take: ``max_iterations`` bounds the rounds of tool
        calls, and the turns that only ask again for the answer (the hand-over to the answer
        model, at most one; retries of an answer that failed its schema, at most
        ``max_retries``) come on top."""
        return self.limits.max_iterations + self.reasks

    def route(self) -> None:
        """Model routing: which model takes the next turn (nothing to do without an answer
        model).

        Turns go to the tool model (``model`` as the run starts) until one of them calls no
        tool. That turn is not the answer: the answer model takes the next turn, from the same
        conversation without it, with the tools withdrawn (``tool_choice="none"``), and keeps
        the turns that follow (a retry of an answer that failed its schema). A run whose turns
        cannot call a tool at all (no tool visible, ``tool_choice="none"``) goes to the answer
        model from the start. ``model`` is always the model of the current turn — chosen
        before the turn's hooks run — so hooks, the step, the trail, the prompt fitting and
        the usage name the model that served it.
        """
        if self.answer_model is None:
            return
        if not self.answering and (not self.tools or self.settings.tool_choice == "none"):
            self.answering = True
        if self.answering and self.model is not self.answer_model:
            self.model = self.answer_model
            self.prompt_rewrites += 1  # another model, another prompt: recorded whole

    def count_usage(self, model_name: str, usage: Usage) -> None:
        """Add a model call's usage to the run's, and to its model's."""
        self.usage.add(usage)
        self.usage_by_model.setdefault(model_name, Usage()).add(usage)

    @property
    def listening(self) -> bool:
        """Whether anyone receives events (build costly ones only then)."""
        return self.listener is not None

    def emit(self, event: Event) -> None:
        """Tell streaming consumers something happened."""
        if self.listener is not None:
            self.listener(event)

    def log_stage(self, stage: str, status: int, **details: Any) -> None:
        """One debug line per stage, e.g. ``ThoughtGenerator: status=200, selected_tools=[...]``."""
        self.stage_status = status
        if logger.isEnabledFor(logging.INFO):
            extra = "".join(f", {key}={value!r}" for key, value in details.items())
            logger.info("%s: status=%d%s", stage, status, extra)

    def system_layout(self) -> tuple[list[Message], list[dict[str, Any]]]:
        """The system turn and the tool definitions this run sends — or would have sent, when
        it ended before the InputParser laid the conversation out (a ``pre_input`` hook
        refused it): what the trail's ``system_prompt_sha256`` identifies."""
        if self.messages:
            return self.messages[:1], self.tool_specs
        instructions = self.prompt_instructions or run_instructions(self)
        system = system_turn(self.system_prompt, instructions)
        turns = [Message("system", system)] if system else []
        return turns, [tool.spec() for tool in self.tools.values()]

    def add_message(self, message: Message, *, save: bool = True) -> None:
        """Add a turn to the conversation; ``save=False``: for this run's prompts only (a
        reminder from the runtime), never saved to the session."""
        self.messages.append(message)
        self.new_messages.append(message)
        if not save:
            self.unsaved.append(message)

    def messages_to_save(self) -> list[Message]:
        """The turns this run adds to the session."""
        if not self.unsaved:
            return self.new_messages
        return [m for m in self.new_messages if not any(m is u for u in self.unsaved)]

    def mark_checked(self, plan: PlannedCall) -> None:
        """Record the plan's tool and arguments as the checked (and approved) ones."""
        self.checked[plan.position] = (plan.tool, private_copy(plan.arguments))

    def plan_changed(self, plan: PlannedCall) -> bool:
        """Whether the plan's tool or arguments differ from what was checked. Arguments are
        compared with their types, so ``1`` and ``true`` differ as they do on the wire."""
        checked = self.checked.get(plan.position)
        if checked is None:
            return True
        tool, arguments = checked
        return plan.tool is not tool or not _same(plan.arguments, arguments)

    def checked_tool(self, plan: PlannedCall) -> Tool | None:
        checked = self.checked.get(plan.position)
        return checked[0] if checked else None

    def veto(self, plan: PlannedCall, reason: str) -> None:
        """Refuse a planned call (from a ``pre_execution`` hook): the model gets a 403 result."""
        if plan not in self.planned:
            return  # vetoed already, or not a call of this step: nothing left to refuse
        position = plan.position
        self.planned.remove(plan)
        message = f"call to '{plan.call.name}' was refused: {reason}"
        self.rejected.append(
            (position, error_result(plan.call.id, plan.call.name, Status.DENIED, message))
        )

    def rewrite_result(self, call_id: str, content: Any) -> None:
        """Replace what a tool returned (from a ``post_execution`` hook), everywhere it shows."""
        for result in self.last_results:
            if result.call_id == call_id:
                if isinstance(result.content, dict) and "data" in result.content:
                    result.content["data"] = content
                else:
                    result.content = content
        for record in self.tool_calls:
            if record.id == call_id:
                record.result = content

    def answer_by_hook(
        self, hook: str, point: str, reply: str, status: int, reason: str | None
    ) -> None:
        """End the run with a hook's reply: a completed run whose answer is the hook's (the
        model is not asked, or asked no more); the trail says which hook and why."""
        self.output = reply
        self.status = status
        self.finished = True
        self.loop_status = "answered_by_hook"
        self.answered_by = {"hook": hook, "point": point, "reason": reason}
        if not self.new_messages:  # answered before the InputParser laid out the turn
            self.new_messages.append(Message("user", self.user_message))
        self.note_hook(hook, point, answered={"reason": reason, "status": status})

    def note_hook(self, hook: str, point: str, **what: Any) -> None:
        """Keep what a hook did for the trail (one ``hook`` record per note)."""
        self.hook_notes.append({"hook": hook, "point": point, "step": self.step, **what})

    def fail(self, status: int, error: str) -> None:
        self.status = status
        self.error = error
        self.finished = True
        self.loop_status = "failed"

    def result(self) -> RunResult:
        return RunResult(
            output=self.output,
            status=int(self.status),
            request_id=self.request_id,
            session_id=self.session_id,
            tool_calls=self.tool_calls,
            usage=self.usage,
            steps=self.steps,
            duration_ms=(time.perf_counter_ns() - self.started_ns) / 1e6,
            error=self.error,
            loop_status=self.loop_status,
            approvals=self.approvals,
            rendered=self.rendered,
            data=self.data,
            output_retries=self.output_retries,
            usage_by_model=self.usage_by_model,
            answered_by=self.answered_by,
            stopped_by=self.stopped_by,
            variables=dict(self.variables),
            warnings=list(self.warnings),
        )


def error_result(call_id: str, name: str, status: Status, message: str) -> ToolResult:
    """A refused or failed call, in the normalised result shape the model reads
    (``{"status": "error", "data": null, "error": message}``). The status code travels beside
    the content (``ToolResult.status_code``), not in it: the message says what went wrong."""
    return ToolResult(
        call_id=call_id,
        name=name,
        content={"status": "error", "data": None, "error": message},
        status_code=int(status),
        error=message,
    )


def _same(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (``1 == True`` in Python, not in JSON)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(v, b[k]) for k, v in a.items())
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def run_instructions(ctx: RunContext) -> str | None:
    """What ``output_type`` and explain mode ask of the model, after the agent's prompt."""
    parts = []
    if ctx.output_spec is not None:
        parts.append(json_mode_prompt(ctx.output_spec.schema, with_tools=bool(ctx.tools)))
    if ctx.explain:
        parts.append(EXPLAIN_PROMPT)
    return "\n\n".join(parts) or None


def system_turn(prompt: str | None, instructions: str | None) -> str | None:
    """A run's system turn: the agent's prompt, then the run's instructions (one system
    turn, so every backend and the history summary see it alike)."""
    return "\n\n".join(part for part in (prompt, instructions) if part) or None
