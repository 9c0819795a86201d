"""Audit records and the seam they leave the pipeline through.

Every stage of every step writes one ``AuditRecord`` (the ThoughtGenerator two: the prompt as
sent and the completion as received). Content is the raw string, so a reader sees exactly what
the model and the tools saw — after redaction of secrets.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol


@dataclass(slots=True)
class AuditRecord:
    """One stage of one step of one request."""

    request_id: str
    session_id: str
    step: int
    stage: str
    """InputParser, ThoughtGenerator, ToolSelector, ToolExecutor or OutputRenderer."""
    role: str
    """user, prompt, completion, selection, tool or output."""
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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class AuditSink(Protocol):
    """Where records go. ``write`` gets the records of one step (written together, so a crash
    never leaves half a step); ``flush`` returns once everything written so far is stored."""

    def write(self, records: Sequence[AuditRecord]) -> None: ...

    def flush(self) -> None: ...


class Redactor:
    """Replaces secrets (exact strings, e.g. API keys, and regex patterns) with ``[REDACTED]``."""

    MASK = "[REDACTED]"

    def __init__(self, secrets: Iterable[str] = (), patterns: Iterable[str] = ()) -> None:
        self._secrets = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)
        self._patterns = [re.compile(p) for p in patterns]

    def __bool__(self) -> bool:
        return bool(self._secrets or self._patterns)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, self.MASK)
        for pattern in self._patterns:
            text = pattern.sub(self.MASK, text)
        return text
