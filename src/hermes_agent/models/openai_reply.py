"""What an OpenAI-compatible server answers, read as the plain JSON it is.

``OpenAICompatible`` asks the SDK for the reply's decoded JSON (``cast_to=object``) instead of
its response models: building a ``ChatCompletionChunk`` for every chunk of a stream, and a
``ChatCompletion`` for a whole reply, was about a tenth of what the service spends on a run
(docs/benchmarks.md, issue 29), and nothing here needs more than a few of their fields. The SDK
keeps everything else: auth headers, retries, timeouts, error classes, the SSE decoding.

The reply is the server's, so it is untrusted: every reader takes any JSON value and returns
only what has the expected type — a field of the wrong type reads as absent (the caller then
reports an empty reply, as for a server that sent nothing) — and a reply that is not a JSON
object at all is refused by the model with a message that says what came instead
(``describe``).
"""

from __future__ import annotations

import json
from typing import Any

from hermes_agent.protocol.chatml import to_json

JSON = dict[str, Any]


def as_object(data: object) -> JSON | None:
    """The reply as a JSON object, or ``None``. The SDK hands back a body whose content type
    is not JSON as its text (a server that sends its JSON as ``text/plain``, or with no type):
    that text is decoded here, as the SDK decodes it for its own models."""
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except ValueError:
            return None
    return data if isinstance(data, dict) else None


def describe(data: object) -> str:
    """What came instead of a JSON object, for the error that says so."""
    if isinstance(data, str):
        shown = " ".join(data[:400].split())[:200]
        return f"text, not a JSON object: {shown!r}"
    return f"JSON that is not an object: a {type(data).__name__}"


def _field(value: JSON | None, key: str) -> Any:
    """``value[key]``, or ``None`` when there is no such value or key."""
    return value.get(key) if value is not None else None


def first_choice(reply: JSON) -> JSON | None:
    """The reply's first choice, if it has one that is an object."""
    choices = reply.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return None


def part(value: JSON | None, key: str) -> JSON | None:
    """``value[key]`` when it is an object (a choice's ``message`` or ``delta``)."""
    found = _field(value, key)
    return found if isinstance(found, dict) else None


def text(value: JSON | None, key: str) -> str:
    """``value[key]`` when it is a string, else ``""``."""
    found = _field(value, key)
    return found if isinstance(found, str) else ""


def tool_calls(message: JSON | None) -> list[JSON]:
    """A message's or a delta's ``tool_calls``: the entries that are objects."""
    found = _field(message, "tool_calls")
    if not isinstance(found, list):
        return []
    return [call for call in found if isinstance(call, dict)]


def reasoning(message: JSON | None) -> str:
    """A server's reasoning text on a message or a stream delta: ``reasoning_content`` (vLLM,
    llama.cpp's server, SGLang, DeepSeek) or ``reasoning`` (newer vLLM, OpenRouter)."""
    for key in ("reasoning_content", "reasoning"):
        found = text(message, key)
        if found:
            return found
    return ""


def count(usage: object, key: str) -> int:
    """A token count of ``usage``: a non-negative integer, else 0."""
    found = usage.get(key) if isinstance(usage, dict) else None
    if isinstance(found, int) and not isinstance(found, bool) and found >= 0:
        return found
    return 0


def content(message: JSON | None) -> str:
    """A message's or a delta's ``content``: a string as is, a list of parts as the text of its
    ``text`` parts (some servers send ``[{"type": "text", "text": ...}]``), else ``""``."""
    found = _field(message, "content")
    if isinstance(found, list):
        return "".join(text(part, "text") for part in found if isinstance(part, dict))
    return found if isinstance(found, str) else ""


def name(function: JSON | None) -> str:
    """A call's function ``name``: a string as is; another value as its JSON, so that the call
    is still one the model hears about (an unknown tool), not one that vanishes."""
    found = _field(function, "name")
    if found is None or isinstance(found, str):
        return found or ""
    return to_json(found)


def call_index(call: JSON) -> int | str | None:
    """A streamed call delta's ``index`` (which call it continues): an integer, or a string
    some servers send in its place; ``None`` when absent."""
    found = call.get("index")
    return found if isinstance(found, int | str) and not isinstance(found, bool) else None


def arguments_text(function: JSON | None) -> str:
    """A call's (or a call delta's) ``arguments`` as text: the JSON string the API sends, as
    is; an object some servers send in its place, as its JSON; absent, ``""``. Anything else
    is kept as its JSON too, so that decoding it reports what it was."""
    found = _field(function, "arguments")
    if not found:  # absent, null, or an empty value: no text (a stream's next piece follows)
        return ""
    if isinstance(found, str):
        return found
    return to_json(found)
