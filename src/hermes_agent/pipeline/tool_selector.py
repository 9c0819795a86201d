"""Stage 3 — ToolSelector: decide which of the model's calls may run, and with what arguments.

For each call, in order: is it within the turn's ``max_calls_per_turn`` (429 beyond it)? Does
the tool exist (404, with the real names) and is it visible to this run (404)? Is it available —
if not, is there a ``fallback`` tool to call instead (404 if neither)? Do the arguments pass the
schema (400, with the exact errors)? Is the tool within its rate limit (429)? Does it need
approval (its tool says so, or the model wrote it inside its thought under the thought policy
``ask``: ``ToolCall.needs_approval``), and was it given (403)? A block that could not be
parsed at all is refused the same way (400). Every refusal is a result the model reads.

A call written as Qwen3-style XML (``ToolCall.text_arguments``) has only text values, and only
the tool's schema says what they are: before the schema check, a value whose property allows a
string stays text, and any other is decoded (JSON, read as leniently as a ``<tool_call>``
block) and must be of a type the property allows — else a 400 that names the parameter, what
it holds and how to write it.

A call counts against its tool's rate limit only when it is about to run (the ToolExecutor
counts it), so refused calls do not use the limit up. An approver approves with ``True`` or
``(True, reason)`` only; any other answer is a denial that names the answer; an identical call
approved earlier in the run is not asked again. A call that a ``pre_execution`` hook changes
after this stage is checked again by ``recheck``. Turns whose calls the approver refused are
counted (``RunContext.denied_turns``), so a run they stop ends with 403, not as the model's
fault.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import reprlib
from typing import Any

from hermes_agent.errors import is_store_error
from hermes_agent.events import PlannedCallView, RefusedCallView, SelectionEvent
from hermes_agent.pipeline.context import PlannedCall, RunContext, error_result
from hermes_agent.pipeline.journal import CallKey
from hermes_agent.pipeline.status import Status
from hermes_agent.protocol.parser import decode_value
from hermes_agent.stages import StageName
from hermes_agent.tools.registry import Tool, find_tool
from hermes_agent.tools.runtime import private_copy
from hermes_agent.tools.validation import caller_argument_errors, non_finite_errors
from hermes_agent.types import ToolCall, ToolResult


class ToolSelector:
    name = StageName.TOOL_SELECTOR

    async def run(self, ctx: RunContext) -> RunContext:
        ctx.planned = []
        ctx.rejected = []
        calls = ctx.completion.tool_calls
        cap = ctx.limits.max_calls_per_turn
        for position, call in enumerate(calls[:cap]):
            refusal = await self._select(ctx, call, position)
            if refusal is not None:
                ctx.rejected.append((position, refusal))
        if len(calls) > cap:
            message = (
                f"too many tool calls in one turn: at most {cap} calls per turn run, and this "
                f"turn had {len(calls)}; this call did not run. Call the rest in the next turn"
            )
            for position in range(cap, len(calls)):
                call = calls[position]
                refused = error_result(call.id, call.name, Status.RATE_LIMITED, message)
                ctx.rejected.append((position, refused))
        offset = len(calls)
        for position, error in enumerate(ctx.completion.errors, start=offset):
            message = f"could not parse your tool call: {error.message}"
            refused = error_result("", "invalid_tool_call", Status.INVALID, message)
            ctx.rejected.append((position, refused))

        if ctx.planned:
            ctx.unusable_turns = ctx.denied_turns = 0
        elif ctx.rejected:
            ctx.unusable_turns += 1
            # The approver's refusal, not the model, kept this turn from running anything:
            # a run that stops on such turns says so (``loop.stop_unusable``), never 502.
            if any(r.status_code == Status.DENIED for _, r in ctx.rejected):
                ctx.denied_turns += 1
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

    async def _select(self, ctx: RunContext, call: ToolCall, position: int) -> ToolResult | None:
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

        # A call whose outcome an earlier attempt of this durable run journaled is not run
        # again: what holds for the tool now (availability, rate limit) does not refuse it.
        recorded = ctx.journal is not None and ctx.journal.recorded_call(
            CallKey(ctx.request_id, ctx.step, position)
        )
        fallback_for = None
        if not recorded and not tool.available():
            substitute = find_tool(ctx.tools, tool.fallback) if tool.fallback else None
            if substitute is None or not substitute.available():
                return _unavailable(call.id, call.name, tool)
            fallback_for, tool = tool.name, substitute

        if tool.name in ctx.client_tools:
            # The caller's own schema: checked in a worker thread, within its step budget, so a
            # hostile schema holds one thread for a moment, never the loop everyone shares.
            arguments, errors = await asyncio.to_thread(
                check_arguments, tool, call.arguments, text=call.text_arguments, client=True
            )
        else:
            arguments, errors = check_arguments(tool, call.arguments, text=call.text_arguments)
        if errors:
            return _invalid(call.id, tool.name, errors)

        # Only a look: the ToolExecutor counts the call when it runs, so a refused call does
        # not use up the limit. Looking here spares the approver a call that could not run.
        if not ctx.dry_run and not recorded and not ctx.runtime.has_room(tool):
            return rate_limited(call.id, tool)

        # A call the model wrote inside its thought may need approval too (thought_calls: ask).
        if (tool.requires_approval or call.needs_approval) and not ctx.dry_run:
            refusal = await _approve(ctx, call.id, tool, arguments)
            if refusal is not None:
                return refusal

        plan = PlannedCall(call, tool, arguments, fallback_for, position)
        ctx.planned.append(plan)
        ctx.mark_checked(plan)
        return None


async def recheck(ctx: RunContext, plan: PlannedCall) -> ToolResult | None:
    """Check again a plan that a ``pre_execution`` hook changed (``ctx.plan_changed``): the tool
    must still be a visible, available tool (404), the arguments must pass its schema (400), and
    a tool that needs approval is approved again for exactly these arguments (403). On success
    the plan holds the validated arguments and counts as checked; otherwise the refusal."""
    call_id, tool = plan.call.id, plan.tool
    name = getattr(tool, "name", None)
    if not isinstance(tool, Tool) or not isinstance(name, str) or ctx.tools.get(name) is not tool:
        shown = name if isinstance(name, str) else _shown(tool)
        message = (
            f"the call was changed before it ran to tool '{shown}', which is not available "
            f"in this session; available tools: {', '.join(ctx.tools) or '(none)'}"
        )
        return error_result(call_id, str(shown), Status.UNKNOWN_TOOL, message)
    if not tool.available():
        return _unavailable(call_id, tool.name, tool)
    if not isinstance(plan.arguments, dict):
        return _invalid(
            call_id, tool.name, [f"arguments must be an object, got {_shown(plan.arguments)}"]
        )
    if tool.name in ctx.client_tools:
        arguments, errors = await asyncio.to_thread(
            check_arguments, tool, plan.arguments, client=True
        )
    else:
        arguments, errors = tool.validate(plan.arguments)
    if errors:
        return _invalid(call_id, tool.name, errors)
    if tool.requires_approval or plan.call.needs_approval:
        # Always asked: a hook's change is for the approver to see, even where the checked
        # arguments come out as a call approved before.
        refusal = await _approve(ctx, call_id, tool, arguments, reuse=False)
        if refusal is not None:
            return refusal
    if tool is not ctx.checked_tool(plan):
        plan.fallback_for = None  # no longer the fallback the selector chose
    plan.arguments = arguments
    ctx.mark_checked(plan)
    return None


def check_arguments(
    tool: Tool, arguments: dict[str, Any], *, text: bool = False, client: bool = False
) -> tuple[dict[str, Any], list[str]]:
    """(arguments to call with, problems): text values typed first (``text``: a Qwen3-style
    XML call), then the schema check — the tool's own, or for a ``client`` tool the caller's
    schema compiled as such (``tools.validation.caller_argument_errors``: RE2 patterns, a step
    budget)."""
    if text:
        arguments, problems = typed_arguments(arguments, tool.parameters)
        if problems:
            return arguments, problems
    if client:
        errors = non_finite_errors(arguments) or caller_argument_errors(tool.parameters, arguments)
        return arguments, errors
    return tool.validate(arguments)


def typed_arguments(
    arguments: dict[str, Any], schema: dict[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """Text argument values typed by the tool's JSON Schema: (typed arguments, problems).

    A value whose property allows a string, or whose property the schema does not describe,
    stays as it is (the schema check that follows has the last word on it); any other text is
    decoded and must give a type the property allows.

        >>> typed_arguments({"n": "3", "q": "3"}, {"properties": {
        ...     "n": {"type": "integer"}, "q": {"type": "string"}}})
        ({'n': 3, 'q': '3'}, [])
    """
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return dict(arguments), []
    typed: dict[str, Any] = {}
    problems: list[str] = []
    lookups = [_MAX_TYPE_LOOKUPS]
    for key, value in arguments.items():
        allowed = _types_of(properties.get(key), schema, lookups)
        typed[key] = value
        if not isinstance(value, str) or not allowed or "string" in allowed:
            continue
        try:
            decoded = decode_value(value)
        except ValueError:
            decoded = _NOT_DECODED
        if decoded is not _NOT_DECODED and _type_of(decoded) & allowed:
            typed[key] = decoded
            continue
        kinds = " or ".join(sorted(allowed))
        example = ", ".join(_EXAMPLES[t] for t in sorted(allowed) if t in _EXAMPLES)
        problems.append(
            f"parameter '{key}' must be {kinds} (the tool's schema), but it holds "
            f"{_shown(value)}; write the value as JSON, such as {example}"
        )
    return typed, problems


_NOT_DECODED = object()
_JSON_TYPES = frozenset(("string", "integer", "number", "boolean", "object", "array", "null"))
_EXAMPLES = {
    "integer": "3",
    "number": "2.5",
    "boolean": "true",
    "object": '{"key": "value"}',
    "array": '["a", "b"]',
    "null": "null",
}


_MAX_TYPE_LOOKUPS = 2_000
"""How many subschemas typing one call's text values may visit: unions of ``$ref``s to unions
would otherwise multiply at each level (the schema may be a caller's)."""


def _types_of(
    schema: Any, root: dict[str, Any], lookups: list[int], depth: int = 0
) -> frozenset[str]:
    """The JSON types a (sub)schema allows; empty when it does not say (any value), or when
    ``lookups`` is spent."""
    lookups[0] -= 1
    if not isinstance(schema, dict) or depth > 8 or lookups[0] < 0:  # a $ref cycle ends here
        return frozenset()
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return _types_of(_resolve(ref, root), root, lookups, depth + 1)
    declared = schema.get("type")
    if isinstance(declared, str):
        return frozenset((declared,)) & _JSON_TYPES
    if isinstance(declared, list):
        return frozenset(t for t in declared if isinstance(t, str)) & _JSON_TYPES
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list):
            found = [_types_of(branch, root, lookups, depth + 1) for branch in branches]
            # One branch that allows anything makes the whole union allow anything.
            return frozenset().union(*found) if all(found) else frozenset()
    for key in ("enum", "const"):
        if key in schema:
            values = schema[key] if key == "enum" else [schema[key]]
            if isinstance(values, list):
                return frozenset().union(*(_type_of(v) for v in values))
    if isinstance(schema.get("allOf"), list):
        for branch in schema["allOf"]:
            narrowed = _types_of(branch, root, lookups, depth + 1)
            if narrowed:
                return narrowed
    if "properties" in schema:
        return frozenset(("object",))
    if "items" in schema:
        return frozenset(("array",))
    return frozenset()


def _resolve(ref: str, root: dict[str, Any]) -> Any:
    """A local ``$ref`` (``#/$defs/Name``) in the tool's schema; ``None`` for any other."""
    if not ref.startswith("#/"):
        return None
    node: Any = root
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _type_of(value: Any) -> frozenset[str]:
    """The JSON types ``value`` has (an integer is a number too)."""
    if value is None:
        return frozenset(("null",))
    if isinstance(value, bool):
        return frozenset(("boolean",))
    if isinstance(value, int):
        return frozenset(("integer", "number"))
    if isinstance(value, float):
        integral = value.is_integer()
        return frozenset(("integer", "number")) if integral else frozenset(("number",))
    if isinstance(value, str):
        return frozenset(("string",))
    if isinstance(value, list):
        return frozenset(("array",))
    if isinstance(value, dict):
        return frozenset(("object",))
    return frozenset()


def rate_limited(call_id: str, tool: Tool) -> ToolResult:
    """The 429 result of a call beyond its tool's ``rate_limit``."""
    message = (
        f"tool '{tool.name}' is rate-limited ({tool.rate_limit} calls per minute); "
        "wait before calling it again, or answer without it"
    )
    return error_result(call_id, tool.name, Status.RATE_LIMITED, message)


def _unavailable(call_id: str, name: str, tool: Tool) -> ToolResult:
    message = (
        f"tool '{tool.name}' is unavailable right now and has no working fallback; "
        "answer without it"
    )
    return error_result(call_id, name, Status.UNKNOWN_TOOL, message)


def _invalid(call_id: str, name: str, errors: list[str]) -> ToolResult:
    message = (
        "invalid arguments: " + "; ".join(errors) + ". Call the tool again with fixed arguments."
    )
    return error_result(call_id, name, Status.INVALID, message)


async def _approve(
    ctx: RunContext, call_id: str, tool: Tool, arguments: dict[str, Any], *, reuse: bool = True
) -> ToolResult | None:
    """Ask the approver about exactly this tool and these arguments; record the decision with
    what the approver saw. ``None`` when approved, else the 403 result.

    An identical call (the same tool, the same arguments, types included) the approver approved
    in an earlier turn of this run is not asked again (``reuse``): the record says ``reused``.
    Two identical calls of one turn are two effects, so each is asked. A denial is not kept, so
    a call denied once is asked again if the model repeats it."""
    seen = private_copy(arguments)  # the record keeps what was asked, whatever the approver does
    key = approval_key(tool.name, arguments)
    earlier = ctx.approved_calls.get(key) if key is not None and reuse else None
    granted = earlier[1] if earlier is not None and earlier[0] < ctx.step else None
    if granted is not None:
        ctx.approvals.append(
            {"tool": tool.name, "arguments": seen, "approved": True, "reason": granted,
             "reused": True}
        )  # fmt: skip
        return None
    approved, reason = await _ask(ctx, ToolCall(tool.name, private_copy(arguments), call_id), tool)
    ctx.approvals.append(
        {"tool": tool.name, "arguments": seen, "approved": approved, "reason": reason}
    )
    if approved:
        if key is not None:
            ctx.approved_calls.setdefault(key, (ctx.step, reason))
        return None
    ctx.last_denial = denial_text(tool.name, reason)
    message = f"{ctx.last_denial}; tell the user it was not done"
    return error_result(call_id, tool.name, Status.DENIED, message)


APPROVAL_EXPIRED = "expired"
"""The reason an approver gives for an approval nobody answered in time (the service's)."""


def denial_text(tool: str, reason: str) -> str:
    """What a denied call says: an approval that expired unanswered is told as such."""
    if reason == APPROVAL_EXPIRED:
        return f"the call to '{tool}' needs approval, and its approval expired with no answer"
    return f"the call to '{tool}' needs approval and was denied ({reason})"


def approval_key(tool: str, arguments: dict[str, Any]) -> str | None:
    """The identity of a call for the run's remembered approvals: the tool and its arguments as
    canonical JSON (``1`` and ``true`` differ, key order does not); ``None`` for arguments that
    are not plain JSON (never remembered)."""
    try:
        return json.dumps([tool, arguments], sort_keys=True, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return None


async def _ask(ctx: RunContext, proposed: ToolCall, tool: Tool) -> tuple[bool, str]:
    if ctx.approver is None:
        return False, "no approver is configured, so calls that need approval are denied"
    try:
        answer = ctx.approver(proposed, tool)
        if inspect.isawaitable(answer):
            answer = await answer
    except Exception as exc:
        if is_store_error(exc):  # the store failing is not the approver's answer
            raise
        return False, f"the approver failed: {type(exc).__name__}: {_bounded(str(exc))}"
    return verdict(answer)


def verdict(answer: Any) -> tuple[bool, str]:
    """(approved, reason) for what an approver returned.

    Only ``True`` or a pair ``(True, reason)`` approves (the first item must be ``True`` itself,
    not merely truthy); ``False`` and ``(False, reason)`` deny; anything else — ``"no"``,
    ``{"approved": False}``, ``[False]``, ``()``, ``None``, ``1`` — denies too, and the reason
    names the value so the audit trail shows what the approver said.
    """
    if answer is True:
        return True, "approved"
    if answer is False:
        return False, "denied by the approver"
    if isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[0], bool):
        reason = answer[1] if isinstance(answer[1], str) else _shown(answer[1])
        return answer[0], _bounded(reason)
    return False, (
        f"the approver returned {_shown(answer)}, which is not an approval "
        "(only True or (True, reason) approves)"
    )


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 80
_REPR.maxlevel = 3
_MAX_REASON = 500


def _shown(value: Any) -> str:
    """A short repr of ``value`` for a message (bounded, whatever the value)."""
    try:
        return _REPR.repr(value)
    except Exception:  # a __repr__ that raises still must not fail the run
        return f"<{type(value).__name__} object>"


def _bounded(text: str) -> str:
    return text if len(text) <= _MAX_REASON else text[:_MAX_REASON] + "…"


def _stage_status(planned: int, rejected: int) -> Status:
    if rejected == 0:
        return Status.OK
    return Status.PARTIAL if planned else Status.INVALID
