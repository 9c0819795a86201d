"""Audit records, their roles, and the seam they leave the pipeline through.

Every stage of every step writes one ``AuditRecord`` (the ThoughtGenerator two: the prompt as
sent and the completion as received). Content is the raw string, so a reader sees exactly what
the model and the tools saw — after redaction of secrets, and with the few characters no
database can hold escaped (``sanitized`` says so).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any, Protocol


class Role(StrEnum):
    """What a record's content is. The one list of these names: the recorder writes them,
    replay and the stores read them."""

    USER = "user"
    """The user's message (InputParser)."""
    SUMMARY_PROMPT = "summary_prompt"
    """The request that asked the model to summarise old turns (InputParser, when made)."""
    SUMMARY = "summary"
    """The model's answer to that request."""
    PROMPT = "prompt"
    """The whole prompt as sent (ThoughtGenerator, first request of a run)."""
    PROMPT_ADDED = "prompt_added"
    """The turns added to the prompt since the previous request (ChatML)."""
    COMPLETION = "completion"
    """The model's answer as received (or the model error)."""
    SCRATCH_PAD = "scratch_pad"
    """The model's planning for its turn, apart from its answer and calls: the
    ``<scratch_pad>`` it wrote, or its ``<think>`` thought (ThoughtGenerator; only for a turn
    that had one). Also inside the completion, as received; here on its own to read or audit
    without parsing the turn."""
    REASON = "reason"
    """Explain mode: the one-line reason the model gave for its turn (ThoughtGenerator)."""
    SELECTION = "selection"
    """The calls the ToolSelector planned and refused (JSON)."""
    TOOL = "tool"
    """The ``<tool_response>`` text the model was fed (ToolExecutor)."""
    TOOL_CALLS = "tool_calls"
    """What the caller sees of the step's calls and the model does not: id, name, status and
    metadata (execution time, cache hit, truncation, fallback) of each (ToolExecutor; JSON)."""
    OUTPUT = "output"
    """The final answer (OutputRenderer); one per request."""
    VARIABLES = "variables"
    """The run's variables as the InputParser saw them (JSON; only when there are any)."""
    HOOK = "hook"
    """What a hook did to the run (JSON: ``hook``, ``point``, ``step`` and one of
    ``answered`` {reason, status}, ``rewrote_message`` {from}, ``rewrote_history``
    {from_turns, to_turns}, ``changed_output`` {appended | prepended | replaced},
    ``facts``); written with the stage it happened at."""
    ACCEPTED = "accepted"
    """A run the service admitted, written before anything of it runs, so its id resolves
    from the moment it is given out (JSON: ``status``, ``instance``); stage ``RunManager``,
    ``seq`` -1 (before the run's own records, which count from 0)."""
    STOPPED = "stopped"
    """Why a run ended without an output: cancelled, timed out or failed (JSON ``status`` and
    ``error``; written by the service that stopped it, stage ``RunManager``)."""
    LATE_RESULT = "late_result"
    """A tool call the run abandoned when it was cancelled (a sync in-process tool, which
    cannot be stopped) finished afterwards: JSON ``name``, ``call_id``, ``step``, ``status``
    (``success`` or ``error``) and its ``result`` or ``error``; stage ``RunManager``, written
    after the run's ending. Nothing read it: the run was over."""
    RESUMED = "resumed"
    """A durable run taken up again by a worker (JSON: ``attempt``, ``worker``,
    ``from_step``, ``takeover``); stage ``Worker``. What came before it was not done again."""


@dataclass(slots=True)
class AuditRecord:
    """One stage of one step of one request."""

    request_id: str
    session_id: str
    step: int
    stage: str
    """InputParser, ThoughtGenerator, ToolSelector, ToolExecutor or OutputRenderer."""
    role: str
    """One of ``Role`` (stored as its plain string)."""
    content: str
    timestamp_ns: int
    latency_ms: float
    status: str
    """ok or error."""
    status_code: int
    model_name: str
    system_prompt_sha256: str
    seq: int = 0
    """Position of the record within its request (records are read back in this order)."""
    sanitized: str | None = None
    """What was changed in ``content`` so that every store can hold it (e.g. ``1 lone
    surrogate escaped as \\uXXXX``), or ``None`` when it is stored as made."""

    def to_dict(self) -> dict[str, Any]:
        """Every field, as JSON-ready values (all are scalars: what ``dataclasses.asdict``
        gives, without its recursive copy, which a run's store writes paid per record)."""
        return {name: getattr(self, name) for name in RECORD_FIELDS}


RECORD_FIELDS = tuple(f.name for f in fields(AuditRecord))
"""``AuditRecord``'s field names, in order (the audit table's columns but its id)."""


class AuditSink(Protocol):
    """Where records go.

    ``write`` gets the records of one or more whole steps; a store keeps them together (one
    transaction), so a crash never leaves half a step. It may store them before it returns or
    queue them (see ``storage.writer.WriteBehindSink``). ``flush`` returns once everything
    written so far is stored (or given up on and logged).
    """

    def write(self, records: Sequence[AuditRecord]) -> None: ...

    def flush(self) -> None: ...


def records_to_jsonl(records: Iterable[AuditRecord]) -> str:
    """Records as JSON Lines: one record per line, every field; ``parse_jsonl`` reverses it."""
    return "".join(json.dumps(r.to_dict(), ensure_ascii=False) + "\n" for r in records)


def parse_jsonl(text: str) -> list[AuditRecord]:
    """Records from ``records_to_jsonl`` (or ``export_jsonl``) output. Lines are split on
    ``\\n`` only: a record's text may hold other line separators (U+2028...), which JSON leaves
    unescaped."""
    return [AuditRecord(**json.loads(line)) for line in text.split("\n") if line.strip()]
