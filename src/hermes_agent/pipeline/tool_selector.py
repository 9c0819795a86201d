"""Stage 3 — ToolSelector: decide which of the model's calls may run, and with what arguments.

For each call, in order: does the tool exist (404, with the real names) and is it visible to this
run (404)? Is it available — if not, is there a ``fallback`` tool to call instead (404 if
neither)? Do the arguments pass the schema (400, with the exact errors)? Is the tool within its
rate limit (429)? Does it need approval, and was it given (403)? A block that could not be parsed
at all is refused the same way (400). Every refusal is a result the model reads.
"""

from __future__ import annotations

import inspect
from typing import Any

from hermes_agent.events import PlannedCallView, RefusedCallView, SelectionEvent
from hermes_agent.pipeline.context import PlannedCall, RunContext, error_result
from hermes_agent.pipeline.status import Status
from hermes_agent.tools.registry import Tool, find_tool
from hermes_agent.types import ToolCall, ToolResult


class ToolSelector:
    name = "ToolSelector"

    async def run(self, ctx: RunContext) -> RunContext:
        ctx.planned = []
        ctx.rejected = []
        for position, call in enumerate(ctx.completion.tool_calls):
            refusal = await self._select(ctx, call)
            if refusal is not None:
                ctx.rejected.append((position, refusal))
        offset = len(ctx.completion.tool_calls)
        for position, error in enumerate(ctx.completion.errors, start=offset):
            message = f"could not parse your tool call: {error.message}"
            refused = error_result("", "invalid_tool_call", Status.INVALID, message)
            ctx.rejected.append((position, refused))

        if ctx.planned:
            ctx.unusable_turns = 0
        elif ctx.rejected:
            ctx.unusable_turns += 1
        status = _stage_status(len(ctx.planned), len(ctx.rejected))
        ctx.log_stage(
            self.name,
            status,
            planned=[p.call.name for p in ctx.planned],
            rejected=[(r.name, r.status_code) for _, r in ctx.rejected],
        )
        if ctx.listening:
            ctx.emit(
                SelectionEvent(
                    status=int(status),
                    planned=[PlannedCallView(p.tool.name, p.arguments) for p in ctx.planned],
                    rejected=[
                        RefusedCallView(r.name, r.status_code, r.error) for _, r in ctx.rejected
                    ],
                )
            )
        return ctx

    async def _select(self, ctx: RunContext, call: ToolCall) -> ToolResult | None:
        tool = find_tool(ctx.tools, call.name)
        if tool is None:
            available = ", ".join(ctx.tools) or "(none)"
            where = (
                "is not available in this session"
                if call.name in ctx.all_tool_names
                else "does not exist"
            )
            message = f"tool '{call.name}' {where}; available tools: {available}"
            return error_result(call.id, call.name, Status.UNKNOWN_TOOL, message)

        fallback_for = None
        if not tool.available():
            substitute = find_tool(ctx.tools, tool.fallback) if tool.fallback else None
            if substitute is None or not substitute.available():
                message = (
                    f"tool '{tool.name}' is unavailable right now and has no working fallback; "
                    "answer without it"
                )
                return error_result(call.id, call.name, Status.UNKNOWN_TOOL, message)
            fallback_for, tool = tool.name, substitute

        arguments, errors = tool.validate(call.arguments)
        if errors:
            message = (
                "invalid arguments: "
                + "; ".join(errors)
                + ". Call the tool again with fixed arguments."
            )
            return error_result(call.id, tool.name, Status.INVALID, message)

        if not ctx.dry_run and not ctx.runtime.admit(tool):
            message = (
                f"tool '{tool.name}' is rate-limited ({tool.rate_limit} calls per minute); "
                "wait before calling it again, or answer without it"
            )
            return error_result(call.id, tool.name, Status.RATE_LIMITED, message)

        if tool.requires_approval and not ctx.dry_run:
            approved, reason = await _ask(ctx, call, tool, arguments)
            ctx.approvals.append(
                {"tool": tool.name, "arguments": arguments, "approved": approved, "reason": reason}
            )
            if not approved:
                message = (
                    f"the call to '{tool.name}' needs approval and was denied ({reason}); "
                    "tell the user it was not done"
                )
                return error_result(call.id, tool.name, Status.DENIED, message)

        ctx.planned.append(PlannedCall(call, tool, arguments, fallback_for))
        return None


async def _ask(
    ctx: RunContext, call: ToolCall, tool: Tool, arguments: dict[str, Any]
) -> tuple[bool, str]:
    if ctx.approver is None:
        return False, "no approver is configured, so calls that need approval are denied"
    proposed = ToolCall(name=tool.name, arguments=arguments, id=call.id)
    try:
        answer = ctx.approver(proposed, tool)
        if inspect.isawaitable(answer):
            answer = await answer
    except Exception as exc:
        return False, f"the approver failed: {type(exc).__name__}: {exc}"
    if isinstance(answer, tuple):
        return bool(answer[0]), str(answer[1])
    return bool(answer), "approved" if answer else "denied by the approver"


def _stage_status(planned: int, rejected: int) -> Status:
    if rejected == 0:
        return Status.OK
    return Status.PARTIAL if planned else Status.INVALID
