"""Turns what each stage did into audit records, and hands them to the sink one step at a time.

The recorder reads the RunContext after a stage has run; the stages themselves know nothing of
auditing, and a run without a recorder pays nothing for it. Records are buffered until a step is
whole (after the ToolExecutor, or at the end of the run) and then written together, so a process
killed mid-step leaves only whole steps behind.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import TYPE_CHECKING, Any

from hermes_agent.audit.records import AuditRecord, AuditSink, Redactor
from hermes_agent.protocol.chatml import render_conversation, render_tool_results, to_chatml
from hermes_agent.types import Message

if TYPE_CHECKING:
    from hermes_agent.pipeline.context import RunContext


class Recorder:
    """The audit trail of one run."""

    def __init__(self, sink: AuditSink, redactor: Redactor | None = None) -> None:
        self.sink = sink
        self.redact = redactor or Redactor()
        self._pending: list[AuditRecord] = []
        self._seq = 0
        self._system_sha: str | None = None
        self._prompted: int | None = None  # messages in the last recorded prompt
        self._rewrites = 0

    def record(self, ctx: RunContext, stage: str, stage_name: str, started_ns: int) -> None:
        """Record one stage that has just run (or failed in a hook)."""
        latency_ms = (time.perf_counter_ns() - started_ns) / 1e6
        contents = self._prompt_records(ctx) if stage == "thought" else _contents(ctx, stage)
        for role, content in contents:
            self._add(ctx, stage_name, role, content, latency_ms)
        if stage in ("execution", "output"):
            self.commit()

    def commit(self) -> None:
        """Hand the buffered records (whole steps) to the sink."""
        if self._pending:
            records, self._pending = self._pending, []
            self.sink.write(records)

    def _add(
        self, ctx: RunContext, stage_name: str, role: str, content: str, latency_ms: float
    ) -> None:
        code = int(ctx.stage_status)
        self._pending.append(
            AuditRecord(
                request_id=ctx.request_id,
                session_id=ctx.session_id,
                step=ctx.step,
                stage=stage_name,
                role=role,
                content=self.redact(content) if self.redact else content,
                timestamp_ns=time.time_ns(),
                latency_ms=round(latency_ms, 3),
                status="ok" if code < 400 else "error",
                status_code=code,
                model_name=ctx.model.name,
                system_prompt_sha256=self._system_prompt_sha(ctx),
                seq=self._seq,
            )
        )
        self._seq += 1

    def _prompt_records(self, ctx: RunContext) -> list[tuple[str, str]]:
        """The prompt, then the completion. The first request of a run (and any request after
        the conversation was trimmed to fit the context window) records the whole prompt as
        sent; later ones record only the turns added since (role ``prompt_added``, ChatML), so
        a long run's trail grows with what happened, not with the square of it."""
        sent = _sent(ctx)
        completion = ("completion", ctx.completion_text or (ctx.error or ""))
        fresh = (
            self._prompted is None
            or ctx.prompt_rewrites != self._rewrites
            or len(sent) < self._prompted
        )
        if fresh:
            prompt = ("prompt", _prompt(ctx, sent))
        else:
            added = sent[self._prompted :]
            text = to_chatml(render_conversation(added, ()), add_generation_prompt=False)
            prompt = ("prompt_added", text)
        self._prompted, self._rewrites = len(sent), ctx.prompt_rewrites
        return [prompt, completion]

    def _system_prompt_sha(self, ctx: RunContext) -> str:
        # The system turn as a Hermes model reads it (tools prompt + instructions); computed
        # once per run, it identifies the prompt version a request ran with.
        if self._system_sha is None:
            wire = render_conversation(ctx.messages[:1], ctx.tool_specs)
            system = wire[0]["content"] if wire and wire[0]["role"] == "system" else ""
            self._system_sha = hashlib.sha256(system.encode("utf-8")).hexdigest()
        return self._system_sha


def _contents(ctx: RunContext, stage: str) -> list[tuple[str, str]]:
    if stage == "input":
        return [("user", ctx.user_message)]
    if stage == "selection":
        selection = {
            "planned": [{"name": p.tool.name, "arguments": p.arguments} for p in ctx.planned],
            "rejected": [
                {"name": r.name, "status": r.status_code, "error": r.error} for _, r in ctx.rejected
            ],
        }
        return [("selection", _json(selection))]
    if stage == "execution":
        return [("tool", render_tool_results(ctx.last_results))]
    return [("output", ctx.output)]


def _sent(ctx: RunContext) -> list[Message]:
    # The assistant turn the ThoughtGenerator added is not part of what was sent.
    if ctx.messages and ctx.messages[-1].role == "assistant":
        return ctx.messages[:-1]
    return ctx.messages


def _prompt(ctx: RunContext, sent: list[Message]) -> str:
    render = getattr(ctx.model, "render_prompt", None)
    if render is not None:
        try:
            return str(render(sent, ctx.tool_specs, ctx.turn_settings or ctx.settings))
        except Exception as exc:  # a model that cannot render must not break the run
            return f"(prompt not available: {type(exc).__name__}: {exc})"
    return _json([{"role": m.role, "content": m.content} for m in sent])


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)
