"""Stage 2 — ThoughtGenerator: ask the model for its next turn and parse it.

The model renders the prompt for its own wire (Hermes text or native tools) and returns the
parsed completion plus the raw text. When streaming, the text is parsed incrementally so that
consumers see text and tool calls as they arrive.

A thinking model's thought (``<think>``, or a server's reasoning field, which the model hands
over as ``<think>`` text) goes to ``Step.thought`` and the events, never to the conversation:
it is not sent back in later turns. The Qwen3 and QwQ chat templates drop the thoughts of the
turns before the last user message too (Qwen3's keeps those of the tool steps after it; a chat
format that does the same is not built yet). A turn that did not parse is the exception: it is
replayed verbatim (``Message.raw``), thought included, so the model sees exactly what it wrote.
A call written inside the thought follows the model's thought policy, and a template that opens
the thought is read from inside it (``pipeline.thought_calls``).

A turn the model says was cut off at ``max_tokens`` (finish reason ``length``) runs none of its
calls: they become parse errors the model reads (``_cut_turn``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import time
from typing import Any

from hermes_agent.errors import ModelError, StoreUnavailable
from hermes_agent.events import (
    ScratchPadDeltaEvent,
    TextDeltaEvent,
    ThoughtDeltaEvent,
    ThoughtEvent,
    ToolCallDeltaEvent,
    ToolCallParsedEvent,
    ToolCallStartedEvent,
)
from hermes_agent.models.base import ModelSettings
from hermes_agent.pipeline.context import RunContext, system_turn
from hermes_agent.pipeline.context_window import fit_to_context
from hermes_agent.pipeline.status import REFUSED, Status
from hermes_agent.pipeline.thought_calls import apply_thought_policy, policy_of, read_opened
from hermes_agent.pipeline.watch import current_watch
from hermes_agent.protocol.parser import (
    ScratchPadDelta,
    StreamEvent,
    StreamParser,
    TextDelta,
    ThoughtDelta,
    ThoughtRevealed,
    ToolCallArgumentsDelta,
    ToolCallFinished,
    ToolCallStarted,
)
from hermes_agent.protocol.prompts import json_retry_prompt
from hermes_agent.stages import StageName
from hermes_agent.types import (
    Completion,
    Message,
    ModelResponse,
    ParseError,
    Step,
    ToolCall,
    Usage,
    new_call_id,
)

logger = logging.getLogger(__name__)


class ThoughtGenerator:
    name = StageName.THOUGHT_GENERATOR

    async def run(self, ctx: RunContext) -> RunContext:
        started = time.perf_counter_ns()
        settings = ctx.settings
        ctx.completion_text = ""  # a failing request must not leave the last turn's text
        ctx.asks_again = False
        ctx.reason = None
        if ctx.answering:  # the answer model writes the answer: no tool is offered
            settings = dataclasses.replace(settings, tool_choice="none")
        if ctx.system_prompt and "{{" in ctx.system_prompt and ctx.messages:
            # Hooks may have set variables since the last turn; render the agent's template
            # afresh (only it: the run's instructions can hold a caller's text).
            rendered = render_template(ctx.system_prompt, ctx.variables)
            _warn_unfilled(ctx, rendered)
            system = system_turn(rendered, ctx.prompt_instructions)
            if system is not None and system != ctx.messages[0].content:
                ctx.messages[0] = Message("system", system)
                ctx.prompt_rewrites += 1
        forced = settings.tool_choice not in ("auto", "none")
        if forced and _requirement_met(ctx, settings.tool_choice):
            # A forced call applies until the model has called; afterwards it must be free to
            # answer in text, or it could never finish.
            settings = dataclasses.replace(settings, tool_choice="auto")
            forced = False
        ctx.turn_settings = settings
        fit_to_context(ctx)
        watch = current_watch()
        if watch is not None:  # an engine counts this turn from the moment it is asked
            model = ctx.model
            prompt = model.render_prompt(ctx.messages, ctx.tool_specs, settings)
            watch.spend.sent(model.count_tokens(prompt), model.count_tokens)
        policy = policy_of(ctx.model)  # the family's thought policy (pipeline.thought_calls)
        try:
            if ctx.stream() if callable(ctx.stream) else ctx.stream:
                response = await _streamed(ctx, settings, policy.opens_thought)
            else:
                response = await ctx.model.complete(ctx.messages, ctx.tool_specs, settings)
                response = read_opened(response, policy)
        except StoreUnavailable:
            raise  # the journal could not keep the turn: not the model's failure
        except Exception as exc:  # ModelError, or anything a custom model lets escape
            message = str(exc) if isinstance(exc, ModelError) else f"{type(exc).__name__}: {exc}"
            ctx.fail(Status.MODEL_ERROR, message)
            ctx.output = f"The model failed: {message}"
            ctx.log_stage(self.name, Status.MODEL_ERROR, error=message)
            ctx.emit(ThoughtEvent(status=int(Status.MODEL_ERROR), step=ctx.step, error=message))
            return ctx

        if watch is not None:
            watch.spend.ended(response.usage)
        completion = apply_thought_policy(ctx, response.completion, policy)
        if response.finish_reason == CUT_SHORT and completion.tool_calls:
            completion = _cut_turn(completion, settings.max_tokens)
        _unique_ids(completion.tool_calls)
        ctx.completion = completion
        ctx.completion_text = response.text
        ctx.count_usage(ctx.model.name, response.usage)
        if ctx.explain:
            ctx.reason = reason_of(completion.scratch_pad)
        clean = not completion.errors
        answered = clean and not completion.tool_calls and not forced
        # The tool model's text turn is not the answer when an answer model writes it: the
        # answer model gets the conversation without it (see ``RunContext.route``).
        hand_over = answered and ctx.answer_model is not None and not ctx.answering
        if not hand_over:
            ctx.add_message(
                Message(
                    "assistant",
                    completion.content,
                    tool_calls=list(completion.tool_calls),
                    scratch_pad=completion.scratch_pad,
                    raw=None if clean else response.text,
                )
            )
        status = Status.OK if clean else Status.INVALID
        enforcement = ctx.model.profile.tool_choice_enforcement
        if forced and clean and not completion.tool_calls:
            status = _required_call_missing(ctx, settings.tool_choice)
        elif hand_over:
            ctx.answering = ctx.asks_again = True
            ctx.reasks += 1
        elif answered:
            status = await _check_answer(ctx) if ctx.output_spec is not None else Status.OK
            ctx.finished = not ctx.asks_again
        ctx.steps.append(
            Step(
                index=ctx.step,
                completion_text=response.text,
                parse_errors=[error.message for error in completion.errors],
                status_code=int(status),
                duration_ms=(time.perf_counter_ns() - started) / 1e6,
                usage=response.usage,
                tool_choice_enforcement=enforcement if forced else None,
                model=ctx.model.name,
                reason=ctx.reason,
                thought=completion.thought,
                notes=list(completion.notes),
            )
        )
        names = [call.name for call in completion.tool_calls]
        ctx.log_stage(self.name, status, selected_tools=names)
        if ctx.listening:
            ctx.emit(
                ThoughtEvent(
                    status=int(status),
                    step=ctx.step,
                    content=completion.content,
                    tool_calls=names,
                    parse_errors=[error.message for error in completion.errors],
                    tokens=response.usage.total_tokens,
                    thought=completion.thought,
                    notes=list(completion.notes),
                )
            )
        return ctx


async def _check_answer(ctx: RunContext) -> Status:
    """Structured output: validate the text answer against the run's ``output_type``. Valid:
    ``ctx.data`` holds it. Invalid: the model reads what is wrong and is asked again (the
    invalid turn and the feedback stay out of the session), at most ``max_retries`` times; then the
    run fails with 422."""
    spec = ctx.output_spec
    assert spec is not None
    # In a worker thread: the schema may be a caller's (its check has a step budget, and
    # should not hold the loop everyone shares even for that long).
    data, problems = await asyncio.to_thread(spec.check, ctx.completion.content)
    if not problems:
        ctx.data = data
        return Status.OK
    ctx.output_problems = problems
    ctx.unsaved.append(ctx.new_messages[-1])
    if ctx.output_retries >= ctx.limits.max_retries:
        tries = ctx.output_retries + 1
        ctx.fail(
            Status.UNPROCESSABLE,
            f"the answer did not match the output type {spec.name} in {tries} "
            f"answer{'s' if tries != 1 else ''}: " + "; ".join(problems),
        )
        ctx.output = f"I could not give a valid answer: {ctx.error}."
        return Status.UNPROCESSABLE
    ctx.output_retries += 1
    ctx.reasks += 1
    ctx.asks_again = True
    ctx.add_message(Message("user", json_retry_prompt(problems)), save=False)
    return Status.UNPROCESSABLE


_REASON = re.compile(r"^\s*reason\s*:\s*", re.I)
MAX_REASON_CHARS = 300


def reason_of(scratch_pad: str | None) -> str | None:
    """Explain mode: the one-line reason in a scratch pad — its ``Reason:`` line, else its
    first non-empty line; ``None`` when there is none."""
    if not scratch_pad:
        return None
    lines = [line.strip() for line in scratch_pad.splitlines() if line.strip()]
    if not lines:
        return None
    chosen = next((line for line in lines if _REASON.match(line)), lines[0])
    reason = _REASON.sub("", chosen).strip()
    if len(reason) > MAX_REASON_CHARS:
        reason = reason[: MAX_REASON_CHARS - 1] + "…"
    return reason or None


def _requirement_met(ctx: RunContext, tool_choice: str) -> bool:
    """Whether a call that satisfies the forced choice passed the ToolSelector in this run
    (the named tool, or any tool for ``required``); a malformed or refused call does not."""
    return any(
        record.status_code not in REFUSED
        and (tool_choice == "required" or record.name == tool_choice)
        for record in ctx.tool_calls
    )


def _required_call_missing(ctx: RunContext, tool_choice: str) -> Status:
    """The model answered in text although a call was required: tell it so and let it try
    again (an unusable turn, bounded by ``max_retries``), then fail with a status that says
    the requirement was not met. Some endpoints only see the requirement as a sentence in the
    prompt, so it is enforced here for every model."""
    ctx.unusable_turns += 1
    wanted = "one of the tools" if tool_choice == "required" else f"the tool '{tool_choice}'"
    if ctx.unusable_turns > ctx.limits.max_retries:
        ctx.fail(
            Status.MODEL_ERROR,
            f"tool_choice {tool_choice!r} was not met: the model answered without calling "
            f"{wanted} in {ctx.unusable_turns} turns",
        )
        ctx.output = f"I could not complete the request: {ctx.error}."
    else:
        # The reminder is the runtime's, not the user's: it is sent, and not saved.
        ctx.add_message(
            Message(
                "user",
                f"You must call {wanted} now. Answer with a <tool_call> block only, no text.",
            ),
            save=False,
        )
    return Status.INVALID


CUT_SHORT = "length"
"""The finish reason of a turn cut off at ``max_tokens`` (OpenAI's word, and llama.cpp's)."""


def _cut_turn(completion: Completion, max_tokens: int | None) -> Completion:
    """A turn cut off at the token limit runs none of its calls: the last one may hold a cut
    value that still parses (an XML ``<parameter>`` has no closing quote to miss), and the ones
    before it were written towards a turn that never ended. Each becomes a parse error the
    model reads, so it is asked again like any malformed turn (bounded by ``max_retries``)."""
    limit = f"max_tokens={max_tokens}" if max_tokens is not None else "the token limit"
    message = (
        f"the turn was cut off at {limit} before it ended, so none of its calls ran; "
        "call again with shorter arguments (or fewer calls in one turn)"
    )
    cut = [
        ParseError(call.name, f"call to '{call.name}': {message}") for call in completion.tool_calls
    ]
    return dataclasses.replace(completion, tool_calls=[], errors=[*completion.errors, *cut])


def _unique_ids(calls: list[ToolCall]) -> None:
    """Models copy example ids; two calls with one id would be confused with each other."""
    seen: set[str] = set()
    for call in calls:
        if call.id in seen:
            call.id = new_call_id()
        seen.add(call.id)


_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


def render_template(template: str, variables: dict[str, Any]) -> str:
    """Fill ``{{ name }}`` placeholders; a name with no value is left as written."""

    def fill(match: re.Match[str]) -> str:
        name = match.group(1)
        return str(variables[name]) if name in variables else match.group(0)

    return _PLACEHOLDER.sub(fill, template)


def _warn_unfilled(ctx: RunContext, rendered: str) -> None:
    """A placeholder no variable filled goes to the model as written; the run says so once
    (``RunResult.warnings``) and logs it, so that a typo in a name is not silent."""
    for name in dict.fromkeys(_PLACEHOLDER.findall(rendered)):
        warning = (
            f"the system prompt's placeholder {{{{ {name} }}}} has no value (no variable "
            f"{name!r}); it was sent as written"
        )
        if warning not in ctx.warnings:
            ctx.warnings.append(warning)
            logger.warning("run %s: %s", ctx.request_id, warning)


async def _streamed(
    ctx: RunContext, settings: ModelSettings, in_thought: bool = False
) -> ModelResponse:
    parser = StreamParser(in_thought=in_thought)  # the template opened <think>: start in it
    pieces: list[str] = []
    usage = Usage()
    finish = ""
    watch = current_watch()
    async for chunk in ctx.model.stream(ctx.messages, ctx.tool_specs, settings):
        if chunk.usage is not None:
            usage = chunk.usage
        finish = chunk.finish_reason or finish
        if chunk.text:
            pieces.append(chunk.text)
            if watch is not None:
                watch.spend.streamed(chunk.text)
            _forward(ctx, parser.feed(chunk.text))
    _forward(ctx, parser.flush())  # held-back text, an unclosed final block
    completion = parser.close()
    return ModelResponse(completion, "".join(pieces), usage, ctx.model.name, finish)


def _forward(ctx: RunContext, events: list[StreamEvent]) -> None:
    # With an answer model, the tool model's text is never the answer: it is not streamed.
    quiet = ctx.answer_model is not None and not ctx.answering
    for event in events:
        if isinstance(event, TextDelta):
            if not quiet:
                ctx.emit(TextDeltaEvent(event.text))
        elif isinstance(event, ScratchPadDelta):
            ctx.emit(ScratchPadDeltaEvent(event.text))
        elif isinstance(event, ThoughtDelta):
            ctx.emit(ThoughtDeltaEvent(event.text))
        elif isinstance(event, ThoughtRevealed):
            ctx.emit(ThoughtDeltaEvent(event.text, revealed=True))
        elif isinstance(event, ToolCallStarted):
            ctx.emit(ToolCallStartedEvent(event.index))
        elif isinstance(event, ToolCallArgumentsDelta):
            ctx.emit(ToolCallDeltaEvent(event.index, event.delta))
        elif isinstance(event, ToolCallFinished):
            ctx.emit(
                ToolCallParsedEvent(
                    index=event.index,
                    name=event.call.name if event.call else None,
                    arguments=event.call.arguments if event.call else None,
                    error=event.error.message if event.error else None,
                )
            )
