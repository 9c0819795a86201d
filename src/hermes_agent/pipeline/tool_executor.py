"""Stage 4 — ToolExecutor: run the selected calls and feed their results back to the model.

Calls of one turn run concurrently (bounded by ``max_concurrency``). Sync tools run in the
agent's thread pool so they never block the event loop. A tool that raises becomes a 500 result
and one that runs past its timeout a 408 result — the model sees what happened and the run goes
on. (A thread cannot be killed: a timed-out sync tool finishes in the background and its result
is discarded.)
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Future
from typing import Any

from hermes_agent.pipeline.context import PlannedCall, RunContext
from hermes_agent.pipeline.status import Status
from hermes_agent.types import Message, ToolCallRecord, ToolResult

_SPIN_YIELDS = 64


class ToolExecutor:
    name = "ToolExecutor"

    async def run(self, ctx: RunContext) -> RunContext:
        started = time.perf_counter_ns()
        results: list[tuple[int, ToolResult]] = list(ctx.rejected)
        if ctx.planned:
            executed = await self._execute_all(ctx)
            positions = [ctx.completion.tool_calls.index(p.call) for p in ctx.planned]
            results.extend(zip(positions, executed, strict=True))
        results.sort(key=lambda pair: pair[0])
        ordered = [result for _, result in results]

        planned_by_id = {p.call.id: p for p in ctx.planned}
        for result in ordered:
            plan = planned_by_id.get(result.call_id)
            arguments = plan.arguments if plan else _original_arguments(ctx, result)
            ctx.tool_calls.append(
                ToolCallRecord(
                    name=result.name,
                    arguments=arguments,
                    result=result.content,
                    status_code=result.status_code,
                    error=result.error,
                    id=result.call_id,
                )
            )
        if ordered:
            ctx.add_message(Message("tool", tool_results=ordered))

        failed = [r for r in ordered if r.error is not None]
        status = Status.OK
        if failed:
            status = Status.PARTIAL if len(failed) < len(ordered) else Status(failed[0].status_code)
        step = ctx.steps[-1]
        step.tool_calls = ctx.tool_calls[len(ctx.tool_calls) - len(ordered) :]
        step.status_code = int(status)
        step.duration_ms += (time.perf_counter_ns() - started) / 1e6
        ctx.log_stage(self.name, status, results=[(r.name, r.status_code) for r in ordered])
        ctx.emit(
            "tool_results",
            status=int(status),
            results=[
                {"name": r.name, "status": r.status_code, "content": r.content} for r in ordered
            ],
        )
        return ctx

    async def _execute_all(self, ctx: RunContext) -> list[ToolResult]:
        if len(ctx.planned) == 1:
            return [await _execute(ctx, ctx.planned[0])]
        gate = asyncio.Semaphore(ctx.limits.max_concurrency)

        async def bounded(plan: PlannedCall) -> ToolResult:
            async with gate:
                return await _execute(ctx, plan)

        return list(await asyncio.gather(*(bounded(plan) for plan in ctx.planned)))


async def _execute(ctx: RunContext, plan: PlannedCall) -> ToolResult:
    tool, call = plan.tool, plan.call
    timeout = tool.timeout if tool.timeout is not None else ctx.limits.default_timeout
    try:
        async with asyncio.timeout(timeout):
            if tool.is_async:
                value = await tool.function(**plan.arguments)
            else:
                value = await _in_thread(ctx.executor.submit(tool.function, **plan.arguments))
    except TimeoutError:
        message = f"tool '{tool.name}' timed out after {timeout:g} s"
        return _failure(call.id, tool.name, Status.TIMEOUT, message)
    except Exception as exc:  # a tool's failure is a result for the model, never a crash
        message = f"tool '{tool.name}' raised {type(exc).__name__}: {exc}"
        return _failure(call.id, tool.name, Status.TOOL_ERROR, message)
    return ToolResult(call_id=call.id, name=tool.name, content=value)


async def _in_thread(future: Future[Any]) -> Any:
    """Wait for a sync tool running in the thread pool.

    Most tools return within microseconds, and waking the event loop from another thread costs
    far more than that on some machines (the self-pipe round trip measured 50-120 µs). So the
    loop first yields a few times — other tasks keep running — and only then sleeps until the
    thread wakes it.
    """
    for _ in range(_SPIN_YIELDS):
        if future.done():
            return future.result()
        await asyncio.sleep(0)
    return await asyncio.wrap_future(future)


def _failure(call_id: str, name: str, status: Status, message: str) -> ToolResult:
    return ToolResult(
        call_id=call_id,
        name=name,
        content={"error": message, "status": int(status)},
        status_code=int(status),
        error=message,
    )


def _original_arguments(ctx: RunContext, result: ToolResult) -> dict[str, Any]:
    for call in ctx.completion.tool_calls:
        if call.id == result.call_id:
            return call.arguments
    return {}
