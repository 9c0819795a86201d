"""One run's audit records read back per step: the view the console's run page, its runs list
and ``hermes-agent trace show`` are all built on, so that a completion, a selection and the
tool responses are parsed in one place.

``trace_view(records)`` lays the records out as steps: each of the five stages with its status
code, latency and start; the prompt as sent (or the turns added to it); the completion with the
thought and the parser's notes read from it; a summary the model was asked for; each call with
what the selector decided, what the executor ran and returned and, given the answers, the
approval it got; the answer. ``trace_summary(records)`` is the cheap part of that for a list
(no completion is parsed). Nothing here knows how the view is shown: ``to_dict`` gives
JSON-ready values, and each reader formats what it needs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hermes_agent.audit.records import AuditRecord, Role
from hermes_agent.protocol.parser import parse_completion
from hermes_agent.stages import StageName
from hermes_agent.types import ToolCall

STAGES: tuple[StageName, ...] = tuple(StageName)
"""The five stages, in the order a step runs them."""

SERVICE_ROLES = frozenset({Role.ACCEPTED})
"""Records a service writes about a run before its pipeline runs (they belong to no step)."""

FINAL_ROLES = frozenset({Role.OUTPUT, Role.STOPPED})
"""The roles of a trail's last record: its answer, or how it stopped."""

_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.S)


@dataclass(frozen=True, slots=True)
class StageTrace:
    """One of the five stages of a step; ``ran`` is false for a stage the step did not run."""

    stage: str
    ran: bool
    status_code: int | None = None
    """The worst status code of the stage's records."""
    latency_ms: float | None = None
    offset_ms: float | None = None
    """When the stage started, from the start of its step."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "ran": self.ran,
            "status_code": self.status_code,
            "latency_ms": self.latency_ms,
            "offset_ms": self.offset_ms,
        }


@dataclass(frozen=True, slots=True)
class CallApproval:
    """The answer a call got from whoever approves calls."""

    approved: bool | None
    reason: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"approved": self.approved, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class CallTrace:
    """One call of a step: what the model asked for, what the selector decided, and what the
    executor ran and returned."""

    id: str | None
    name: str
    arguments: Any
    status_code: int | None
    ran: bool
    refused: bool
    result: Any
    """The tool's data (the envelope's ``data``), or the raw content it returned."""
    error: Any
    execution_time_ms: float | None
    cache_hit: bool | None
    metadata: dict[str, Any]
    """The executor's other facts about the call (truncation, fallback, call key...)."""
    approval: CallApproval | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "arguments": self.arguments,
            "status_code": self.status_code,
            "ran": self.ran,
            "refused": self.refused,
            "result": self.result,
            "error": self.error,
            "execution_time_ms": self.execution_time_ms,
            "cache_hit": self.cache_hit,
            "metadata": dict(self.metadata),
            "approval": self.approval.to_dict() if self.approval is not None else None,
        }


@dataclass(frozen=True, slots=True)
class PromptTrace:
    """What the step sent the model: the whole prompt (``kind`` ``prompt``) or the turns added
    to the previous one (``prompt_added``)."""

    kind: str
    text: str

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "text": self.text}


@dataclass(frozen=True, slots=True)
class SummaryTrace:
    """The summary of older turns the model was asked for in this step, and its answer."""

    prompt: str
    completion: str

    def to_dict(self) -> dict[str, str]:
        return {"prompt": self.prompt, "completion": self.completion}


@dataclass(frozen=True, slots=True)
class StepTrace:
    """One step of a run, read from its records."""

    step: int
    offset_ms: float
    """When the step started, from the start of the run."""
    duration_ms: float
    stages: tuple[StageTrace, ...]
    prompt: PromptTrace | None
    completion: str | None
    """The model's answer as received (or the model's error)."""
    thought: str | None
    """A thinking model's thought, as the parser reads it from the completion."""
    notes: tuple[str, ...]
    """What the parser saw in the completion and did not act on (a call inside the thought)."""
    summary: SummaryTrace | None
    calls: tuple[CallTrace, ...]
    output: str | None
    records: tuple[AuditRecord, ...] = field(default=(), repr=False)
    """The step's records, in order."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready values of everything but the records."""
        return {
            "step": self.step,
            "offset_ms": self.offset_ms,
            "duration_ms": self.duration_ms,
            "stages": [stage.to_dict() for stage in self.stages],
            "prompt": self.prompt.to_dict() if self.prompt is not None else None,
            "completion": self.completion,
            "thought": self.thought,
            "notes": list(self.notes),
            "summary": self.summary.to_dict() if self.summary is not None else None,
            "calls": [call.to_dict() for call in self.calls],
            "output": self.output,
        }


@dataclass(frozen=True, slots=True)
class TraceView:
    """A run's audit records per step, with what the trail says about the whole run.

    ``records`` are all the records given, in order; the steps and the run's facts are read from
    the pipeline's (a service's record that it accepted the run is left out of them): ``model``,
    ``system_prompt_sha256`` and ``started`` are ``None`` until the pipeline wrote one."""

    request_id: str | None
    session_id: str | None
    model: str | None
    system_prompt_sha256: str | None
    user_message: str | None
    output: str | None
    """The last recorded answer."""
    started: float | None
    """When the first stage started, in seconds since the epoch."""
    duration_ms: float | None
    """From the start of the first stage to the last record."""
    steps: tuple[StepTrace, ...]
    records: tuple[AuditRecord, ...] = field(repr=False)
    pipeline_records: int = 0
    """How many of ``records`` the pipeline wrote (the service's acceptance left out)."""


@dataclass(frozen=True, slots=True)
class TraceSummary:
    """What a list of runs shows beside each, read without parsing a completion."""

    duration_ms: float | None
    """From the first record (a service's acceptance included) to the last."""
    steps: int
    """How many model turns were recorded."""
    tools: tuple[str, ...]
    """The tools the model called (run or refused), each once, in the order the trail names
    them: step by step, the planned calls of a step before its refused ones."""
    status_code: int | None
    """The status code of the trail's answer, or of how it stopped; ``None`` while it runs."""


def trace_view(
    records: Sequence[AuditRecord], approvals: Iterable[Mapping[str, Any]] = ()
) -> TraceView:
    """``records`` (a run's, in order) per step. ``approvals`` are the answers the run's calls
    got (each ``tool``, ``arguments``, ``approved``, ``reason``); each goes to the first call
    of that tool with those arguments, so two equal calls get one answer each."""
    pipeline = [r for r in records if r.role not in SERVICE_ROLES]
    unmatched = [dict(answer) for answer in approvals]
    origin = min((started_ns(r) for r in pipeline), default=0)
    steps = tuple(
        _step(step, [r for r in pipeline if r.step == step], origin, unmatched)
        for step in sorted({r.step for r in pipeline})
    )
    first = pipeline[0] if pipeline else None
    output = next((r for r in reversed(pipeline) if r.role == Role.OUTPUT), None)
    return TraceView(
        request_id=records[0].request_id if records else None,
        session_id=records[0].session_id if records else None,
        model=first.model_name if first is not None else None,
        system_prompt_sha256=first.system_prompt_sha256 if first is not None else None,
        user_message=next((r.content for r in pipeline if r.role == Role.USER), None),
        output=output.content if output is not None else None,
        started=started_ns(pipeline[0]) / 1e9 if pipeline else None,
        duration_ms=(
            round((max(r.timestamp_ns for r in pipeline) - origin) / 1e6, 3) if pipeline else None
        ),
        steps=steps,
        records=tuple(records),
        pipeline_records=len(pipeline),
    )


def trace_summary(records: Sequence[AuditRecord]) -> TraceSummary:
    """The list's facts of a run (see ``TraceSummary``)."""
    times = [r.timestamp_ns for r in records]
    final = next((r for r in reversed(records) if r.role in FINAL_ROLES), None)
    return TraceSummary(
        duration_ms=round((max(times) - min(times)) / 1e6, 3) if times else None,
        steps=sum(1 for r in records if r.role == Role.COMPLETION),
        tools=tuple(dict.fromkeys(tools_called(records))),
        status_code=final.status_code if final is not None else None,
    )


def tools_called(records: Iterable[AuditRecord]) -> list[str]:
    """The name of every call the selector planned or refused, in order (repeats kept)."""
    names: list[str] = []
    for record in records:
        if record.role == Role.SELECTION:
            planned, rejected = selection(record.content)
            names.extend(str(c.get("name")) for c in planned + rejected if c.get("name"))
    return names


def selection(content: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The calls a ``selection`` record's content planned and refused (empty when it cannot
    be read)."""
    data = _json_object(content)
    planned, rejected = data.get("planned", []), data.get("rejected", [])
    return (
        [p for p in planned if isinstance(p, dict)] if isinstance(planned, list) else [],
        [r for r in rejected if isinstance(r, dict)] if isinstance(rejected, list) else [],
    )


def tool_responses(content: str) -> list[str]:
    """The body of each ``<tool_response>`` block of a ``tool`` record's content, in order."""
    return _RESPONSE.findall(content)


def started_ns(record: AuditRecord) -> int:
    """When the record's stage started: its time less its latency."""
    return record.timestamp_ns - int(record.latency_ms * 1e6)


# -- one step ------------------------------------------------------------------------------


def _step(
    step: int, records: list[AuditRecord], origin: int, approvals: list[dict[str, Any]]
) -> StepTrace:
    start = min(started_ns(r) for r in records)
    end = max(r.timestamp_ns for r in records)
    by_role = {r.role: r for r in records}
    prompt = by_role.get(Role.PROMPT) or by_role.get(Role.PROMPT_ADDED)
    completion = by_role.get(Role.COMPLETION)
    # Read once: the thought, its notes and the calls the model wrote all come from here.
    parsed = parse_completion(completion.content) if completion is not None else None
    output = by_role.get(Role.OUTPUT)
    summary = None
    if Role.SUMMARY_PROMPT in by_role:
        answer = by_role.get(Role.SUMMARY)
        summary = SummaryTrace(
            by_role[Role.SUMMARY_PROMPT].content, answer.content if answer is not None else ""
        )
    return StepTrace(
        step=step,
        offset_ms=round((start - origin) / 1e6, 3),
        duration_ms=round((end - start) / 1e6, 3),
        stages=tuple(_stage(name, records, start) for name in STAGES),
        prompt=PromptTrace(prompt.role, prompt.content) if prompt is not None else None,
        completion=completion.content if completion is not None else None,
        thought=parsed.thought if parsed is not None else None,
        notes=tuple(parsed.notes) if parsed is not None else (),
        summary=summary,
        calls=tuple(_calls(by_role, parsed.tool_calls if parsed else [], approvals)),
        output=output.content if output is not None else None,
        records=tuple(records),
    )


def _stage(name: str, records: list[AuditRecord], start: int) -> StageTrace:
    mine = [r for r in records if r.stage == name]
    if not mine:
        return StageTrace(name, ran=False)
    return StageTrace(
        name,
        ran=True,
        status_code=max(r.status_code for r in mine),
        latency_ms=max(r.latency_ms for r in mine),
        offset_ms=round((min(started_ns(r) for r in mine) - start) / 1e6, 3),
    )


def _calls(
    by_role: dict[str, AuditRecord], written: list[ToolCall], approvals: list[dict[str, Any]]
) -> list[CallTrace]:
    """Each call of a step: what the selector decided, what the executor ran and returned
    (``written``: the calls the model wrote, as parsed from its completion)."""
    planned, rejected = (
        selection(by_role[Role.SELECTION].content) if Role.SELECTION in by_role else ([], [])
    )
    ran = _json_list(by_role[Role.TOOL_CALLS].content) if Role.TOOL_CALLS in by_role else []
    blocks = tool_responses(by_role[Role.TOOL].content) if Role.TOOL in by_role else []
    calls: list[CallTrace] = []
    if not ran:  # selected but not run (a dry run, a run stopped before the executor)
        for item in planned:
            calls.append(_call(item["name"], item.get("arguments"), None, None, approvals))
        for item in rejected:
            calls.append(_refused(item, None, approvals))
        return calls
    planned_left, rejected_left = list(planned), list(rejected)
    for position, entry in enumerate(ran):
        block = _json_object(blocks[position]) if position < len(blocks) else {}
        head = rejected_left[0] if rejected_left else None
        if (
            head is not None
            and head.get("name") == entry.get("name")
            and head.get("status") == entry.get("status")
        ):
            rejected_left.pop(0)
            model_args = written[position].arguments if position < len(written) else None
            calls.append(_refused(head, model_args, approvals, entry, block))
            continue
        arguments = planned_left.pop(0).get("arguments") if planned_left else None
        if arguments is None and position < len(written):
            arguments = written[position].arguments
        calls.append(_call(str(entry.get("name")), arguments, entry, block, approvals))
    return calls


def _call(
    name: str,
    arguments: Any,
    entry: dict[str, Any] | None,
    block: dict[str, Any] | None,
    approvals: list[dict[str, Any]],
) -> CallTrace:
    metadata = dict((entry or {}).get("metadata") or {})
    content = (block or {}).get("content")
    envelope = content if isinstance(content, dict) and "status" in content else None
    return CallTrace(
        id=(entry or {}).get("id"),
        name=name,
        arguments=arguments,
        status_code=(entry or {}).get("status"),
        ran=entry is not None,
        refused=False,
        result=envelope.get("data") if envelope else content,
        error=envelope.get("error") if envelope else None,
        execution_time_ms=metadata.pop("execution_time_ms", None),
        cache_hit=metadata.pop("cache_hit", None),
        metadata={k: v for k, v in metadata.items() if k != "tool_name"},
        approval=_approval_for(name, arguments, approvals),
    )


def _refused(
    item: dict[str, Any],
    arguments: Any,
    approvals: list[dict[str, Any]],
    entry: dict[str, Any] | None = None,
    block: dict[str, Any] | None = None,
) -> CallTrace:
    view = _call(str(item.get("name")), arguments, entry, block, approvals)
    approval = view.approval
    if approval is None and item.get("status") == 403 and "approval" in str(item.get("error")):
        approval = CallApproval(approved=False, reason=item.get("error"))
    return CallTrace(
        id=view.id,
        name=view.name,
        arguments=view.arguments,
        status_code=item.get("status"),
        ran=False,
        refused=True,
        result=view.result,
        error=item.get("error"),
        execution_time_ms=view.execution_time_ms,
        cache_hit=view.cache_hit,
        metadata=view.metadata,
        approval=approval,
    )


def _approval_for(
    name: str, arguments: Any, approvals: list[dict[str, Any]]
) -> CallApproval | None:
    """The recorded answer for this call (consumed, so two equal calls get one answer each)."""
    key = _canonical(arguments)
    for index, answer in enumerate(approvals):
        if answer.get("tool") == name and _canonical(answer.get("arguments")) == key:
            del approvals[index]
            return CallApproval(answer.get("approved"), answer.get("reason"))
    return None


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _json_list(text: str) -> list[dict[str, Any]]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return []
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
