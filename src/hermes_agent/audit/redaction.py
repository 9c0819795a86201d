"""What reaches a store: secrets masked, and text every store can hold.

Redaction is the agent's policy, applied before anything is handed to a store (by the recorder
to audit records, by the agent to session messages), so every backend — SQL, in-memory, or one
written later — receives redacted data, and agents sharing one store each keep their own
secrets out of it. It replaces each secret and each pattern match with ``[REDACTED]``, in plain
text and in the forms a secret takes once serialised: JSON-escaped (a ``"`` or ``\\`` inside a
secret becomes ``\\"`` or ``\\\\``, non-ASCII may become ``\\uXXXX``), also escaped twice
(JSON inside JSON). Inside structured values (tool arguments and results) both keys and values
are redacted.

Storable text (``storable``): a lone surrogate (``"\\ud800"``, which no UTF-8 database can
encode) and NUL (which PostgreSQL refuses in text) are written as the six characters
``\\ud800`` and ``\\u0000``; a valid surrogate pair is joined into its character first.
Nothing else changes. The recorder applies it to every audit record (records are exported as
JSON Lines, which must be UTF-8 anywhere); a store applies it where it encodes text (the SQL
backend to its rows — inside its JSON columns the escape is JSON's own, so such text even reads
back as it was).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from hermes_agent.types import Message, ToolCall, ToolResult

_ESCAPE_DEPTH = 2
"""How many times a secret may have been JSON-escaped and still be found (JSON in JSON)."""

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


class Redactor:
    """Replaces secrets (exact strings, e.g. API keys, and regex patterns) with ``[REDACTED]``.

    >>> redact = Redactor(["sk-a\\"b1"])
    >>> redact('{"key": "sk-a\\\\"b1"}')
    '{"key": "[REDACTED]"}'
    >>> redact.value({"sk-a\\"b1": ["sk-a\\"b1", 3]})
    {'[REDACTED]': ['[REDACTED]', 3]}
    """

    MASK = "[REDACTED]"

    def __init__(self, secrets: Iterable[str] = (), patterns: Iterable[str] = ()) -> None:
        plain = {s for s in secrets if s and len(s) >= 4}
        forms = {form for secret in plain for form in _serialised_forms(secret)}
        # Longest first: an escaped form contains pieces of the plain one.
        self._secrets = sorted(forms, key=len, reverse=True)
        self._patterns = [re.compile(p) for p in patterns]

    def __bool__(self) -> bool:
        return bool(self._secrets or self._patterns)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, self.MASK)
        for pattern in self._patterns:
            text = pattern.sub(self.MASK, text)
        return text

    def value(self, value: Any) -> Any:
        """``value`` with every string in it redacted, dictionary keys included. What is not
        JSON data is redacted as the text a store would keep of it (``str(value)``)."""
        return _walk(value, self) if self else value


def _serialised_forms(secret: str) -> set[str]:
    forms = {secret}
    level = {secret}
    for _ in range(_ESCAPE_DEPTH):
        level = {json.dumps(s, ensure_ascii=a)[1:-1] for s in level for a in (False, True)}
        forms |= level
    return forms


# -- storable text -----------------------------------------------------------------------


def storable(text: str) -> tuple[str, int]:
    """``text`` as every store can hold it, and how many characters were escaped.

    >>> storable("ok")
    ('ok', 0)
    >>> storable("a\\ud800b\\x00")
    ('a\\\\ud800b\\\\u0000', 2)
    >>> storable("\\ud83d\\ude00")  # a surrogate pair is the character it encodes
    ('😀', 0)
    """
    if text.isascii():
        if "\x00" not in text:
            return text, 0
    else:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            # Join valid pairs into their characters first: only what stays lone is escaped.
            text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
        else:
            if "\x00" not in text:
                return text, 0
    escaped = 0

    def escape(match: re.Match[str]) -> str:
        nonlocal escaped
        escaped += 1
        return f"\\u{ord(match.group()):04x}"

    return _UNSTORABLE.sub(escape, text), escaped


def sanitized_note(escaped: int) -> str | None:
    """The ``AuditRecord.sanitized`` text for ``escaped`` replaced characters."""
    if not escaped:
        return None
    plural = "s" if escaped != 1 else ""
    return (
        f"{escaped} character{plural} no store can hold (lone surrogate or NUL) written as \\uXXXX"
    )


def redact_messages(messages: Sequence[Message], redactor: Redactor) -> list[Message]:
    """Messages as a store may keep them: every text redacted, in tool arguments and results
    too (keys included). Without secrets or patterns, the same messages; a message with
    nothing to redact is passed through, not copied."""
    if not redactor:
        return list(messages)
    return [_redact_message(message, redactor) for message in messages]


def _redact_message(message: Message, redact: Redactor) -> Message:
    changes: dict[str, Any] = {}
    for name in ("content", "scratch_pad", "raw"):
        text = getattr(message, name)
        if text and (redacted := redact(text)) != text:
            changes[name] = redacted
    calls = [_redact_call(call, redact) for call in message.tool_calls]
    if any(new is not old for new, old in zip(calls, message.tool_calls, strict=True)):
        changes["tool_calls"] = calls
    results = [_redact_result(result, redact) for result in message.tool_results]
    if any(new is not old for new, old in zip(results, message.tool_results, strict=True)):
        changes["tool_results"] = results
    return replace(message, **changes) if changes else message


def _redact_call(call: ToolCall, redact: Redactor) -> ToolCall:
    arguments = _walk(call.arguments, redact)
    if arguments is call.arguments:
        return call
    return ToolCall(call.name, arguments, call.id)


def _redact_result(result: ToolResult, redact: Redactor) -> ToolResult:
    content = _walk(result.content, redact)
    error = redact(result.error) if result.error else result.error
    if content is result.content and error == result.error:
        return result
    return replace(result, content=content, error=error)


_JSON_SCALARS = (int, float, bool, type(None))


def _walk(value: Any, redact: Redactor) -> Any:
    """``value`` with every string and dictionary key redacted; containers are rebuilt only
    where something changed. What is not JSON data becomes the text a store keeps of it
    (``str``), so that text is redacted too."""
    if isinstance(value, str):
        redacted = redact(value)
        return value if redacted == value else redacted
    if isinstance(value, dict):
        items = [(_walk(k, redact), _walk(v, redact)) for k, v in value.items()]
        if all(nk is k and nv is v for (nk, nv), (k, v) in zip(items, value.items(), strict=True)):
            return value
        return dict(items)
    if isinstance(value, list | tuple):
        walked = [_walk(v, redact) for v in value]
        if all(new is old for new, old in zip(walked, value, strict=True)):
            return value
        return walked if isinstance(value, list) else tuple(walked)
    if isinstance(value, _JSON_SCALARS):
        return value
    return _walk(str(value), redact)
