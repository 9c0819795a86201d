"""OpenTelemetry traces of agent runs, in the GenAI semantic conventions (the ``otel`` extra).

    from hermes_agent import Agent
    from hermes_agent.tracing import instrument

    agent = Agent(...)
    instrument(agent)             # spans go to the global TracerProvider your app configured

One run is one trace subtree::

    invoke_agent [name]                       INTERNAL   the run (Agent.run / arun / astream)
      InputParser                             INTERNAL   stage 1
      ThoughtGenerator                        INTERNAL   stage 2, once per model turn
        chat {model}                          CLIENT (endpoint) | INTERNAL (in process)
      ToolSelector                            INTERNAL   stage 3
      ToolExecutor                            INTERNAL   stage 4
        execute_tool {tool}                   INTERNAL   one per call that ran
      OutputRenderer                          INTERNAL   stage 5

The names and attributes follow the OpenTelemetry semantic conventions for generative AI at
version ``SEMCONV_VERSION`` (1.41.0, still marked *Development*); every span carries that
version's schema URL, so a backend knows which names it is reading. The spans are built on the
agent's public seams: one ``AgentTracer`` registered at every hook point (``pre_input`` ...
``post_output``), reading what the hook context shows (the model, the steps with their usage,
the calls with their timings). Hooks are shared by ``Agent.fork``, so a fork — the one a
service serves, for instance — is traced too.

Content (messages, tool arguments and results, error messages) is recorded only with
``capture_content=True``, and then masked: the agent's own secrets and ``redact_patterns``
(``Agent.redactor``, as in the audit trail) plus ``DEFAULT_SECRET_PATTERNS`` (well-known key
formats) become ``[REDACTED]``. Without it, no attribute holds text from the conversation.

Nothing here imports ``opentelemetry`` until ``instrument`` is called: an agent that is not
instrumented imports and records nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hermes_agent.audit.redaction import Redactor
from hermes_agent.errors import MissingDependencyError
from hermes_agent.pipeline.hooks import HOOK_POINTS, HookContext
from hermes_agent.pipeline.status import Status
from hermes_agent.stages import HookStage
from hermes_agent.types import Message, ToolCallRecord

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from hermes_agent.agent import Agent
    from hermes_agent.models.base import Model

__all__ = [
    "DEFAULT_SECRET_PATTERNS",
    "SCHEMA_URL",
    "SEMCONV_VERSION",
    "AgentTracer",
    "attach_incoming",
    "detach",
    "error_type",
    "instrument",
    "tracer_of",
]

logger = logging.getLogger("hermes_agent.tracing")

SEMCONV_VERSION = "1.41.0"
"""The version of the OpenTelemetry semantic conventions the span names and attributes follow."""
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"

DEFAULT_SECRET_PATTERNS: tuple[str, ...] = (
    r"sk-[A-Za-z0-9_-]{16,}",  # OpenAI-style and Anthropic-style API keys
    r"\b(?:hk|hst)_[0-9a-f]{16}\.[A-Za-z0-9_-]{8,}",  # this service's API keys, stream tokens
    r"(?i)bearer\s+[A-Za-z0-9._~+/=-]{16,}",  # a bearer token quoted in text
    r"AKIA[0-9A-Z]{16}",  # AWS access key ids
    r"gh[pousr]_[A-Za-z0-9]{36,}",  # GitHub tokens
    r"xox[abprs]-[A-Za-z0-9-]{10,}",  # Slack tokens
    r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",  # JSON Web Tokens
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----",
)
"""Masked in captured content on top of the agent's own secrets: traces leave the process for
a backend others read, so well-known key formats are masked even if nobody listed them."""

STAGE_SPANS = {str(stage): str(stage.stage_name) for stage in HookStage}
"""Stage → span name: the names the audit trail and the debug log use."""


def error_type(status: int) -> str | None:
    """The ``error.type`` of a status code: ``None`` below 400, else the ``Status`` name in
    lower case (``invalid``, ``denied``, ``unknown_tool``, ``timeout``, ``unprocessable``,
    ``rate_limited``, ``tool_error``, ``model_error``), ``_OTHER`` for an unknown code. 500 stays
    ``tool_error``, its name before ``Status.INTERNAL_ERROR``: dashboards filter on it."""
    if status < 400:
        return None
    if status == Status.INTERNAL_ERROR:
        return "tool_error"
    try:
        return Status(status).name.lower()
    except ValueError:
        return "_OTHER"


# -- turning it on ---------------------------------------------------------------------------


def instrument(
    agent: Agent,
    *,
    capture_content: bool = False,
    agent_name: str | None = None,
    tracer_provider: TracerProvider | None = None,
    redact_patterns: Iterable[str] = (),
) -> AgentTracer:
    """Trace every run of ``agent`` (and of its forks) from now on; returns the tracer.

    ``tracer_provider``: where the spans go (default: OpenTelemetry's global provider, which
    the application, or ``opentelemetry-instrument``, configures). ``capture_content``: record
    messages, tool arguments, results and error messages (masked; see the module docstring).
    ``agent_name``: ``gen_ai.agent.name`` and the run span's name. ``redact_patterns``: more
    regular expressions to mask in captured content.

    Calling it again on the same agent returns the tracer it already has. Raises
    ``MissingDependencyError`` when OpenTelemetry is not installed.
    """
    existing = tracer_of(agent)
    if existing is not None:
        return existing
    try:
        from opentelemetry import trace
    except ImportError as exc:  # pragma: no cover - the extra is installed in the tests
        raise MissingDependencyError(
            'tracing needs OpenTelemetry: pip install "hermes-agent-core[otel]"'
        ) from exc
    tracer = trace.get_tracer(
        "hermes_agent", _package_version(), tracer_provider=tracer_provider, schema_url=SCHEMA_URL
    )
    patterns = Redactor((), [*DEFAULT_SECRET_PATTERNS, *redact_patterns])
    hook = AgentTracer(
        tracer,
        capture_content=capture_content,
        agent_name=agent_name,
        redactors=(agent.redactor, patterns),
    )
    for point in HOOK_POINTS:
        agent.add_hook(point, hook)
    return hook


def tracer_of(agent: Agent) -> AgentTracer | None:
    """The ``AgentTracer`` of an instrumented agent; ``None`` when it is not traced."""
    for hook in agent.hooks.at("pre_input"):
        if isinstance(hook, AgentTracer):
            return hook
    return None


def attach_incoming(agent: Agent, headers: Mapping[str, str]) -> object | None:
    """Make the W3C trace context of an incoming request (``traceparent``, ``tracestate``,
    ``baggage``) the current context, so that the runs it starts join the caller's trace.

    Only for a traced agent (otherwise nothing is imported and ``None`` comes back), and only
    when no span is current already (an ASGI instrumentation that made a server span wins).
    Returns the token to give to ``detach`` when the request is over, or ``None``.
    """
    if tracer_of(agent) is None:
        return None
    from opentelemetry import context, propagate, trace

    if trace.get_current_span().get_span_context().is_valid:
        return None
    incoming = propagate.extract(headers)
    if not trace.get_current_span(incoming).get_span_context().is_valid:
        return None
    return context.attach(incoming)


def outgoing_context() -> dict[str, str]:
    """The current W3C trace context as a carrier (``traceparent``, ...), for a run handed to
    another process (the queue keeps it with the run and the worker joins the trace with
    ``attach_incoming``). Empty when no span is current, and when OpenTelemetry was never
    imported here (then nothing is traced, and nothing is imported now)."""
    import sys

    if "opentelemetry.trace" not in sys.modules:
        return {}
    from opentelemetry import propagate, trace

    if not trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def detach(token: object) -> None:
    """Undo ``attach_incoming``."""
    from opentelemetry import context

    context.detach(token)  # type: ignore[arg-type]


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hermes-agent-core")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0"


# -- the tracer ------------------------------------------------------------------------------


@dataclass(slots=True)
class _RunTrace:
    """The spans of one run in flight."""

    span: Span
    token: object
    """The context token that made ``span`` current."""
    task: asyncio.Task[Any] | None
    open: list[tuple[Span, object, str]] = field(default_factory=list)
    """Stage and chat spans made current, innermost last: (span, token, kind)."""
    steps_before: int = 0
    calls_started_ns: int = 0
    on_done: Callable[[asyncio.Task[Any]], None] | None = None


class AgentTracer:
    """The hook that turns an agent's runs into spans (see the module docstring).

    Registered at every hook point by ``instrument``; it never fails a run: a problem while
    tracing is logged (``hermes_agent.tracing``) and the run goes on.
    """

    def __init__(
        self,
        tracer: Tracer,
        *,
        capture_content: bool,
        agent_name: str | None,
        redactors: Sequence[Redactor],
    ) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace import SpanKind, StatusCode

        self.tracer = tracer
        self.capture_content = capture_content
        self.agent_name = agent_name
        self._redactors = [r for r in redactors if r]
        self._runs: dict[str, _RunTrace] = {}
        self._models: dict[int, tuple[Model, tuple[str, bool, str | None, int | None]]] = {}
        self._trace = trace
        self._context = context
        self._kind = SpanKind
        self._error_code = StatusCode.ERROR
        self._handlers: dict[str, Callable[[HookContext], None]] = {
            "pre_input": self._pre_input,
            "post_input": self._post_stage,
            "pre_thought": self._pre_thought,
            "post_thought": self._post_thought,
            "pre_selection": self._pre_stage,
            "post_selection": self._post_selection,
            "pre_execution": self._pre_execution,
            "post_execution": self._post_execution,
            "pre_output": self._pre_stage,
            "post_output": self._post_output,
        }

    def __call__(self, ctx: HookContext) -> None:
        try:
            self._handlers[ctx.point](ctx)
        except Exception:  # tracing must never fail the run it watches
            logger.warning("tracing failed at %s", ctx.point, exc_info=True)

    # -- the run ---------------------------------------------------------------------------

    def _pre_input(self, ctx: HookContext) -> None:
        self._run(ctx)
        self._pre_stage(ctx)

    def _run(self, ctx: HookContext) -> _RunTrace:
        """This run's spans, started with the first hook of the run that reaches the tracer
        (``pre_input``, unless a hook before it failed)."""
        run = self._runs.get(ctx.request_id)
        if run is not None:
            return run
        model = ctx.model
        provider = self._provider(model)[0]
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": model.name,
            "gen_ai.conversation.id": ctx.session_id,
            "hermes.request_id": ctx.request_id,
        }
        if self.agent_name:
            attributes["gen_ai.agent.name"] = self.agent_name
        name = f"invoke_agent {self.agent_name}" if self.agent_name else "invoke_agent"
        span = self.tracer.start_span(name, kind=self._kind.INTERNAL, attributes=attributes)
        if self.capture_content:
            span.set_attribute("gen_ai.input.messages", self._json([_user(ctx.user_message)]))
        token = self._context.attach(self._trace.set_span_in_context(span))
        task = _current_task()
        run = _RunTrace(span, token, task)
        if task is not None:
            # A run that never reaches post_output (cancelled, timed out, its task killed)
            # still ends its spans, when its task ends.
            request_id = ctx.request_id
            run.on_done = lambda _: self._abandon(request_id)
            task.add_done_callback(run.on_done)
        self._runs[ctx.request_id] = run
        return run

    def _post_output(self, ctx: HookContext) -> None:
        self._post_stage(ctx)
        run = self._runs.pop(ctx.request_id, None)
        if run is None:
            return
        if run.task is not None and run.on_done is not None:
            run.task.remove_done_callback(run.on_done)
        self._close_open(run, ctx.status)
        span = run.span
        usage = ctx.usage
        span.set_attribute("gen_ai.usage.input_tokens", usage.prompt_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", usage.completion_tokens)
        span.set_attribute("hermes.status", ctx.status)
        span.set_attribute("hermes.tool_calls", len(ctx.tool_calls))
        if self.capture_content:
            output = {"role": "assistant", "parts": [_text(ctx.output)], "finish_reason": "stop"}
            span.set_attribute("gen_ai.output.messages", self._json([output]))
        self._fail(span, error_type(ctx.status), ctx.error)
        self._context.detach(run.token)  # type: ignore[arg-type]
        span.end()

    def _abandon(self, request_id: str) -> None:
        """The run's task ended before its output stage: end what is open, as an error."""
        run = self._runs.pop(request_id, None)
        if run is None:
            return
        # A task that swallowed its cancellation (a service's run driver does) still counts it.
        task = run.task
        cancelled = task is not None and (task.cancelled() or task.cancelling() > 0)
        kind = "cancelled" if cancelled else "interrupted"
        for span, _, _ in reversed(run.open):
            self._fail(span, kind, None)
            span.end()
        run.open.clear()
        self._fail(run.span, kind, None)
        run.span.end()

    # -- stages ----------------------------------------------------------------------------

    def _pre_stage(self, ctx: HookContext) -> None:
        run = self._run(ctx)
        self._close_open(run, ctx.status)  # a stage whose post hooks never ran
        stage = ctx.point.removeprefix("pre_")
        attributes = {"hermes.stage": stage, "hermes.step": ctx.step}
        self._open(run, STAGE_SPANS[stage], attributes, "stage", self._kind.INTERNAL)

    def _post_stage(self, ctx: HookContext) -> None:
        run = self._runs.get(ctx.request_id)
        if run is None:
            return
        self._close_open(run, ctx.status)

    def _post_selection(self, ctx: HookContext) -> None:
        run = self._runs.get(ctx.request_id)
        if run is not None and run.open:
            run.open[-1][0].set_attribute("hermes.calls.planned", len(ctx.planned))
        self._post_stage(ctx)

    # -- model turns -------------------------------------------------------------------------

    def _pre_thought(self, ctx: HookContext) -> None:
        self._pre_stage(ctx)
        run = self._runs[ctx.request_id]
        run.steps_before = len(ctx.steps)
        model = ctx.model
        provider, remote, host, port = self._provider(model)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": model.name,
            "gen_ai.conversation.id": ctx.session_id,
        }
        if host:
            attributes["server.address"] = host
            if port:
                attributes["server.port"] = port
        kind = self._kind.CLIENT if remote else self._kind.INTERNAL
        span = self._open(run, f"chat {model.name}", attributes, "chat", kind)
        if self.capture_content:
            messages = [_message(m) for m in ctx.messages]
            span.set_attribute("gen_ai.input.messages", self._json(messages))

    def _post_thought(self, ctx: HookContext) -> None:
        run = self._runs.get(ctx.request_id)
        if run is None:
            return
        if run.open and run.open[-1][2] == "chat":
            span = run.open[-1][0]
            turns = ctx.steps[run.steps_before :]
            span.set_attribute(
                "gen_ai.usage.input_tokens", sum(s.usage.prompt_tokens for s in turns)
            )
            span.set_attribute(
                "gen_ai.usage.output_tokens", sum(s.usage.completion_tokens for s in turns)
            )
            served = turns[-1].model if turns else ""
            if served:
                span.set_attribute("gen_ai.response.model", served)
            if not turns and ctx.status == Status.MODEL_ERROR:
                self._fail(span, error_type(ctx.status), ctx.error)  # the request itself failed
            elif self.capture_content and turns:
                completion = ctx.completion
                parts = [_text(completion.content)] if completion.content else []
                parts += [_call(c.id, c.name, c.arguments) for c in completion.tool_calls]
                reason = "tool_call" if completion.tool_calls else "stop"
                answer = {"role": "assistant", "parts": parts, "finish_reason": reason}
                span.set_attribute("gen_ai.output.messages", self._json([answer]))
        self._post_stage(ctx)

    # -- tool calls ---------------------------------------------------------------------------

    def _pre_execution(self, ctx: HookContext) -> None:
        self._pre_stage(ctx)
        self._runs[ctx.request_id].calls_started_ns = time.time_ns()

    def _post_execution(self, ctx: HookContext) -> None:
        run = self._runs.get(ctx.request_id)
        if run is not None and run.open and run.open[-1][2] == "stage":
            stage = run.open[-1][0]
            count = len(ctx.results)
            records = ctx.tool_calls[-count:] if count else ()
            if records:
                descriptions = {tool.name: tool.description for tool in ctx.tools}
                for record in records:
                    self._tool_span(run, stage, record, descriptions.get(record.name))
        self._post_stage(ctx)

    def _tool_span(
        self, run: _RunTrace, stage: Span, record: ToolCallRecord, description: str | None
    ) -> None:
        """One ``execute_tool`` span for a call that reached the ToolExecutor; a call refused
        before (unknown, invalid, denied, vetoed) is an event on the stage span instead."""
        failure = error_type(record.status_code)
        ran = "execution_time_ms" in record.metadata
        if not ran:
            event: dict[str, Any] = {
                "gen_ai.tool.name": record.name,
                "gen_ai.tool.call.id": record.id,
                "hermes.status": record.status_code,
            }
            if failure:
                event["error.type"] = failure
            stage.add_event("hermes.tool_call.refused", event)
            return
        # The calls of a step run concurrently from the moment the executor got them; each
        # lasted what the executor measured (execution_time_ms).
        started = run.calls_started_ns
        took = record.metadata.get("execution_time_ms")
        took_ms = took if isinstance(took, int | float) else 0.0
        ended = min(started + int(took_ms * 1e6), time.time_ns())
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": record.name,
            "gen_ai.tool.call.id": record.id,
            "gen_ai.tool.type": "function",
            "hermes.status": record.status_code,
            "hermes.cache_hit": bool(record.metadata.get("cache_hit", False)),
        }
        if description:
            attributes["gen_ai.tool.description"] = description
        if record.metadata.get("fallback_for"):
            attributes["hermes.fallback_for"] = str(record.metadata["fallback_for"])
        if self.capture_content:
            attributes["gen_ai.tool.call.arguments"] = self._json(record.arguments)
            if failure is None:
                attributes["gen_ai.tool.call.result"] = self._json(record.result)
        span = self.tracer.start_span(
            f"execute_tool {record.name}",
            context=self._trace.set_span_in_context(stage),
            kind=self._kind.INTERNAL,
            attributes=attributes,
            start_time=started,
        )
        self._fail(span, failure, record.error)
        span.end(end_time=ended)

    # -- helpers -------------------------------------------------------------------------------

    def _provider(self, model: Model) -> tuple[str, bool, str | None, int | None]:
        known = self._models.get(id(model))
        if known is None or known[0] is not model:
            known = self._models[id(model)] = (model, _provider(model))
        return known[1]

    def _open(
        self, run: _RunTrace, name: str, attributes: dict[str, Any], kind: str, span_kind: Any
    ) -> Span:
        # The parent (the run's span, or the stage of a chat span) is the current span: each
        # span is made current when it starts and stops being so when it ends.
        span = self.tracer.start_span(name, kind=span_kind, attributes=attributes)
        token = self._context.attach(self._trace.set_span_in_context(span))
        run.open.append((span, token, kind))
        return span

    def _close_open(self, run: _RunTrace, status: int) -> None:
        """End the stage (and chat) spans that are open, innermost first."""
        while run.open:
            span, token, _ = run.open.pop()
            self._context.detach(token)  # type: ignore[arg-type]
            span.set_attribute("hermes.status", status)
            span.end()

    def _fail(self, span: Span, kind: str | None, message: str | None) -> None:
        if kind is None:
            return
        from opentelemetry.trace import Status as SpanStatus

        span.set_attribute("error.type", kind)
        # An error message can quote the conversation (a tool's exception, an argument): it is
        # content, recorded only when content is.
        description = self._redact(message) if self.capture_content and message else None
        span.set_status(SpanStatus(self._error_code, description))

    def _redact(self, text: str) -> str:
        for redactor in self._redactors:
            text = redactor(text)
        return text

    def _json(self, value: Any) -> str:
        """Content as a JSON attribute, masked before and after it is serialised."""
        for redactor in self._redactors:
            value = redactor.value(value)
        return self._redact(json.dumps(value, ensure_ascii=False, default=str))


# -- what the conventions call messages -------------------------------------------------------


def _text(content: str) -> dict[str, Any]:
    return {"type": "text", "content": content}


def _call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    return {"type": "tool_call", "id": call_id, "name": name, "arguments": arguments}


def _user(content: str) -> dict[str, Any]:
    return {"role": "user", "parts": [_text(content)]}


def _message(message: Message) -> dict[str, Any]:
    """A message in the conventions' input-messages shape (role and typed parts)."""
    parts: list[dict[str, Any]] = []
    if message.scratch_pad:
        parts.append({"type": "reasoning", "content": message.scratch_pad})
    if message.content:
        parts.append(_text(message.content))
    parts += [_call(c.id, c.name, c.arguments) for c in message.tool_calls]
    parts += [
        {"type": "tool_call_response", "id": r.call_id, "result": r.content}
        for r in message.tool_results
    ]
    return {"role": message.role, "parts": parts}


def _provider(model: Model) -> tuple[str, bool, str | None, int | None]:
    """``gen_ai.provider.name``, whether the model is called over the network, and its host
    and port: what the model's profile declares (its class name when it names no provider)."""
    profile = model.profile
    provider = profile.provider or type(model).__name__
    if profile.server_url is None:
        return provider, False, None, None
    url = urllib.parse.urlsplit(profile.server_url)
    return provider, True, url.hostname, url.port


def _current_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running loop: a hook called by hand
        return None
