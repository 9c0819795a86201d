"""Stage 4 — ToolExecutor: run the selected calls and feed their results back to the model.

Calls of one turn run concurrently (bounded by ``max_concurrency``). An ``in_process`` sync tool
runs on one of the agent's tool threads so it never blocks the event loop; a ``subprocess`` tool
runs in a pooled worker process that is killed on timeout. A tool that raises becomes a 500 result
and one that runs past its timeout a 408 result — the model sees what happened and the run goes
on. Only the executor's own deadline is a 408: a tool that raises ``TimeoutError`` itself (its
database timed out, ``socket.timeout``) failed, and its message is what the model reads (500).
In-process code cannot be killed: a sync tool that hangs keeps its thread (at most
``max_concurrent`` per tool; the thread stops counting against the others), and an async tool
that ignores cancellation is abandoned after a short grace. Hang-prone or untrusted tools belong
in ``subprocess`` mode.

Before anything runs, a call that a ``pre_execution`` hook changed is checked again (schema,
visibility, approval), and each call is counted against its tool's ``rate_limit`` (429 beyond it)
— a cache hit is not, since it does not reach the tool.

Arguments are JSON until the call: then a parameter annotated with a pydantic model, a dataclass
(or ``datetime``, ``Enum``...) gets an instance (``Tool.convert``); a value its validators refuse
makes the call a 400 result. A subprocess tool converts them in its worker, since only JSON
crosses into it (they are checked here first, so a refusal is a 400 there too).

Every result reaches the model in one shape, and only what the model can act on::

    {"status": "success" | "error", "data": ..., "error": ...}

The ``error`` the model reads of a call that failed (the tool raised: 500) or ran past its
timeout (408) ends with what to do next — retry if it looks temporary, use another tool, or
tell the user it failed (``protocol.prompts.TOOL_FAILURE_GUIDANCE``); the caller's
``ToolCallRecord.error`` keeps the bare error.

Every result is bounded the moment the tool returns it: one longer than the agent's
``max_result_chars`` (100,000 characters of JSON by default; a tool's own, when larger) is cut,
with a note saying so and how long it was, before it is cached, journaled, recorded, put in an
event or sent to the model — none of them ever holds the whole of it (nor of a tool's error
message). A tool's own smaller ``max_result_chars`` cuts what the model reads further; the
caller's ``ToolCallRecord.result`` keeps up to the agent's bound. Identical calls within a
tool's ``cache_ttl`` reuse the earlier result. How long a call took, whether it came from the
cache, was cut (and from how many characters) or went to a fallback is in its
``ToolCallRecord.metadata`` (``execution_time_ms``, ``cache_hit``, ``truncated``,
``result_chars``, ``fallback_for``), not in the prompt: it costs tokens and small models
misread it.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any

from hermes_agent.events import ToolOutcomeView, ToolResultsEvent
from hermes_agent.pipeline.context import PlannedCall, RunContext, error_result
from hermes_agent.pipeline.journal import (
    CallKey,
    FencedJournal,
    reset_current_call,
    set_current_call,
)
from hermes_agent.pipeline.status import Status
from hermes_agent.pipeline.tool_selector import rate_limited, recheck
from hermes_agent.pipeline.watch import AbandonedCall, current_watch
from hermes_agent.protocol.chatml import to_json
from hermes_agent.protocol.prompts import TOOL_FAILURE_GUIDANCE
from hermes_agent.stages import StageName
from hermes_agent.tools.runtime import private_copy, stop_watching, watch_asking
from hermes_agent.tools.sandbox import ToolProcessError
from hermes_agent.types import Message, ToolCallRecord, ToolResult


class ToolExecutor:
    name = StageName.TOOL_EXECUTOR

    async def run(self, ctx: RunContext) -> RunContext:
        started = time.perf_counter_ns()
        results: list[tuple[int, ToolResult]] = list(ctx.rejected)
        records: dict[int, ToolCallRecord] = {}
        if ctx.planned:
            runnable: list[PlannedCall] = []
            for plan in ctx.planned:
                refusal = await recheck(ctx, plan) if ctx.plan_changed(plan) else None
                if refusal is None:
                    runnable.append(plan)
                else:
                    results.append((plan.position, refusal))
            ctx.planned = runnable
            executed = await self._execute_all(ctx)
            for plan, (result, record) in zip(ctx.planned, executed, strict=True):
                results.append((plan.position, result))
                records[plan.position] = record
        results.sort(key=lambda pair: pair[0])
        ordered = [result for _, result in results]

        calls = ctx.completion.tool_calls
        for position, result in results:
            record = records.get(position) or ToolCallRecord(
                name=result.name,
                arguments=calls[position].arguments if position < len(calls) else {},
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
        if not ctx.planned:
            return []
        if len(ctx.planned) == 1:
            return [await _execute(ctx, ctx.planned[0])]
        gate = asyncio.Semaphore(ctx.limits.max_concurrency)

        async def bounded(plan: PlannedCall) -> tuple[ToolResult, ToolCallRecord]:
            async with gate:
                return await _execute(ctx, plan)

        tasks = [asyncio.ensure_future(bounded(plan)) for plan in ctx.planned]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            # A call that could not go on (its journal lost the run or its store): the
            # attempt ends here, and its other calls with it — none starts after this.
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise


async def _execute(ctx: RunContext, plan: PlannedCall) -> tuple[ToolResult, ToolCallRecord]:
    tool, call = plan.tool, plan.call
    timeout = tool.timeout if tool.timeout is not None else ctx.limits.default_timeout
    started = time.perf_counter()
    fencing = ctx.journal.fencing_token if isinstance(ctx.journal, FencedJournal) else None
    key = CallKey(ctx.request_id, ctx.step, plan.position, fencing)
    journaled = None
    if ctx.journal is not None:  # a durable run: this call may have run in an earlier attempt
        journaled = await ctx.journal.call_started(key, tool.name, plan.arguments, tool.idempotent)
    hit, value = False, None
    error: tuple[Status, str] | None = None
    shown = ctx.runtime.result_limit(tool)  # what the model reads
    kept = max(shown, ctx.runtime.max_result_chars)  # what the record, store and cache keep
    cut: int | None = None
    if journaled is not None:
        # Bounded when it was journaled; a value journaled before results had a bound is cut
        # here (the slack lets a value cut then, note and all, through unchanged).
        value, cut = _bounded(journaled.value, kept + _NOTE_ROOM)
        if journaled.kind == "interrupted":
            error = (
                Status.INTERNAL_ERROR,
                f"tool '{tool.name}' was interrupted: it started in an earlier attempt of this "
                "run and its outcome is unknown, so it was not run again (it is not declared "
                "idempotent); check whether it took effect before calling it again",
            )
        elif journaled.error is not None:
            error = (Status(journaled.status_code), journaled.error)
    else:
        hit, value = ctx.runtime.cached(tool, plan.arguments)
        if not hit:
            token, (asked, watching) = set_current_call(key), watch_asking()
            try:
                value, error = await _run(ctx, plan, timeout)
            finally:
                stop_watching(watching)
                reset_current_call(token)
            # Bounded at once: the cache, the journal, the trail, the events and the model
            # only ever see this; the whole value goes with the last reference to it.
            value, cut = _bounded(value, kept)
            if error is not None:
                error = (error[0], _bounded_text(error[1], shown))
            elif not asked:  # a call that asked its caller returned that caller's own
                ctx.runtime.remember(tool, plan.arguments, value)
        if ctx.journal is not None:
            code, message = (int(error[0]), error[1]) if error is not None else (200, None)
            await ctx.journal.call_finished(key, value, code, message)

    metadata: dict[str, Any] = {
        "tool_name": tool.name,
        "execution_time_ms": round((time.perf_counter() - started) * 1000, 3),
        "cache_hit": hit,
        "call_key": key.id,
    }
    if journaled is not None:
        metadata["journal"] = journaled.kind
    if plan.fallback_for:
        metadata["fallback_for"] = plan.fallback_for
    data = value
    if shown < kept:  # the tool's own bound: the model reads less than the record keeps
        data, cut = _bounded(value, shown) if cut is None else (_cut(value, shown, cut), cut)
    if cut is not None:
        metadata["truncated"], metadata["result_chars"] = True, cut
    if error is not None:
        told = error[1]
        interrupted = journaled is not None and journaled.kind == "interrupted"
        if error[0] in (Status.INTERNAL_ERROR, Status.TIMEOUT) and not interrupted:
            # What to do next, after what went wrong (the caller's record keeps the error bare).
            told = f"{told.rstrip('. ')}. {TOOL_FAILURE_GUIDANCE}"
        result = error_result(call.id, tool.name, error[0], told)
        record = ToolCallRecord(
            tool.name, plan.arguments, None, int(error[0]), error[1], call.id, metadata
        )
        return result, record

    envelope = {"status": "success", "data": data, "error": None}
    result = ToolResult(call_id=call.id, name=tool.name, content=envelope)
    record = ToolCallRecord(tool.name, plan.arguments, value, 200, None, call.id, metadata)
    return result, record


async def _run(
    ctx: RunContext, plan: PlannedCall, timeout: float
) -> tuple[Any, tuple[Status, str] | None]:
    """Convert, admit and run a call the cache did not answer: ``(value, None)``, or
    ``(None, (status, message))`` when it was refused or failed."""
    tool = plan.tool
    arguments, problems = tool.convert(private_copy(plan.arguments))
    if problems:  # refused before it ran: not counted against the rate limit
        message = "invalid arguments: " + "; ".join(problems)
        return None, (Status.INVALID, f"{message}. Call the tool again with fixed arguments.")
    if not ctx.runtime.admit(tool):
        return None, (Status.RATE_LIMITED, rate_limited(plan.call.id, tool).error or "")
    try:
        value = await _call(ctx, plan, arguments, timeout)
    except _DeadlinePassed:
        return None, (Status.TIMEOUT, f"tool '{tool.name}' timed out after {timeout:g} s")
    except ToolProcessError as exc:
        return None, (Status.INTERNAL_ERROR, f"tool '{tool.name}' failed in its process: {exc}")
    except Exception as exc:  # a tool's failure is a result for the model, never a crash
        said = str(exc)
        return None, (
            Status.INTERNAL_ERROR,
            f"tool '{tool.name}' raised {type(exc).__name__}" + (f": {said}" if said else ""),
        )
    return value, None


class _DeadlinePassed(Exception):
    """The executor's own deadline for a call passed (408). Kept apart from ``TimeoutError``,
    which a tool may raise itself (its database timed out): that is the tool's failure."""


async def _call(
    ctx: RunContext, plan: PlannedCall, arguments: dict[str, Any], timeout: float
) -> Any:
    """Call the tool with ``arguments`` (a private copy, converted to what its annotations
    name) in its execution mode; ``_DeadlinePassed`` when it runs past ``timeout``."""
    tool = plan.tool
    if tool.execution_mode == "subprocess":
        # Only JSON crosses into the worker, which converts the arguments itself
        # (``Tool.json_function``). The pool enforces the timeout (and kills the process),
        # and kills the worker at once when this run is cancelled. The tool's own exceptions
        # come back as ``ToolProcessError``, so a ``TimeoutError`` here is the pool's deadline.
        try:
            return await ctx.runtime.pool(tool).acall(plan.arguments, timeout, ctx.executor)
        except TimeoutError as exc:
            raise _DeadlinePassed(str(exc)) from None
    if tool.execution_mode == "inline":
        return tool.function(**arguments)  # opted in: fast and pure, no thread hop
    if tool.is_async:
        return await _bounded_task(tool.function(**arguments), timeout)
    # The tool's thread sees this task's context (``current_call()`` among it).
    future = ctx.runtime.run_in_thread(tool, arguments, contextvars.copy_context())
    deadline = asyncio.timeout(timeout)
    try:
        async with deadline:
            return await _in_thread(future)
    except asyncio.CancelledError:  # nobody waits for this call any more
        ctx.runtime.write_off(future)
        watch = current_watch()
        if watch is not None and not future.done():  # it runs on: the engine says so
            watch.abandoned.append(AbandonedCall(tool.name, plan.call.id, ctx.step, future))
        raise
    except TimeoutError:
        if not deadline.expired():
            raise  # the tool raised it: its own failure, with its own message
        ctx.runtime.write_off(future)
        raise _DeadlinePassed from None


CANCEL_GRACE = 0.5
"""Seconds an async tool gets to finish after it is cancelled; then it is abandoned."""


async def _bounded_task(coroutine: Coroutine[Any, Any, Any], timeout: float) -> Any:
    """Await an async tool for at most ``timeout`` seconds (plus ``CANCEL_GRACE``).

    ``asyncio.timeout`` alone waits as long as the tool likes when it catches the cancellation
    and carries on; here such a task is left behind (still cancelled, never awaited again) and
    the call is a timeout like any other.
    """
    task = asyncio.ensure_future(coroutine)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if not done:
            task.cancel()
            await asyncio.wait({task}, timeout=CANCEL_GRACE)
            # Whether it stopped within the grace or is abandoned now, the call timed out;
            # whatever it ends with comes too late to be its result.
            task.add_done_callback(_forget)
            raise _DeadlinePassed
    except asyncio.CancelledError:
        task.cancel()  # the run itself was cancelled: do not leave the tool running
        task.add_done_callback(_forget)
        raise
    return task.result()  # a TimeoutError the tool raised itself is its own failure


def _forget(task: asyncio.Future[Any]) -> None:
    """Retrieve an abandoned task's outcome so asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()


async def _in_thread(future: Future[Any]) -> Any:
    """Wait for work running on another thread without blocking the event loop."""
    return await asyncio.wrap_future(future)


_NOTE_ROOM = 200
"""More than the note ``_bounded`` adds to a result it cuts is long."""


def _bounded(value: Any, limit: int) -> tuple[Any, int | None]:
    """``(value, None)`` when its JSON is at most ``limit`` characters; else that JSON cut to
    ``limit`` with a note the model will read, and how many characters it had. A string is
    measured and cut as it is (a huge one is never copied whole); anything else is encoded
    once."""
    text = value if isinstance(value, str) else to_json(value)
    size = len(text)
    if size <= limit:
        return value, None
    return _cut(text, limit, size), size


def _bounded_text(text: str, limit: int) -> str:
    return text if len(text) <= limit else _cut(text, limit, len(text))


def _cut(text: str, limit: int, size: int) -> str:
    return (
        f"{text[:limit]}… [truncated: the result has {size:,} characters, "
        f"only the first {limit:,} are shown]"
    )
