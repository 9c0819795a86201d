"""Turns what each stage did into audit records, and hands them to the sink one step at a time.

The recorder reads the run after a stage has run, through ``RunView`` — the few things it needs
to know, declared here so that auditing depends on no part of the pipeline; the stages
themselves know nothing of auditing, and a run without a recorder pays nothing for it. Records
are buffered until a step is whole (after the ToolExecutor, or at the end of the run) and then
written together, so a process killed mid-step leaves only whole steps behind.

Every record is redacted and made storable (``audit.redaction``) here, before any store sees
it; and writing never fails the run: a sink that refuses records is logged and reported in
``warnings()``, with the characters that had to be escaped (the agent adds them to the run's
warnings).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from hermes_agent.audit.records import AuditRecord, AuditSink, Role
from hermes_agent.audit.redaction import Redactor, sanitized_note, storable
from hermes_agent.models.base import Model, ModelSettings
from hermes_agent.protocol.chatml import render_conversation, render_tool_results, to_chatml
from hermes_agent.stages import HookStage
from hermes_agent.types import Completion, Message, ToolCallRecord, ToolResult

logger = logging.getLogger("hermes_agent")


class NamedTool(Protocol):
    """A tool as the recorder sees it: its name."""

    @property
    def name(self) -> str: ...


class PlannedView(Protocol):
    """A call the ToolSelector let through: the tool and the arguments it will get."""

    @property
    def tool(self) -> NamedTool: ...

    @property
    def arguments(self) -> Mapping[str, Any]: ...


class SummaryView(Protocol):
    """The model call that summarised old turns: what was sent, what came back."""

    @property
    def prompt(self) -> str: ...

    @property
    def completion(self) -> str: ...


class RunView(Protocol):
    """What the recorder reads of a run, after each stage (the pipeline's run context has all
    of it)."""

    @property
    def request_id(self) -> str: ...

    @property
    def session_id(self) -> str: ...

    @property
    def step(self) -> int:
        """The index of the current model turn."""
        ...

    @property
    def stage_status(self) -> int:
        """The status code of the stage that ran last."""
        ...

    @property
    def model(self) -> Model: ...

    @property
    def settings(self) -> ModelSettings: ...

    @property
    def turn_settings(self) -> ModelSettings | None:
        """The settings of the latest model request, when they differ from ``settings``."""
        ...

    @property
    def user_message(self) -> str: ...

    @property
    def summary_call(self) -> SummaryView | None: ...

    @property
    def messages(self) -> Sequence[Message]:
        """The conversation as the model sees it (the last assistant turn once answered)."""
        ...

    @property
    def tool_specs(self) -> Sequence[dict[str, Any]]: ...

    def system_layout(self) -> tuple[Sequence[Message], Sequence[dict[str, Any]]]:
        """The system turn and tool definitions the run sends (or would have sent, had it not
        ended before its conversation was laid out)."""
        ...

    @property
    def prompt_rewrites(self) -> int:
        """Counts changes to messages already sent (the whole prompt is recorded again)."""
        ...

    @property
    def completion_text(self) -> str: ...

    @property
    def completion(self) -> Completion:
        """The latest model turn, parsed (its scratch pad or thought is recorded apart)."""
        ...

    @property
    def reason(self) -> str | None:
        """Explain mode: the reason the model gave for its latest turn."""
        ...

    @property
    def error(self) -> str | None: ...

    @property
    def planned(self) -> Sequence[PlannedView]: ...

    @property
    def rejected(self) -> Sequence[tuple[int, ToolResult]]:
        """Calls the ToolSelector refused, with their position in the model's turn."""
        ...

    @property
    def last_results(self) -> Sequence[ToolResult]: ...

    @property
    def tool_calls(self) -> Sequence[ToolCallRecord]:
        """Every call of the run so far, with its status and metadata."""
        ...

    @property
    def output(self) -> str: ...

    @property
    def variables(self) -> Mapping[str, Any]:
        """The run's variables (``pipeline.variables``)."""
        ...

    @property
    def hook_notes(self) -> Sequence[Mapping[str, Any]]:
        """What hooks did to the run, in order (each becomes one ``hook`` record)."""
        ...


class Recorder:
    """The audit trail of one run.

    ``redactor`` masks secrets in every record before the sink sees it.
    """

    def __init__(self, sink: AuditSink, redactor: Redactor | None = None) -> None:
        self.sink = sink
        self.redact = redactor if redactor else None
        self.problems: list[str] = []
        """What went wrong making records or handing them to the sink (each also logged)."""
        self.escaped = 0
        """Characters no store can hold (lone surrogates, NUL) escaped in this run's records."""
        self._pending: list[AuditRecord] = []
        self._seq = 0
        self._system_sha: str | None = None
        self._prompted: int | None = None  # messages in the last recorded prompt
        self._rewrites = 0
        self._last_prompt = ""  # the whole prompt of the last request, as it was sent
        self._recorded: set[tuple[int, str]] = set()
        self._notes = 0  # hook notes recorded so far

    def continue_after(self, earlier: Sequence[AuditRecord]) -> None:
        """Continue the trail of a run that an earlier attempt began (a durable run resumed):
        stages of steps it recorded are not recorded again, and ``seq`` goes on from its last
        record."""
        self._recorded = {(record.step, record.stage) for record in earlier}
        if earlier:
            self._seq = max(record.seq for record in earlier) + 1

    def record(
        self, ctx: RunView, stage: str, stage_name: str, started_ns: int, *, ran: bool = True
    ) -> None:
        """Record one stage that has just run (or failed in a hook); with ``ran=False`` (a
        hook answered the run before it) only the user's message of the input stage and what
        the hooks did."""
        latency_ms = (time.perf_counter_ns() - started_ns) / 1e6
        if self._recorded and (ctx.step, stage_name) in self._recorded:
            return  # an earlier attempt of this run recorded it
        try:
            contents: list[tuple[Role, str]] = []
            if ran or stage == HookStage.INPUT:
                contents = (
                    self._prompt_records(ctx)
                    if stage == HookStage.THOUGHT
                    else _contents(ctx, stage)
                )
            notes = ctx.hook_notes[self._notes :]
            self._notes += len(notes)
            contents += [(Role.HOOK, _json(dict(note))) for note in notes]
            for role, content in contents:
                self._add(ctx, stage_name, role, content, latency_ms)
        except Exception as exc:  # a defect here must cost the trail a record, not the run
            problem = f"audit: the {stage_name} record could not be made: {exc!r}"
            logger.exception("%s", problem)
            self.problems.append(problem)
        if stage in (HookStage.EXECUTION, HookStage.OUTPUT):
            self.commit()

    def commit(self) -> None:
        """Hand the buffered records (whole steps) to the sink. Never raises: the run has had
        its effects by now, and losing its trail must not lose its answer."""
        if not self._pending:
            return
        records, self._pending = self._pending, []
        try:
            self.sink.write(records)
        except Exception as exc:
            problem = (
                f"audit: {len(records)} records of request {records[0].request_id} could not "
                f"be written: {type(exc).__name__}: {exc}"
            )
            logger.error("%s", problem)
            self.problems.append(problem)

    def warnings(self) -> list[str]:
        """What the run's result should say about its trail."""
        found = list(self.problems)
        if self.escaped:
            found.append(
                f"audit: {self.escaped} characters no store can hold (lone surrogates, NUL) "
                "were stored as \\uXXXX escapes; see each record's `sanitized`"
            )
        return found

    def _add(
        self, ctx: RunView, stage_name: str, role: Role, content: str, latency_ms: float
    ) -> None:
        code = int(ctx.stage_status)
        if self.redact is not None:
            content = self.redact(content)
        content, escaped = storable(content)
        self.escaped += escaped
        self._pending.append(
            AuditRecord(
                request_id=ctx.request_id,
                session_id=ctx.session_id,
                step=ctx.step,
                stage=stage_name,
                role=role.value,
                content=content,
                timestamp_ns=time.time_ns(),
                latency_ms=round(latency_ms, 3),
                status="ok" if code < 400 else "error",
                status_code=code,
                model_name=ctx.model.name,
                system_prompt_sha256=self._system_prompt_sha(ctx),
                seq=self._seq,
                sanitized=sanitized_note(escaped),
            )
        )
        self._seq += 1

    def _prompt_records(self, ctx: RunView) -> list[tuple[Role, str]]:
        """The prompt, then the completion. The first request of a run (and any request after
        the conversation was trimmed to fit the context window, or whose earlier turns no
        longer render as they were sent) records the whole prompt as sent; later ones record
        only the turns added since (role ``prompt_added``, ChatML), so a long run's trail grows
        with what happened, not with the square of it."""
        sent = _sent(ctx)
        completion = (Role.COMPLETION, ctx.completion_text or (ctx.error or ""))
        whole = _prompt(ctx, sent)
        fresh = (
            self._prompted is None
            or ctx.prompt_rewrites != self._rewrites
            or len(sent) < self._prompted
            # The turns sent before no longer render as they were sent: the tool choice or the
            # tools changed (a forced call was made; the embedded model's last turn was given
            # the ``required`` prompt because it decided to call; a tool was added).
            or _prompt(ctx, sent[: self._prompted]) != self._last_prompt
        )
        if fresh:
            prompt = (Role.PROMPT, whole)
        else:
            added = sent[self._prompted :]
            text = to_chatml(render_conversation(added, ()), add_generation_prompt=False)
            prompt = (Role.PROMPT_ADDED, text)
        self._prompted, self._rewrites = len(sent), ctx.prompt_rewrites
        self._last_prompt = whole
        records = [prompt, completion]
        planning = ctx.completion.scratch_pad or ctx.completion.thought
        if planning and not ctx.error:
            records.append((Role.SCRATCH_PAD, planning))
        if ctx.reason:
            records.append((Role.REASON, ctx.reason))
        return records

    def _system_prompt_sha(self, ctx: RunView) -> str:
        # The system turn as a Hermes model reads it (tools prompt + instructions); computed
        # once per run, it identifies the prompt version a request ran with.
        # A run refused before its conversation was laid out (by a pre_input hook, say) still
        # names the prompt it would have been sent with, not the hash of an empty one.
        if self._system_sha is None:
            turns, specs = ctx.system_layout()
            wire = render_conversation(turns, specs, preamble=ctx.settings.preamble)
            system = wire[0]["content"] if wire and wire[0]["role"] == "system" else ""
            self._system_sha = hashlib.sha256(system.encode("utf-8", "replace")).hexdigest()
        return self._system_sha


def _contents(ctx: RunView, stage: str) -> list[tuple[Role, str]]:
    if stage == HookStage.INPUT:
        found = [(Role.USER, ctx.user_message)]
        if ctx.variables:
            found.append((Role.VARIABLES, _json(dict(ctx.variables))))
        if ctx.summary_call is not None:
            found.append((Role.SUMMARY_PROMPT, ctx.summary_call.prompt))
            found.append((Role.SUMMARY, ctx.summary_call.completion))
        return found
    if stage == HookStage.SELECTION:
        selection = {
            "planned": [{"name": p.tool.name, "arguments": p.arguments} for p in ctx.planned],
            "rejected": [
                {"name": r.name, "status": r.status_code, "error": r.error} for _, r in ctx.rejected
            ],
        }
        return [(Role.SELECTION, _json(selection))]
    if stage == HookStage.EXECUTION:
        ran = ctx.tool_calls[len(ctx.tool_calls) - len(ctx.last_results) :]
        calls = [
            {"id": c.id, "name": c.name, "status": c.status_code, "metadata": c.metadata}
            for c in ran
        ]
        return [
            (Role.TOOL, render_tool_results(ctx.last_results)),
            (Role.TOOL_CALLS, _json(calls)),
        ]
    return [(Role.OUTPUT, ctx.output)]


def _sent(ctx: RunView) -> list[Message]:
    # The assistant turn the ThoughtGenerator added is not part of what was sent.
    if ctx.messages and ctx.messages[-1].role == "assistant":
        return list(ctx.messages[:-1])
    return list(ctx.messages)


def _prompt(ctx: RunView, sent: list[Message]) -> str:
    try:
        return ctx.model.render_prompt(sent, ctx.tool_specs, ctx.turn_settings or ctx.settings)
    except Exception as exc:  # a model that cannot render must not break the run
        return f"(prompt not available: {type(exc).__name__}: {exc})"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def lifecycle_record(
    earlier: Sequence[AuditRecord],
    *,
    request_id: str,
    session_id: str,
    stage: str,
    role: Role,
    content: Mapping[str, Any],
    status_code: int,
    model_name: str,
    redactor: Redactor | None = None,
    latency_ms: float = 0.0,
    step: int | None = None,
) -> AuditRecord:
    """A record of the run's life beside its stages' — how it ended without an output
    (``stopped``), or that another attempt took it up (``resumed``) — numbered after the
    records ``earlier`` holds, its content JSON, redacted and made storable like every record
    the recorder writes. The one place such records are built."""
    last = earlier[-1] if earlier else None
    text = json.dumps(dict(content), ensure_ascii=False, default=str)
    if redactor is not None:
        text = redactor(text)
    text, escaped = storable(text)
    return AuditRecord(
        request_id=request_id,
        session_id=session_id,
        step=step if step is not None else (last.step if last else 0),
        stage=stage,
        role=role.value,
        content=text,
        timestamp_ns=time.time_ns(),
        latency_ms=round(latency_ms, 3),
        status="ok" if status_code < 400 else "error",
        status_code=status_code,
        model_name=last.model_name if last else model_name,
        system_prompt_sha256=last.system_prompt_sha256 if last else "",
        seq=last.seq + 1 if last else 0,
        sanitized=sanitized_note(escaped),
    )
