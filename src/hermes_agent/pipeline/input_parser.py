"""Stage 1 — InputParser: check the user's message, load the session's history (a summary of old
turns, then the recent ones; see ``memory.history``) and lay out the conversation for the model."""

from __future__ import annotations

from hermes_agent.events import InputEvent
from hermes_agent.pipeline.context import RunContext
from hermes_agent.pipeline.status import Status
from hermes_agent.types import Message

MAX_MESSAGE_CHARS = 100_000


class InputParser:
    name = "InputParser"

    async def run(self, ctx: RunContext) -> RunContext:
        problem = _problem_with(ctx.user_message)
        if problem:
            ctx.fail(Status.INVALID, problem)
            ctx.output = problem
            ctx.log_stage(self.name, Status.INVALID, error=problem)
            return ctx
        if ctx.load_history is not None:
            loaded = await ctx.load_history()
            ctx.history = loaded.messages
            ctx.summary_call = loaded.summary_call
            ctx.usage.add(loaded.usage)
        if ctx.system_prompt:
            ctx.messages.append(Message("system", ctx.system_prompt))
        ctx.messages.extend(ctx.history)
        ctx.add_message(Message("user", ctx.user_message))
        ctx.tool_specs = [tool.spec() for tool in ctx.tools.values()]
        ctx.log_stage(self.name, Status.OK, history_messages=len(ctx.history))
        ctx.emit(InputEvent(status=int(Status.OK), request_id=ctx.request_id))
        return ctx


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
