"""Replay: run a recorded request again, with the model's recorded answers, against today's agent.

The model is replaced by a ``ScriptedModel`` that serves the completions of the audit trail in
order, so whatever differs is the agent's doing — its tools, their schemas, hooks and prompts:

    from hermes_agent.replay import replay

    report = replay(agent, request_id, storage)     # or agent.replay(request_id)
    if not report.matched:
        print(report.summary())          # which step changed first, and how

Per step it compares the ToolSelector's decision (calls planned, with their validated
arguments, and calls refused), the ToolExecutor's results (the ``<tool_response>`` text the
model was fed) and, at the end, the final output. A changed prompt is noted but is not a
mismatch: the recorded completions answered the old prompt, and the point of a replay is what
the agent does with them.

The replay runs on a fork of the agent (``Agent.fork``: the same tools, hooks, prompts and
settings, the recorded model, an in-memory store, the recorded approvals) in a throwaway session
seeded with the history the original run saw, rebuilt from the session store (the n-th request
of a session saw the messages before its n-th user message); its audit records stay in that
in-memory store for the comparison and are never stored. Replay reads the recording only through
the ``Storage`` seam (the audit reader and ``sessions.load``), so it works on every backend.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from hermes_agent.audit.records import AuditRecord, Role
from hermes_agent.audit.redaction import Redactor
from hermes_agent.audit.trace_view import selection, tool_responses
from hermes_agent.errors import ModelError
from hermes_agent.memory.history import HistoryLoader
from hermes_agent.models.base import Model
from hermes_agent.models.scripted import ScriptedModel
from hermes_agent.pipeline.journal import CallKey, JournaledCall, RunJournal
from hermes_agent.pipeline.status import Status
from hermes_agent.storage.base import Storage, StorageError
from hermes_agent.storage.in_memory import InMemoryStorage
from hermes_agent.tools.registry import Tool
from hermes_agent.types import Message, ModelResponse, RunResult, ToolCall

__all__ = ["ReplayReport", "ReplayRun", "Replayable", "StepDiff", "replay"]

_MODEL_FAILED = 502
_SESSION = "replay"


class ReplayRun(Protocol):
    """The agent a replay runs: a fork of the one being checked."""

    @property
    def history(self) -> HistoryLoader: ...

    def run(self, message: str, *, session_id: str | None = None) -> RunResult: ...

    async def arun(
        self, message: str, *, session_id: str | None = None, journal: RunJournal | None = None
    ) -> RunResult: ...

    def close(self) -> None: ...


class Replayable(Protocol):
    """What replay needs of an agent (``Agent`` has it): a fork with the recorded model, an
    in-memory store and the recorded approvals."""

    def fork(
        self,
        *,
        model: Model,
        storage: Storage,
        approver: Callable[[ToolCall, Tool], Any],
    ) -> ReplayRun: ...


@dataclass(slots=True)
class StepDiff:
    """What one step did when recorded and when replayed; ``differences`` says how they differ
    (empty when they match)."""

    step: int
    matched: bool
    differences: list[str] = field(default_factory=list)
    expected_calls: list[dict[str, Any]] = field(default_factory=list)
    actual_calls: list[dict[str, Any]] = field(default_factory=list)
    expected_results: str | None = None
    actual_results: str | None = None
    expected_output: str | None = None
    actual_output: str | None = None
    prompt_changed: bool = False
    """The prompt sent at this step differs from the recorded one (informational)."""


@dataclass(slots=True)
class ReplayReport:
    """The outcome of a replay: ``matched`` when every step and the final output agree."""

    request_id: str
    matched: bool
    steps: list[StepDiff]
    first_difference: int | None
    """The index of the first step that differs, or ``None``."""
    expected_output: str = ""
    actual_output: str = ""
    history_messages: int = 0
    """How many messages of session history the replay was seeded with."""
    notes: list[str] = field(default_factory=list)
    result: RunResult | None = None
    """The replay run's own result."""
    skipped_calls: list[str] = field(default_factory=list)
    """Tools a replay with ``execute_tools=False`` did not run (not declared idempotent)."""
    records: list[AuditRecord] = field(default_factory=list, repr=False)
    """The replay run's own audit records (what a caller may keep as its trail)."""

    def summary(self) -> str:
        """A few human-readable lines: the verdict, then each differing step."""
        steps = len(self.steps)
        if self.matched:
            lines = [f"replay of {self.request_id}: all {steps} steps match"]
        else:
            lines = [
                f"replay of {self.request_id}: differs, first at step {self.first_difference} "
                f"({sum(1 for s in self.steps if not s.matched)} of {steps} steps differ)"
            ]
        for step in self.steps:
            lines.extend(f"  step {step.step}: {difference}" for difference in step.differences)
            if step.prompt_changed:
                lines.append(f"  step {step.step}: (note) the prompt differs from the recorded one")
        lines.extend(f"  note: {note}" for note in self.notes)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


class _RecordedModelTurns:
    """The script: the recorded completions in order; a recorded model failure fails again."""

    def __init__(self, completions: list[AuditRecord]) -> None:
        self._completions = completions
        self._next = 0

    def __call__(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> str:
        if self._next >= len(self._completions):
            raise ModelError(
                f"replay: the recorded request has only {len(self._completions)} model turns; "
                "the agent asked for another"
            )
        record = self._completions[self._next]
        self._next += 1
        if record.status_code == _MODEL_FAILED:
            raise ModelError(record.content)
        return record.content


class _RecordedApprovals:
    """Approve a call that ran in the recording (same tool, same arguments); refuse others."""

    def __init__(self, recorded: list[AuditRecord]) -> None:
        self._approved: list[tuple[str, str]] = []
        for record in recorded:
            if record.role == Role.SELECTION:
                for planned in selection(record.content)[0]:
                    self._approved.append((planned["name"], _canonical(planned["arguments"])))

    def __call__(self, call: ToolCall, tool: Tool) -> tuple[bool, str]:
        if (tool.name, _canonical(call.arguments)) in self._approved:
            return True, "approved in the recorded run"
        return False, "not approved in the recorded run"


class _SkipUnsafeCalls:
    """The journal of a replay that must not repeat side effects: a call of a tool not declared
    ``idempotent`` is not run and reports why (status 403); an idempotent one runs. Model
    turns pass through (the recorded model answers them); the turn goes to the scratch store."""

    resumes = False  # a replay is a run of its own: no earlier attempt left it a trail

    def __init__(self, scratch: Storage) -> None:
        self.scratch = scratch
        self.skipped: list[str] = []

    async def recorded_turn(self, turn: int) -> ModelResponse | None:
        return None

    async def record_turn(self, turn: int, response: ModelResponse) -> None:
        return None

    def recorded_call(self, key: CallKey) -> bool:
        return False

    async def call_started(
        self, key: CallKey, tool: str, arguments: dict[str, Any], idempotent: bool
    ) -> JournaledCall | None:
        if idempotent:
            return None
        self.skipped.append(tool)
        return JournaledCall(
            "recorded",
            status_code=int(Status.DENIED),
            error=(
                f"not run in this replay: tool '{tool}' is not declared idempotent, so running "
                "it again could repeat its effect; replay with execute_tools to run it"
            ),
        )

    async def call_finished(
        self, key: CallKey, value: Any, status_code: int, error: str | None
    ) -> None:
        return None

    async def save_turn(self, session_id: str, messages: Sequence[Message]) -> None:
        self.scratch.sessions.append(session_id, list(messages))

    def holds(self) -> bool:
        return True


def replay(
    agent: Replayable, request_id: str, storage: Storage, *, execute_tools: bool = True
) -> ReplayReport:
    """Re-run a recorded request with its recorded model completions against ``agent`` as it is
    now, and compare step by step. The agent itself is not changed and nothing is stored.

    With ``execute_tools=False`` only tools declared ``idempotent`` run; a call of any other
    is answered "not run in this replay" (403) and listed in ``skipped_calls``."""
    recorded = storage.records(request_id)
    if not recorded:
        raise StorageError(
            f"no audit records for request {request_id!r} in {storage!r}; "
            "list the recorded requests with `hermes-agent trace list`"
        )
    user = next((r for r in recorded if r.role == Role.USER), None)
    if user is None:
        raise StorageError(f"request {request_id!r} has no recorded user message; cannot replay")
    notes: list[str] = []
    history, message = _history_before(storage, user, notes)

    completions = [r for r in recorded if r.role == Role.COMPLETION]
    name = completions[0].model_name if completions else "replay"
    scratch = InMemoryStorage()
    scratch.sessions.append(_SESSION, history)
    # Fresh caches and rate limits come with the fork: a result cached by the original run
    # must not stand in for what the tool returns today.
    twin = agent.fork(
        model=ScriptedModel(_RecordedModelTurns(completions), name=name),
        storage=scratch,
        approver=_RecordedApprovals(recorded),
    )
    # The recorded model's summary of older turns is not served again: an extractive one is
    # made instead, and the scripted model answers the recorded turns only.
    twin.history.summarize_with_model = False
    journal = None if execute_tools else _SkipUnsafeCalls(scratch)
    try:
        if journal is None:
            result = twin.run(message, session_id=_SESSION)
        else:
            result = asyncio.run(twin.arun(message, session_id=_SESSION, journal=journal))
        replayed = scratch.records(result.request_id)
    finally:
        twin.close()
        scratch.close()
    if journal is not None and journal.skipped:
        notes.append(
            "not run again (not declared idempotent): " + ", ".join(dict.fromkeys(journal.skipped))
        )

    steps = _compare(recorded, replayed)
    first = next((s.step for s in steps if not s.matched), None)
    expected_output = _last_content(recorded, Role.OUTPUT)
    actual_output = _last_content(replayed, Role.OUTPUT)
    return ReplayReport(
        request_id=request_id,
        matched=first is None,
        steps=steps,
        first_difference=first,
        expected_output=expected_output,
        actual_output=actual_output,
        history_messages=len(history),
        notes=notes,
        result=result,
        skipped_calls=list(journal.skipped) if journal is not None else [],
        records=replayed,
    )


def _history_before(
    storage: Storage, user: AuditRecord, notes: list[str]
) -> tuple[list[Message], str]:
    """The session history the recorded run saw, and the user message to send.

    The n-th recorded request of a session saw the messages before the session's n-th user
    message. The stored message is checked against the recorded one (which may be redacted) and
    sent as stored, so a replay sees what the original run saw.
    """
    messages = storage.sessions.load(user.session_id)
    positions = [i for i, m in enumerate(messages) if m.role == "user"]
    matches = [i for i in positions if _same_text(user.content, messages[i].content)]
    earlier = storage.session_requests(user.session_id)
    ordinal = earlier.index(user.request_id) if user.request_id in earlier else -1
    if 0 <= ordinal < len(positions) and positions[ordinal] in matches:
        index = positions[ordinal]
    elif len(matches) == 1:
        index = matches[0]
    else:
        if messages:
            notes.append(
                "the session history of the recorded run could not be rebuilt from the session "
                "store; replayed without history"
            )
        return [], user.content
    return messages[:index], messages[index].content


def _same_text(recorded: str, stored: str) -> bool:
    if recorded == stored:
        return True
    if Redactor.MASK not in recorded:
        return False
    pattern = ".+?".join(re.escape(part) for part in recorded.split(Redactor.MASK))
    return re.fullmatch(pattern, stored, re.S) is not None


# -- comparison --------------------------------------------------------------------------


def _compare(expected: list[AuditRecord], actual: list[AuditRecord]) -> list[StepDiff]:
    indices = sorted({r.step for r in expected} | {r.step for r in actual})
    return [_compare_step(step, expected, actual) for step in indices]


def _compare_step(step: int, expected: list[AuditRecord], actual: list[AuditRecord]) -> StepDiff:
    old = {r.role: r for r in expected if r.step == step}
    new = {r.role: r for r in actual if r.step == step}
    diff = StepDiff(step=step, matched=True)

    old_sel, new_sel = old.get(Role.SELECTION), new.get(Role.SELECTION)
    diff.expected_calls = _calls(old_sel)
    diff.actual_calls = _calls(new_sel)
    if (old_sel is None) != (new_sel is None):
        diff.differences.append(_presence("tool selection", old_sel, new_sel))
    elif diff.expected_calls != diff.actual_calls:
        diff.differences.append(
            f"tool calls differ: recorded {_short(diff.expected_calls)}, "
            f"replayed {_short(diff.actual_calls)}"
        )

    old_tool, new_tool = old.get(Role.TOOL), new.get(Role.TOOL)
    diff.expected_results = old_tool.content if old_tool else None
    diff.actual_results = new_tool.content if new_tool else None
    if (old_tool is None) != (new_tool is None):
        diff.differences.append(_presence("tool results", old_tool, new_tool))
    elif old_tool is not None and new_tool is not None:
        if _steady(old_tool.content) != _steady(new_tool.content):
            diff.differences.append(_results_difference(old_tool.content, new_tool.content))
        elif old_tool.status_code != new_tool.status_code:
            diff.differences.append(
                f"tool status differs: recorded {old_tool.status_code}, "
                f"replayed {new_tool.status_code}"
            )

    old_out, new_out = old.get(Role.OUTPUT), new.get(Role.OUTPUT)
    diff.expected_output = old_out.content if old_out else None
    diff.actual_output = new_out.content if new_out else None
    if (old_out is None) != (new_out is None):
        diff.differences.append(_presence("final output", old_out, new_out))
    elif old_out is not None and new_out is not None:
        if old_out.content != new_out.content:
            diff.differences.append(
                f"final output differs: recorded {_short(old_out.content)}, "
                f"replayed {_short(new_out.content)}"
            )
        elif old_out.status_code != new_out.status_code:
            diff.differences.append(
                f"final status differs: recorded {old_out.status_code}, "
                f"replayed {new_out.status_code}"
            )

    old_prompt, new_prompt = old.get(Role.PROMPT), new.get(Role.PROMPT)
    if old_prompt is not None and new_prompt is not None:
        diff.prompt_changed = _steady(old_prompt.content) != _steady(new_prompt.content)
    if (old.get(Role.COMPLETION) is None) != (new.get(Role.COMPLETION) is None):
        diff.differences.append(
            _presence("model turn", old.get(Role.COMPLETION), new.get(Role.COMPLETION))
        )
    diff.matched = not diff.differences
    return diff


_TIMING = re.compile(r'"execution_time_ms":\s*[-+0-9.eE]+')


def _steady(text: str) -> str:
    """``text`` without what changes from run to run of the same calls (timings)."""
    return _TIMING.sub('"execution_time_ms": 0', text)


def _results_difference(old: str, new: str) -> str:
    """Name the first result that differs, showing what the tool returned each time."""
    old_blocks, new_blocks = tool_responses(_steady(old)), tool_responses(_steady(new))
    if len(old_blocks) != len(new_blocks):
        return (
            f"tool results differ: recorded {len(old_blocks)} results, replayed {len(new_blocks)}"
        )
    for number, (before, after) in enumerate(zip(old_blocks, new_blocks, strict=True), 1):
        if before != after:
            name, was = _result_view(before)
            _, now = _result_view(after)
            return (
                f"tool results differ at result {number} ({name}): recorded {_short(was)}, "
                f"replayed {_short(now)}"
            )
    return f"tool results differ: recorded {_short(old)}, replayed {_short(new)}"


def _result_view(block: str) -> tuple[str, Any]:
    # The envelope's data (or error) is what a reader wants to see; its metadata is noise.
    try:
        item = json.loads(block)
    except json.JSONDecodeError:
        return "?", block
    if not isinstance(item, dict):
        return "?", item
    content = item.get("content")
    if isinstance(content, dict) and "data" in content:
        content = {k: v for k, v in content.items() if k in ("status", "data", "error")}
    return str(item.get("name", "?")), content


def _calls(record: AuditRecord | None) -> list[dict[str, Any]]:
    if record is None:
        return []
    planned, rejected = selection(record.content)
    return [{"name": p["name"], "arguments": p["arguments"]} for p in planned] + [
        {"name": r["name"], "refused": r.get("status")} for r in rejected
    ]


def _presence(what: str, old: AuditRecord | None, new: AuditRecord | None) -> str:
    if old is None:
        return f"{what}: none recorded, but the replay has one"
    return f"{what}: recorded, but the replay has none"


def _last_content(records: list[AuditRecord], role: Role) -> str:
    found = [r.content for r in records if r.role == role]
    return found[-1] if found else ""


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def _short(value: Any, limit: int = 160) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
