"""Stage 4 — ToolExecutor: run the selected calls and feed their results back to the model.

Calls of one turn run concurrently (bounded by ``max_concurrency``). An ``in_process`` sync tool
runs in the agent's thread pool so it never blocks the event loop; a ``subprocess`` tool runs in
a pooled worker process that is killed on timeout. A tool that raises becomes a 500 result and
one that runs past its timeout a 408 result — the model sees what happened and the run goes on.

Every result reaches the model in one shape::

    {"status": "success" | "error", "data": ..., "error": ...,
     "metadata": {"tool_name", "execution_time_ms", "cache_hit", ...}}

Results longer than the tool's ``max_result_chars`` are cut, with a note saying so; identical
calls within a tool's ``cache_ttl`` reuse the earlier result (``cache_hit: true``).
"""

from __future__ import annotations

import asyncio
import copy
import time
from concurrent.futures import Future
from typing import Any

from hermes_agent.events import ToolOutcomeView, ToolResultsEvent
from hermes_agent.pipeline.context import PlannedCall, RunContext, error_result
from hermes_agent.pipeline.status import Status
from hermes_agent.protocol.chatml import to_json
from hermes_agent.tools.sandbox import ToolProcessError
from hermes_agent.types import Message, ToolCallRecord, ToolResult


class ToolExecutor:
    name = "ToolExecutor"

    async def run(self, ctx: RunContext) -> RunContext:
        started = time.perf_counter_ns()
        results: list[tuple[int, ToolResult]] = list(ctx.rejected)
        records: dict[str, ToolCallRecord] = {}
        if ctx.planned:
            executed = await self._execute_all(ctx)
            for plan, (result, record) in zip(ctx.planned, executed, strict=True):
                results.append((ctx.completion.tool_calls.index(plan.call), result))
                records[result.call_id] = record
        results.sort(key=lambda pair: pair[0])
        ordered = [result for _, result in results]

        for result in ordered:
            record = records.get(result.call_id) or ToolCallRecord(
                name=result.name,
                arguments=_original_arguments(ctx, result),
                result=None,
                status_code=result.status_code,
                error=result.error,
                id=result.call_id,
            )
            ctx.tool_calls.append(record)
        ctx.last_results = ordered
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
        if ctx.listening:
            ctx.emit(
                ToolResultsEvent(
                    status=int(status),
                    results=[ToolOutcomeView(r.name, r.status_code, r.content) for r in ordered],
                )
            )
        return ctx

    async def _execute_all(self, ctx: RunContext) -> list[tuple[ToolResult, ToolCallRecord]]:
        if len(ctx.planned) == 1:
            return [await _execute(ctx, ctx.planned[0])]
        gate = asyncio.Semaphore(ctx.limits.max_concurrency)

        async def bounded(plan: PlannedCall) -> tuple[ToolResult, ToolCallRecord]:
            async with gate:
                return await _execute(ctx, plan)

        return list(await asyncio.gather(*(bounded(plan) for plan in ctx.planned)))


async def _execute(ctx: RunContext, plan: PlannedCall) -> tuple[ToolResult, ToolCallRecord]:
    tool, call = plan.tool, plan.call
    timeout = tool.timeout if tool.timeout is not None else ctx.limits.default_timeout
    started = time.perf_counter()
    hit, value = ctx.runtime.cached(tool, plan.arguments)
    error: tuple[Status, str] | None = None
    if not hit:
        try:
            value = await _call(ctx, plan, timeout)
        except TimeoutError:
            error = (Status.TIMEOUT, f"tool '{tool.name}' timed out after {timeout:g} s")
        except ToolProcessError as exc:
            error = (Status.TOOL_ERROR, f"tool '{tool.name}' failed in its process: {exc}")
        except Exception as exc:  # a tool's failure is a result for the model, never a crash
            error = (Status.TOOL_ERROR, f"tool '{tool.name}' raised {type(exc).__name__}: {exc}")
        else:
            ctx.runtime.remember(tool, plan.arguments, value)

    metadata: dict[str, Any] = {
        "tool_name": tool.name,
        "execution_time_ms": round((time.perf_counter() - started) * 1000, 3),
        "cache_hit": hit,
    }
    if plan.fallback_for:
        metadata["fallback_for"] = plan.fallback_for
    if error is not None:
        result = error_result(call.id, tool.name, error[0], error[1])
        result.content["metadata"].update(metadata)
        record = ToolCallRecord(
            tool.name, plan.arguments, None, int(error[0]), error[1], call.id, metadata
        )
        return result, record

    data = _truncated(value, tool.max_result_chars, metadata)
    envelope = {"status": "success", "data": data, "error": None, "metadata": metadata}
    result = ToolResult(call_id=call.id, name=tool.name, content=envelope)
    record = ToolCallRecord(tool.name, plan.arguments, value, 200, None, call.id, metadata)
    return result, record


async def _call(ctx: RunContext, plan: PlannedCall, timeout: float) -> Any:
    tool = plan.tool
    arguments = _private_copy(plan.arguments)
    if tool.execution_mode == "subprocess":
        # The worker enforces the timeout itself (and kills the process); the outer bound
        # only guards against a pool that cannot even start a worker.
        pool = ctx.runtime.pool(tool)
        future = ctx.executor.submit(pool.call, arguments, timeout)
        async with asyncio.timeout(timeout + 5):
            return await _in_thread(future)
    if tool.execution_mode == "inline":
        return tool.function(**arguments)  # opted in: fast and pure, no thread hop
    async with asyncio.timeout(timeout):
        if tool.is_async:
            return await tool.function(**arguments)
        return await _in_thread(ctx.executor.submit(tool.function, **arguments))


_IMMUTABLE = (str, int, float, bool, type(None))


def _private_copy(arguments: dict[str, Any]) -> dict[str, Any]:
    """The tool gets its own copy, so a tool that mutates a list it was given cannot rewrite
    the arguments the RunResult and the trail report (deep only when a value is mutable)."""
    if all(isinstance(value, _IMMUTABLE) for value in arguments.values()):
        return dict(arguments)
    return copy.deepcopy(arguments)


async def _in_thread(future: Future[Any]) -> Any:
    """Wait for work running in the thread pool without blocking the event loop."""
    return await asyncio.wrap_future(future)


def _truncated(value: Any, limit: int | None, metadata: dict[str, Any]) -> Any:
    """The value, or its JSON cut to ``limit`` characters with a note the model will read."""
    if limit is None:
        return value
    text = value if isinstance(value, str) else to_json(value)
    if len(text) <= limit:
        return value
    metadata["truncated"] = True
    return (
        f"{text[:limit]}… [truncated: the result has {len(text):,} characters, "
        f"only the first {limit:,} are shown]"
    )


def _original_arguments(ctx: RunContext, result: ToolResult) -> dict[str, Any]:
    for call in ctx.completion.tool_calls:
        if call.id == result.call_id:
            return call.arguments
    return {}
