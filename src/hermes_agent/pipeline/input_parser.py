"""Stage 1 — InputParser: check the user's message, load the session's history (a summary of old
turns, then the recent ones; see ``memory.history``) and lay out the conversation for the model.

A caller's own tools (``pipeline.client_tools``) join the run's tools here, and a run that
continues after the caller ran them starts from their results instead of a user message —
results that must answer the calls the session's last turn holds, each once, and no other
(a caller cannot make up a call the model never made).

The run's own instructions join the system prompt here: the JSON-mode schema of a structured
answer (``output_type``) and the explain-mode request for a reason with each turn."""

from __future__ import annotations

from collections.abc import Sequence

from hermes_agent.events import InputEvent
from hermes_agent.pipeline.client_tools import take_up
from hermes_agent.pipeline.context import RunContext, run_instructions, system_turn
from hermes_agent.pipeline.status import Status
from hermes_agent.stages import StageName
from hermes_agent.tools.search import narrowed
from hermes_agent.types import Message, ToolResult

MAX_MESSAGE_CHARS = 100_000


class InputParser:
    name = StageName.INPUT_PARSER

    async def run(self, ctx: RunContext) -> RunContext:
        problem = _problem_with(ctx.user_message)
        if problem:
            ctx.fail(Status.INVALID, problem)
            ctx.output = problem
            ctx.log_stage(self.name, Status.INVALID, error=problem)
            return ctx
        turn = ctx.client
        problem = take_up(ctx, turn) if turn is not None else None
        if problem:
            ctx.fail(Status.INVALID, problem)
            ctx.output = problem
            ctx.log_stage(self.name, Status.INVALID, error=problem)
            return ctx
        await load_history(ctx)
        if turn is not None and turn.results:
            problem = _unasked(ctx.history, turn.results)
            if problem:
                ctx.fail(Status.INVALID, problem)
                ctx.output = problem
                ctx.log_stage(self.name, Status.INVALID, error=problem)
                return ctx
        ctx.prompt_instructions = run_instructions(ctx)
        system = system_turn(ctx.system_prompt, ctx.prompt_instructions)
        if system:
            ctx.messages.append(Message("system", system))
        ctx.messages.extend(ctx.history)
        if turn is not None and turn.results:  # the caller ran the calls: their results
            ctx.add_message(Message("tool", tool_results=list(turn.results)))
        else:
            ctx.add_message(Message("user", ctx.user_message))
        # Every tool's definition, or, past the threshold, a search tool and the few that
        # match the message best (tools.search); every tool stays callable either way.
        search = narrowed(
            ctx.tools,
            ctx.user_message,
            ctx.tool_specs,
            threshold=ctx.limits.tool_search_threshold,
            top_k=ctx.limits.tool_search_top_k,
        )
        if search is not None:
            ctx.tools[search.name] = search
        ctx.log_stage(self.name, Status.OK, history_messages=len(ctx.history))
        ctx.emit(InputEvent(status=int(Status.OK), request_id=ctx.request_id))
        return ctx


async def load_history(ctx: RunContext) -> None:
    """Put the session's history in ``ctx.history`` (once: before the ``pre_input`` hooks
    when there are any, so that they may rewrite it)."""
    if ctx.history_loaded or ctx.load_history is None:
        return
    loaded = await ctx.load_history()
    ctx.history = loaded.messages
    ctx.summary_call = loaded.summary_call
    ctx.count_usage(ctx.model.name, loaded.usage)
    ctx.history_loaded = True


def _problem_with(message: object) -> str | None:
    if not isinstance(message, str):
        return f"the message must be a string, got {type(message).__name__}"
    if not message.strip():
        return "the message is empty; ask a question or give an instruction"
    if len(message) > MAX_MESSAGE_CHARS:
        return (
            f"the message is {len(message):,} characters long, over the limit of "
            f"{MAX_MESSAGE_CHARS:,}; shorten it or pass the data through a tool"
        )
    return None


def _unasked(history: Sequence[Message], results: Sequence[ToolResult]) -> str | None:
    """Why ``results`` are not the answers to the calls of the history's last turn (the
    calls a run handed out to its caller), or ``None`` when they are: each call answered
    once, under its own tool's name."""
    last = history[-1] if history else None
    asked = {c.id: c.name for c in last.tool_calls} if last and last.role == "assistant" else {}
    given = [r.call_id for r in results]
    stray = sorted({r.call_id for r in results if asked.get(r.call_id) != r.name})
    if not stray and len(set(given)) == len(given) and set(given) == set(asked):
        return None
    if not asked:
        return (
            "tool results were sent, but the session's last turn made no tool calls: results "
            "answer the calls a run handed out, in that run's session"
        )
    what = (
        f"calls {', '.join(map(repr, stray))} are not among them"
        if stray
        else "each call must be answered once"
    )
    return (
        f"the tool results must answer the calls the session's last turn made "
        f"({', '.join(map(repr, sorted(asked)))}): {what}"
    )
