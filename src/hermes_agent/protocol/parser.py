"""Model output → ``Completion``: free text, ``<tool_call>`` blocks, ``<scratch_pad>`` and
``<think>`` thoughts.

``parse_completion(text)`` reads a whole completion; ``StreamParser`` reads the same text chunk by
chunk and emits events as it goes. ``parse_completion`` *is* a ``StreamParser`` fed one chunk, so
for any chunking ``StreamParser.close()`` returns what ``parse_completion`` returns for the whole
text (ids drawn from ``new_id`` included, when both get the same sequence).

How a completion is split:

- Text outside the tags is ``content`` (the pieces joined, then stripped of surrounding
  whitespace). Special tokens (``<|im_end|>``, ``<|endoftext|>``, ``<|eot_id|>``,
  ``<|end_of_text|>``, ``<|eom_id|>``) and stray closing tags are dropped from it.
- ``<scratch_pad>...</scratch_pad>`` goes to ``scratch_pad`` (stripped; several pads are joined
  with a newline). Inside a scratch pad only ``</scratch_pad>`` is a tag.
- ``<think>...</think>`` goes to ``thought`` (the same way; an empty thought is none). Inside a
  thought only ``</think>`` is a tag: a ``<tool_call>`` there is text of the thought, never a
  call, and ``notes`` says one was seen. A thought that never closes runs to the end of the
  text (never cut short, unlike a scratch pad, so that no call inside it can escape). A bare
  ``</think>`` before any ``<think>`` means the chat template opened the thought in the prompt:
  everything before it becomes the thought, and whatever was read there as content, calls or
  errors is dropped (``StreamParser`` sends ``ThoughtRevealed``). Feed ``"<think>"`` first when
  the template is known to open it, and the stream is right from the first event.
- A ``<tool_call>`` block (or ``<tools>``, which Qwen2.5-Coder writes instead) ends at either
  closing tag, at the next opening tag (a forgotten closing tag), at ``<think>`` or
  ``</think>``, at a special token, or at the end of the text (an unclosed final block). The
  scan is JSON-aware: tags inside a quoted string (double or single quotes) do not end a block.
  A quote opens a string only where a JSON value or key can start (after ``{ [ , : (`` or at the
  start of the block), so an apostrophe in prose inside a broken block does not.
- Recovery, at most once per completion: a block that yields no call although a tag sits inside
  one of its strings most likely holds a string that never closed and swallowed what followed.
  It is cut at that tag, reported as an error, and the text after the cut is read again. An
  unclosed scratch pad is likewise cut at its first ``<tool_call>`` or special token. (Once
  keeps the cost linear; a second such block is reported whole.)

What a block may hold (lenient in what it accepts):

- ``{"name": ..., "arguments": {...}}`` with the keys in any order, with or without newlines
  around it; ``"parameters"`` instead of ``"arguments"``; an OpenAI-shaped
  ``{"type": "function", "function": {"name": ..., "arguments": ...}}``.
- ``arguments`` as an object, or double-encoded as a JSON string; missing, ``null`` or ``""``
  means ``{}``.
- A JSON list of calls (its commas between objects may be missing), or several objects one
  after another, in one tag.
- Qwen3-Coder's XML: ``<function=NAME><parameter=KEY>VALUE</parameter></function>`` (one or
  more functions; missing closing tags tolerated). Values are text, marked
  ``ToolCall.text_arguments``; the ToolSelector types them from the tool's schema.
- In a ``<tools>`` block, a tool definition echoed from the prompt (a ``description``, or a
  JSON Schema as ``parameters``) is an error, never a call.
- Code fences (```` ```json ... ``` ````) around the JSON.
- Python-style dicts: single quotes, ``True``/``False``/``None``, tuples (read with
  ``ast.literal_eval``, never ``eval``); trailing commas.
- An ``"id"`` is kept; otherwise the call gets a fresh id from ``new_id``.

Exact in what it reports: every block that cannot be turned into calls becomes one
``ParseError(block, message)`` whose message says what was wrong in words a model can act on.
A bad block never hides the good ones around it. Neither entry point raises on any text: a
block nested deeper than ``MAX_NESTING`` levels (``[ { (`` outside strings, JSON or Python
style, double-encoded arguments included) is an error "nested too deeply (max depth 64)" on
both paths, checked before any decoder recurses, and so is a number too long to convert.

Example::

    >>> c = parse_completion('Sure.<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')
    >>> c.content, c.tool_calls[0].name, c.tool_calls[0].arguments
    ('Sure.', 'add', {'a': 1})
"""

from __future__ import annotations

import ast
import itertools
import json
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from hermes_agent.types import Completion, ParseError, ToolCall, new_call_id

__all__ = [
    "MAX_NESTING",
    "NOTE_CALL_IN_THOUGHT",
    "NOTE_REVEALED_THOUGHT",
    "NOTE_UNCLOSED_THOUGHT",
    "SPECIAL_TOKENS",
    "ScratchPadDelta",
    "StreamEvent",
    "StreamParser",
    "TextDelta",
    "ThoughtDelta",
    "ThoughtRevealed",
    "ToolCallArgumentsDelta",
    "ToolCallFinished",
    "ToolCallStarted",
    "decode_value",
    "parse_completion",
]

SPECIAL_TOKENS: Final = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<|eom_id|>",
)
"""End-of-turn tokens that a server may leave in the text; they never reach ``content``."""

_TOOL_OPEN: Final = "<tool_call>"
_TOOL_CLOSE: Final = "</tool_call>"
# Qwen2.5-Coder writes its calls in <tools>, the tag the prompt lists the tools in.
_TOOLS_OPEN: Final = "<tools>"
_TOOLS_CLOSE: Final = "</tools>"
_PAD_OPEN: Final = "<scratch_pad>"
_PAD_CLOSE: Final = "</scratch_pad>"
_THINK_OPEN: Final = "<think>"
_THINK_CLOSE: Final = "</think>"
_BLOCK_OPENERS: Final = (_TOOL_OPEN, _TOOLS_OPEN)
_BLOCK_CLOSERS: Final = (_TOOL_CLOSE, _TOOLS_CLOSE)

# Outside any element: tags that switch mode, plus stray closers and special tokens (dropped).
# A bare </think> is not always dropped: see StreamParser._reveal.
_TEXT_TAGS: Final = (
    *_BLOCK_OPENERS, _PAD_OPEN, _THINK_OPEN, *_BLOCK_CLOSERS, _PAD_CLOSE, _THINK_CLOSE,
    *SPECIAL_TOKENS,
)  # fmt: skip
# Inside a block, outside strings: what ends the block. Only a closing tag belongs to the
# block; an opening tag (or a thought's tag) starts what follows, a special token is dropped.
_BLOCK_END_TAGS: Final = (
    *_BLOCK_CLOSERS, *_BLOCK_OPENERS, _THINK_OPEN, _THINK_CLOSE, *SPECIAL_TOKENS,
)  # fmt: skip
# Where an unclosed scratch pad is cut: the model evidently moved on to calling or stopped.
_PAD_CUT_TAGS: Final = (*_BLOCK_OPENERS, *SPECIAL_TOKENS)
# Inside a thought: its end, a repeated opening tag (dropped), and the call tags that are
# only text there but are worth a note.
_THINK_TAGS: Final = (_THINK_CLOSE, _THINK_OPEN, *_BLOCK_OPENERS)

_LONGEST_TAG: Final = max(len(tag) for tag in _TEXT_TAGS)
_TAG_SECOND_CHARS: Final = frozenset(tag[1] for tag in _TEXT_TAGS)  # every tag is in _TEXT_TAGS

# Returned by _tag_at when the buffer ends inside what may still become a tag.
_PARTIAL: Final = "<partial>"

_TEXT, _BLOCK, _PAD, _THINK = 0, 1, 2, 3

_WHITESPACE: Final = " \t\r\n"
# A quote opens a string only where JSON (or a Python literal) can have one: at the start of
# the block or after one of these. "" stands for the start of the block.
_VALUE_START: Final = frozenset(("", "{", "[", ",", ":", "("))
_OUTSIDE_STRING_STOP: Final = re.compile(r"[\"'<]")
_TAG_START: Final = re.compile("<")
_IN_STRING_STOP: Final = {'"': re.compile(r'[\\"]'), "'": re.compile(r"[\\']")}

# Chunks up to this long may take StreamParser's per-character fast path (token-sized ones).
_FAST_CHUNK: Final = 32

# strict=False lets raw newlines and tabs stand inside strings, as models often write them.
_DECODER: Final = json.JSONDecoder(strict=False)

MAX_NESTING: Final = 64
"""Deepest nesting of ``[ { (`` a block may hold; deeper blocks are a ``ParseError``.

Real tool calls nest a few levels. The decoders recurse once per level, so without a fixed cap
a deep block would parse or fail depending on how deep the caller's stack already is; 64 also
leaves every later stage (validation, copies, serialisation) far from Python's recursion limit.
"""
_TOO_DEEP: Final = f"nested too deeply (max depth {MAX_NESTING})"
# What _too_deep drops: quoted strings (a string that never closes runs to the end) and
# runs of anything but brackets. What is left of a text is its brackets, in order.
_NOT_NESTING: Final = re.compile(
    "|".join(
        (
            r'"[^"\\]*(?:\\.[^"\\]*)*"?',
            r"'[^'\\]*(?:\\.[^'\\]*)*'?",
            r"""[^"'\[\]{}()]+""",
        )
    ),
    re.DOTALL,
)
_NESTING_STEP: Final = {"[": 1, "{": 1, "(": 1, "]": -1, "}": -1, ")": -1}

_HINT: Final = 'write {"name": ..., "arguments": {...}}'
_XML_HINT: Final = "write <function=NAME><parameter=KEY>VALUE</parameter></function>"

NOTE_CALL_IN_THOUGHT: Final = (
    "a <tool_call> written inside the thought was not run: nothing inside <think>...</think> "
    "is ever a call (a call goes after </think>)"
)
NOTE_UNCLOSED_THOUGHT: Final = (
    "the text ended inside <think> (no </think>): all of it after <think> is the thought"
)
NOTE_REVEALED_THOUGHT: Final = (
    "a </think> with no <think> before it: the text before it is the thought (the chat "
    "template opened <think> in the prompt)"
)


# --- events ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TextDelta:
    """More ``content`` text. Never holds part of a tag; ``content`` is all of them, stripped."""

    text: str


@dataclass(frozen=True, slots=True)
class ScratchPadDelta:
    """More text inside a ``<scratch_pad>`` (unstripped)."""

    text: str


@dataclass(frozen=True, slots=True)
class ThoughtDelta:
    """More text inside a ``<think>`` thought (unstripped). Never holds the thought's tags."""

    text: str


@dataclass(frozen=True, slots=True)
class ThoughtRevealed:
    """A bare ``</think>`` (no ``<think>`` before it) showed that everything before it was a
    thought: the chat template opened ``<think>`` in the prompt. ``text`` is that thought, raw;
    every ``TextDelta``, ``ScratchPadDelta`` and tool-call event before this one was part of
    it and is void (its calls were never calls). Comes at most once per stream. A caller that
    knows its template pre-opens ``<think>`` feeds ``"<think>"`` first and never sees this.
    """

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallStarted:
    """A ``<tool_call>`` (or ``<tools>``) tag opened block number ``index`` (0, 1, ... in order
    of appearance)."""

    index: int


@dataclass(frozen=True, slots=True)
class ToolCallArgumentsDelta:
    """Raw text inside block ``index`` as it arrives (JSON, possibly incomplete)."""

    index: int
    delta: str


@dataclass(frozen=True, slots=True)
class ToolCallFinished:
    """Block ``index`` ended and was parsed: exactly one of ``call`` and ``error`` is set.

    A block that holds a list of calls finishes with one event per call, all with its index.
    """

    index: int
    call: ToolCall | None = None
    error: ParseError | None = None


StreamEvent = (
    TextDelta
    | ScratchPadDelta
    | ThoughtDelta
    | ThoughtRevealed
    | ToolCallStarted
    | ToolCallArgumentsDelta
    | ToolCallFinished
)
"""What ``StreamParser.feed`` and ``flush`` return, in stream order."""


# --- public entry points ---------------------------------------------------------------------


def parse_completion(text: str, *, new_id: Callable[[], str] = new_call_id) -> Completion:
    """Split a whole completion into content, tool calls, scratch pad and parse errors.

    ``new_id`` makes ids for calls whose JSON has no ``"id"`` (pass a counter for
    reproducible ids in tests and replays).
    """
    fast = _common_case(text, new_id)
    if fast is not None:
        return fast
    parser = StreamParser(new_id=new_id)
    parser.feed(text)
    return parser.close()


def _common_case(text: str, new_id: Callable[[], str]) -> Completion | None:
    """The two shapes most turns have — plain text, or exactly one clean
    ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` — read without the scanner.
    Only texts with no other ``<`` anywhere qualify, so the answer is the scanner's answer;
    anything else returns ``None`` and takes the full path."""
    if "<" not in text:
        return Completion(content=text.strip())
    body = text.strip()
    if not (
        body.startswith("<tool_call>") and body.endswith("</tool_call>") and body.count("<") == 2
    ):
        return None
    payload = body[len("<tool_call>") : -len("</tool_call>")]
    if _too_deep(payload):
        return None  # the full path words the error
    try:
        item = json.loads(payload)
    except (ValueError, RecursionError, MemoryError):
        return None
    if not (isinstance(item, dict) and item.keys() <= {"name", "arguments", "id"}):
        return None
    name, arguments, call_id = item.get("name"), item.get("arguments"), item.get("id")
    if not (isinstance(name, str) and name.strip() and isinstance(arguments, dict)):
        return None
    if not (isinstance(call_id, str) and call_id):
        call_id = new_id()
    return Completion(tool_calls=[ToolCall(name=name.strip(), arguments=arguments, id=call_id)])


class StreamParser:
    """Incremental ``parse_completion``: ``feed`` chunks, get events; ``close`` for the result.

    Chunk boundaries may fall anywhere, even inside a tag: text that may still turn out to be a
    tag is held back until the next chunk (or ``flush``) decides. The work is linear in the
    length of the stream: each character is scanned once, plus at most one tag's length held
    back per chunk, plus one re-read of a cut-off block in the rare recovery case (see the
    module docstring).

    ``close()`` returns a ``Completion`` equal to ``parse_completion(whole_text)`` for any
    chunking, ids included when both use the same ``new_id`` sequence (ids are drawn in block
    order). Call ``flush()`` before ``close()`` to receive the last events (held-back text and
    the end of an unclosed final block); ``close()`` flushes silently otherwise.

    Example::

        parser = StreamParser()
        for chunk in chunks:
            for event in parser.feed(chunk):
                ...
        for event in parser.flush():
            ...
        completion = parser.close()

    If recovery cuts a block or scratch pad short (a string that never closed), the deltas
    already sent for it ran past the cut; its ``ToolCallFinished`` carries the cut block, and
    the events that follow it describe the text after the cut, read again.
    """

    def __init__(self, *, new_id: Callable[[], str] = new_call_id) -> None:
        self._new_id = new_id
        self._buf = ""  # unread input: what the last chunk left undecided, plus the new chunk
        self._mode = _TEXT
        self._may_recover = True
        self._flushed = False
        self._completion: Completion | None = None
        # What the completion is built from.
        self._content: list[str] = []
        self._calls: list[ToolCall] = []
        self._errors: list[ParseError] = []
        self._pads: list[str] = []
        self._thoughts: list[str] = []
        self._notes: list[str] = []
        # The block, scratch pad or thought being read.
        self._parts: list[str] = []
        self._blocks = 0  # blocks opened so far; the current block is number _blocks - 1
        self._block_tag = _TOOL_OPEN  # the tag that opened the current block
        self._xml = False  # the current block is Qwen3-Coder XML (its quotes are plain text)
        self._call_in_thought = False  # the current thought holds a <tool_call> or <tools>
        # The raw input so far, kept only while no thought has been seen: a bare </think>
        # would make all of it a thought (see _reveal). None once a thought was seen.
        # _buf is always a suffix of the raw input (held back, or put back by a recovery).
        self._fed: list[str] | None = []
        self._keep: Callable[[str], None] | None = self._fed.append  # bound once: per chunk
        self._quote: str | None = None  # the quote of the JSON string we are in, if any
        self._escape = False  # the previous character was a backslash inside a string
        self._prev = ""  # last non-blank character outside strings in this block
        # Characters handed to the scanner, held-back ones counted again (tests check O(n)).
        self._chars_scanned = 0

    def feed(self, chunk: str) -> list[StreamEvent]:
        """Read one more chunk; return the events it completes."""
        if self._flushed:
            raise RuntimeError("StreamParser.feed() after flush() or close()")
        if self._keep is not None:
            self._keep(chunk)
        if not self._buf:  # nothing held back from the last chunk
            fast = self._feed_fast(chunk)
            if fast is not None:
                return fast
        events: list[StreamEvent] = []
        self._buf += chunk
        self._run(events, final=False)
        return events

    def _feed_fast(self, chunk: str) -> list[StreamEvent] | None:
        """Events for a chunk that cannot end or start anything, or None to take the long way.

        Most token-sized chunks are plain text, or JSON that neither opens nor closes a tag:
        for them the scanner would only append and track quotes. Doing that here, without
        the buffer and regex machinery, saves about a quarter of the cost of streaming
        4-character chunks; the property tests check that both ways agree for any chunking.
        """
        if not chunk:
            return []
        mode = self._mode
        if mode == _TEXT:
            if "<" in chunk:
                return None
            self._content.append(chunk)
            event: StreamEvent = TextDelta(chunk)
        elif mode == _BLOCK and len(chunk) <= _FAST_CHUNK:
            quote, escape = self._quote, self._escape
            if quote is not None and not escape and quote not in chunk and "\\" not in chunk:
                pass  # inside a string that goes on (never in XML, where quotes are text)
            elif self._xml:
                if "<" in chunk:
                    return None
            elif quote is None and '"' not in chunk and "'" not in chunk and "<" not in chunk:
                blank_free = chunk.rstrip(_WHITESPACE)
                if blank_free:
                    self._prev = blank_free[-1]
            elif not self._scan_quotes(chunk):
                return None
            self._parts.append(chunk)
            event = ToolCallArgumentsDelta(self._blocks - 1, chunk)
        elif mode == _THINK and "<" not in chunk:
            self._parts.append(chunk)
            event = ThoughtDelta(chunk)
        else:
            return None
        self._chars_scanned += len(chunk)
        return [event]

    def _scan_quotes(self, chunk: str) -> bool:
        """``_scan_block``'s string rules, one character at a time, for a short chunk.

        Returns False, changing nothing, at a "<" outside a string: that may start a tag.
        """
        quote, prev, escape = self._quote, self._prev, self._escape
        for char in chunk:
            if quote is not None:
                if escape:
                    escape = False
                elif char == "\\":
                    escape = True
                elif char == quote:
                    quote, prev = None, char
            elif char in _WHITESPACE:
                continue
            elif char == "<":
                return False
            elif (char == '"' or char == "'") and prev in _VALUE_START:
                quote = char
            else:
                prev = char
        self._quote, self._prev, self._escape = quote, prev, escape
        return True

    def flush(self) -> list[StreamEvent]:
        """Mark the end of the stream; return the last events. Later calls return ``[]``."""
        if self._flushed:
            return []
        events: list[StreamEvent] = []
        self._run(events, final=True)
        while self._mode != _TEXT:  # the text ended inside an element
            self._finish_unclosed(events)  # may put text back to read again
            self._run(events, final=True)
        self._flushed = True
        return events

    def close(self) -> Completion:
        """End the stream (flushing if needed) and return the parsed completion."""
        self.flush()
        if self._completion is None:
            self._completion = Completion(
                content="".join(self._content).strip(),
                tool_calls=self._calls,
                scratch_pad="\n".join(self._pads) if self._pads else None,
                errors=self._errors,
                thought="\n".join(self._thoughts) if self._thoughts else None,
                notes=self._notes,
            )
        return self._completion

    # --- the scanner: one method per mode, each returns (new position, stalled) ---------------

    def _run(self, events: list[StreamEvent], *, final: bool) -> None:
        pos = 0
        self._chars_scanned += len(self._buf)
        while pos < len(self._buf):
            # A scan may replace self._buf (recovery puts cut-off text back in front of it).
            if self._mode == _TEXT:
                pos, stalled = self._scan_text(self._buf, pos, events, final)
            elif self._mode == _BLOCK:
                pos, stalled = self._scan_block(self._buf, pos, events, final)
            elif self._mode == _THINK:
                pos, stalled = self._scan_think(self._buf, pos, events, final)
            else:
                pos, stalled = self._scan_pad(self._buf, pos, events, final)
            if stalled:
                break
        self._buf = self._buf[pos:]  # a possible tag, held back until the next chunk decides

    def _scan_text(
        self, buf: str, pos: int, events: list[StreamEvent], final: bool
    ) -> tuple[int, bool]:
        start = search = pos
        while True:
            i = buf.find("<", search)
            if i < 0:
                self._emit_text(buf[start:], events)
                return len(buf), False
            tag = _tag_at(buf, i, _TEXT_TAGS, final)
            if tag is None:
                search = i + 1
                continue
            self._emit_text(buf[start:i], events)
            if tag == _PARTIAL:
                return i, True
            after = i + len(tag)
            if tag in _BLOCK_OPENERS:
                self._open_block(tag, events)
                return after, False
            if tag == _PAD_OPEN:
                self._mode = _PAD
                return after, False
            if tag == _THINK_OPEN:
                self._mode = _THINK
                self._fed = self._keep = None  # a thought was seen: no </think> reveals one now
                return after, False
            if tag == _THINK_CLOSE and self._fed is not None:
                self._reveal(len(buf) - i, events)
            start = search = after  # a stray closer or special token: dropped

    def _scan_block(
        self, buf: str, pos: int, events: list[StreamEvent], final: bool
    ) -> tuple[int, bool]:
        start, end = pos, len(buf)
        while pos < end:
            quote = self._quote
            if quote is not None:
                if self._escape:
                    self._escape = False
                    pos += 1
                    continue
                found = _IN_STRING_STOP[quote].search(buf, pos)
                if found is None:
                    pos = end
                    break
                j = found.start()
                if buf[j] == "\\":
                    self._escape = True  # the next character, here or in the next chunk
                else:
                    self._quote, self._prev = None, quote
                pos = j + 1
                continue
            found = (_TAG_START if self._xml else _OUTSIDE_STRING_STOP).search(buf, pos)
            j = end if found is None else found.start()
            k = j - 1
            while k >= pos and buf[k] in _WHITESPACE:
                k -= 1
            if k >= pos:
                self._prev = buf[k]
            if found is None:
                pos = end
                break
            if buf[j] != "<":  # a quote
                if self._prev in _VALUE_START:
                    self._quote = buf[j]
                else:
                    self._prev = buf[j]
                pos = j + 1
                continue
            tag = _tag_at(buf, j, _BLOCK_END_TAGS, final)
            if tag is None and self._prev == "" and not self._xml:
                # The block's first word decides: XML values are raw text, so quotes in them
                # open no strings (as the Qwen3-Coder template writes them, and every parser
                # of that format reads them).
                head = buf[j : j + len(_FUNCTION_OPEN)]
                if head == _FUNCTION_OPEN:
                    self._xml = True
                elif not final and j + len(head) == end and _FUNCTION_OPEN.startswith(head):
                    self._emit_block_text(buf[start:j], events)
                    return j, True
            if tag is None:
                self._prev = "<"
                pos = j + 1
                continue
            self._emit_block_text(buf[start:j], events)
            if tag == _PARTIAL:
                return j, True
            rest = self._finish_block("".join(self._parts), events)
            if rest is not None:
                # Read the cut-off text again, then the tag that ended the block, then on.
                self._chars_scanned += len(rest)
                self._reread(rest + buf[j:])
                return 0, False
            return (j + len(tag) if tag in _BLOCK_CLOSERS else j), False
        self._emit_block_text(buf[start:pos], events)
        return pos, False

    def _scan_think(
        self, buf: str, pos: int, events: list[StreamEvent], final: bool
    ) -> tuple[int, bool]:
        # Only </think> ends a thought. A call tag is text here: noted, never opened.
        start = search = pos
        while True:
            i = buf.find("<", search)
            if i < 0:
                self._emit_thought(buf[start:], events)
                return len(buf), False
            tag = _tag_at(buf, i, _THINK_TAGS, final)
            if tag is None:
                search = i + 1
                continue
            if tag in _BLOCK_OPENERS:
                self._call_in_thought = True
                search = i + len(tag)
                continue
            self._emit_thought(buf[start:i], events)
            if tag == _PARTIAL:
                return i, True
            if tag == _THINK_OPEN:  # the model repeated the opening tag: dropped
                start = search = i + len(tag)
                continue
            self._end_thought("".join(self._parts))
            self._parts = []
            self._mode = _TEXT
            return i + len(tag), False

    def _scan_pad(
        self, buf: str, pos: int, events: list[StreamEvent], final: bool
    ) -> tuple[int, bool]:
        i = buf.find(_PAD_CLOSE, pos)
        if i >= 0:
            self._emit_pad_text(buf[pos:i], events)
            self._pads.append("".join(self._parts).strip())
            self._parts = []
            self._mode = _TEXT
            return i + len(_PAD_CLOSE), False
        end = len(buf)
        if not final:
            # Hold back a tail that may be the start of "</scratch_pad>". The tag holds one "<",
            # so only the last "<" can start it.
            k = buf.rfind("<", max(pos, end - len(_PAD_CLOSE) + 1))
            if k >= 0 and _PAD_CLOSE.startswith(buf[k:]):
                end = k
        self._emit_pad_text(buf[pos:end], events)
        return end, end < len(buf)

    # --- building the result ---------------------------------------------------------------

    def _emit_text(self, text: str, events: list[StreamEvent]) -> None:
        if text:
            self._content.append(text)
            events.append(TextDelta(text))

    def _emit_pad_text(self, text: str, events: list[StreamEvent]) -> None:
        if text:
            self._parts.append(text)
            events.append(ScratchPadDelta(text))

    def _emit_thought(self, text: str, events: list[StreamEvent]) -> None:
        if text:
            self._parts.append(text)
            events.append(ThoughtDelta(text))

    def _end_thought(self, text: str) -> None:
        text = text.strip()
        if text:  # an empty <think></think> (thinking switched off) is no thought
            self._thoughts.append(text)
        if self._call_in_thought:
            self._notes.append(NOTE_CALL_IN_THOUGHT)
            self._call_in_thought = False

    def _reveal(self, after: int, events: list[StreamEvent]) -> None:
        """A bare ``</think>`` before any thought, ``after`` characters from the end of the
        input so far: everything before it was a thought that the chat template opened in the
        prompt. What was read as content, scratch pads, calls and errors is dropped; the raw
        text becomes the thought."""
        assert self._fed is not None
        raw = "".join(self._fed)
        raw = raw[: len(raw) - after]
        self._fed = self._keep = None
        if self._blocks or any(opener in raw for opener in _BLOCK_OPENERS):
            self._call_in_thought = True
        self._content, self._calls, self._errors, self._pads = [], [], [], []
        self._notes.append(NOTE_REVEALED_THOUGHT)
        self._end_thought(raw)
        events.append(ThoughtRevealed(raw))

    def _emit_block_text(self, text: str, events: list[StreamEvent]) -> None:
        if text:
            self._parts.append(text)
            events.append(ToolCallArgumentsDelta(self._blocks - 1, text))

    def _open_block(self, tag: str, events: list[StreamEvent]) -> None:
        self._mode = _BLOCK
        self._block_tag = tag
        self._xml = False
        self._parts = []
        self._quote, self._escape, self._prev = None, False, ""
        events.append(ToolCallStarted(self._blocks))
        self._blocks += 1

    def _finish_block(self, block: str, events: list[StreamEvent]) -> str | None:
        """Parse the block and report it; return text to read again if it had to be cut."""
        self._parts = []
        self._mode = _TEXT
        listing = self._block_tag == _TOOLS_OPEN
        results = _parse_block(block, self._new_id, listing=listing)
        cut = None
        if self._may_recover and not any(isinstance(r, ToolCall) for r in results):
            # Any tag left inside the block sat inside a string (outside one it would have
            # ended the block). The block failed to parse, so that string most likely never
            # closed and swallowed what came after it: cut at the tag instead.
            cut = _first_tag(block, 0, _BLOCK_END_TAGS)
        if cut is not None:
            self._may_recover = False
            i, tag = cut
            results = _parse_block(block[:i], self._new_id, listing=listing)
        index = self._blocks - 1
        for result in results:
            if isinstance(result, ToolCall):
                self._calls.append(result)
                events.append(ToolCallFinished(index, call=result))
            else:
                self._errors.append(result)
                events.append(ToolCallFinished(index, error=result))
        if cut is None:
            return None
        return block[i + len(tag) :] if tag in _BLOCK_CLOSERS else block[i:]

    def _finish_unclosed(self, events: list[StreamEvent]) -> None:
        """The text ended inside a block or scratch pad: close it, recovering if it ran on."""
        text = "".join(self._parts)
        if self._mode == _BLOCK:
            rest = self._finish_block(text, events)
            if rest is not None:
                self._reread(rest)
            return
        self._parts = []
        if self._mode == _THINK:
            # Never cut like a scratch pad: a call inside a thought must not become one
            # because the thought ran to the end of the text.
            self._mode = _TEXT
            self._notes.append(NOTE_UNCLOSED_THOUGHT)
            self._end_thought(_strip_special_suffix(text))
            return
        self._mode = _TEXT
        cut = _first_tag(text, 0, _PAD_CUT_TAGS) if self._may_recover else None
        if cut is None:
            self._pads.append(_strip_special_suffix(text).strip())
            return
        self._may_recover = False
        self._pads.append(text[: cut[0]].strip())
        self._reread(text[cut[0] :])

    def _reread(self, text: str) -> None:
        """Make ``text`` the unread input (recovery; at most once per stream)."""
        self._buf = text


def _tag_at(buf: str, i: int, tags: tuple[str, ...], final: bool) -> str | None:
    """The tag among ``tags`` at ``buf[i]``; ``_PARTIAL`` if the buffer ends inside one."""
    head = buf[i : i + _LONGEST_TAG]
    if len(head) > 1 and head[1] not in _TAG_SECOND_CHARS:
        return None  # the common "<" of prose or code: rejected on one character
    for tag in tags:
        if head.startswith(tag):
            return tag
    if not final and i + len(head) == len(buf) and any(tag.startswith(head) for tag in tags):
        return _PARTIAL
    return None


def _first_tag(text: str, start: int, tags: tuple[str, ...]) -> tuple[int, str] | None:
    """Position and text of the first of ``tags`` in ``text`` from ``start``, if any."""
    hits = [(i, tag) for tag in tags if (i := text.find(tag, start)) >= 0]
    return min(hits) if hits else None


def _strip_special_suffix(text: str) -> str:
    text = text.rstrip()
    while text.endswith(SPECIAL_TOKENS):
        text = next(text[: -len(t)] for t in SPECIAL_TOKENS if text.endswith(t)).rstrip()
    return text


# --- one block → calls or errors ---------------------------------------------------------


class _InvalidJSON(ValueError):
    """Text that neither JSON nor the small repairs could read; the message says why."""


def _parse_block(
    block: str, new_id: Callable[[], str], *, listing: bool = False
) -> list[ToolCall | ParseError]:
    """Everything one ``<tool_call>`` block holds, in order; at least one entry.

    ``listing``: the block was opened by ``<tools>``, where a model may also echo the tool
    definitions of its prompt; those are refused, never run with their schema as arguments.
    """
    text = _strip_fence(_strip_special_suffix(block).strip())
    if not text:
        return [ParseError(block, f"empty <tool_call>: {_HINT} between the tags")]
    if text.startswith(_FUNCTION_OPEN):
        return _xml_calls(text, block, new_id)
    try:
        value = _loads_lenient(text)
        if isinstance(value, str):  # the whole call double-encoded as a JSON string
            value = _loads_lenient(value)
    except _InvalidJSON as exc:
        return [ParseError(block, f"invalid JSON in <tool_call>: {exc}; {_HINT}")]
    if not isinstance(value, list):
        return [_call_from(value, block, new_id, where="", listing=listing)]
    if not value:
        return [ParseError(block, f"<tool_call> holds an empty list; {_HINT}")]
    return [
        _call_from(
            item, block, new_id, where=f"item {n} of the list in <tool_call>: ", listing=listing
        )
        for n, item in enumerate(value, 1)
    ]


def _call_from(
    item: Any, block: str, new_id: Callable[[], str], where: str, *, listing: bool = False
) -> ToolCall | ParseError:
    if not isinstance(item, dict):
        return ParseError(block, f"{where}expected a JSON object, got {_kind(item)}; {_HINT}")
    function = item.get("function")
    source: dict[str, Any] = function if isinstance(function, dict) else item  # OpenAI shape
    if listing and _is_definition(source):
        return ParseError(
            block,
            f"{where}<tools> holds a tool definition, not a call; to call a tool write "
            '<tool_call>{"name": ..., "arguments": {...}}</tool_call>',
        )
    name = source.get("name")
    if name is None:
        return ParseError(block, f'{where}tool call has no "name"; {_HINT}')
    if not isinstance(name, str) or not name.strip():
        return ParseError(block, f'{where}"name" must be a non-empty string, got {name!r}; {_HINT}')
    raw = source["arguments"] if "arguments" in source else source.get("parameters")
    arguments = _arguments(raw)
    if isinstance(arguments, str):
        return ParseError(block, f"{where}{arguments}")
    call_id = item.get("id")
    if not (isinstance(call_id, str) and call_id):
        call_id = new_id()
    return ToolCall(name=name.strip(), arguments=arguments, id=call_id)


def _is_definition(source: dict[str, Any]) -> bool:
    """A tool definition as the prompt lists them: a description, or a JSON Schema for
    ``parameters``. A call has neither."""
    if "description" in source:
        return True
    schema = source.get("parameters")
    return isinstance(schema, dict) and schema.get("type") == "object" and "properties" in schema


# --- Qwen3-Coder XML calls ---------------------------------------------------------------

_FUNCTION_OPEN: Final = "<function="
_FUNCTION_CLOSE: Final = "</function>"
_PARAMETER_OPEN: Final = "<parameter="
_PARAMETER_CLOSE: Final = "</parameter>"
# One regex for the four tags, so each search moves forward: linear however many parameters.
_XML_TAG: Final = re.compile("<function=|</function>|<parameter=|</parameter>")
_XML_NAME: Final = re.compile(r"[^\s<>]+")


class _InvalidXML(ValueError):
    """The XML form of a block is broken; the message says where."""


def _xml_calls(text: str, block: str, new_id: Callable[[], str]) -> list[ToolCall | ParseError]:
    """``<function=NAME><parameter=KEY>VALUE</parameter>...</function>``, one or more.

    Lenient about missing closing tags (a parameter also ends at the next tag, a function at
    the next ``<function=`` or the end of the block); anything but blanks outside the elements
    makes the block one error. Values stay text (``ToolCall.text_arguments``): only the tool's
    schema knows whether ``3`` is a number or a string. One newline right after the opening
    tag and one right before the closing tag are the layout the Qwen3-Coder template writes,
    and are dropped; other blanks belong to the value.
    """
    results: list[ToolCall | ParseError] = []
    pos = 0
    try:
        while (found := _XML_TAG.search(text, pos)) is not None:
            _blank_or_fail(text, pos, found.start(), "between the functions")
            if found.group() != _FUNCTION_OPEN:
                raise _InvalidXML(f"{found.group()} outside a <function=...>")
            name, pos = _xml_name(text, found.end(), "function")
            arguments, problem, pos = _xml_parameters(text, pos)
            if problem is not None:
                results.append(ParseError(block, f"invalid XML call to {name!r}: {problem}"))
            else:
                results.append(ToolCall(name, arguments, new_id(), text_arguments=True))
        _blank_or_fail(text, pos, len(text), "after the last function")
    except _InvalidXML as exc:
        return [ParseError(block, f"invalid XML call in <tool_call>: {exc}; {_XML_HINT}")]
    return results


def _xml_parameters(text: str, pos: int) -> tuple[dict[str, str], str | None, int]:
    """The parameters of one function from ``pos``; (arguments, problem, where it ended)."""
    arguments: dict[str, str] = {}
    problem = None
    while True:
        found = _XML_TAG.search(text, pos)
        end = len(text) if found is None else found.start()
        _blank_or_fail(text, pos, end, "between the parameters")
        if found is None:
            return arguments, problem, end  # an unclosed function ends with the block
        tag = found.group()
        if tag == _FUNCTION_CLOSE:
            return arguments, problem, found.end()
        if tag == _FUNCTION_OPEN:
            return arguments, problem, found.start()  # a forgotten </function>
        if tag == _PARAMETER_CLOSE:
            raise _InvalidXML("</parameter> without its <parameter=...>")
        key, start = _xml_name(text, found.end(), "parameter")
        after = _XML_TAG.search(text, start)
        stop = len(text) if after is None else after.start()
        value = text[start:stop]
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        if key in arguments and problem is None:
            problem = f"parameter {key!r} is given twice; give each parameter once"
        arguments[key] = value
        pos = after.end() if after is not None and after.group() == _PARAMETER_CLOSE else stop


def _xml_name(text: str, pos: int, what: str) -> tuple[str, int]:
    """The name in ``<function=NAME>`` / ``<parameter=NAME>`` from ``pos``, and what follows."""
    close = text.find(">", pos)
    name = text[pos:close].strip() if close >= 0 else ""
    if close < 0 or not _XML_NAME.fullmatch(name):
        shown = text[pos : pos + 40]
        raise _InvalidXML(f"<{what}= must be followed by a name and '>', got {shown!r}")
    return name, close + 1


def _blank_or_fail(text: str, start: int, end: int, where: str) -> None:
    if text[start:end].strip():
        stray = text[start:end].strip()
        shown = stray if len(stray) <= 40 else stray[:40] + "…"
        raise _InvalidXML(f"unexpected text {shown!r} {where}")


def _arguments(value: Any) -> dict[str, Any] | str:
    """The arguments as a dict, or a message saying what is wrong with them."""
    # Decode at most twice: models sometimes encode the arguments string once more.
    for _ in range(2):
        if value is None or (isinstance(value, str) and not value.strip()):
            return {}
        if not isinstance(value, str):
            break
        try:
            value = _loads_lenient(value)
        except _InvalidJSON as exc:
            return (
                f'"arguments" is a string that is not valid JSON ({exc}); '
                'pass an object: "arguments": {...}'
            )
    if isinstance(value, dict):
        return value
    return f'"arguments" must be a JSON object, got {_kind(value)}; {_HINT}'


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int | float):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "null"
    return type(value).__name__


_FENCE_LANGUAGE: Final = re.compile(r"[A-Za-z0-9_+.-]*")


def _strip_fence(text: str) -> str:
    """Text inside a Markdown code fence (with or without a language); an unclosed one too."""
    if not text.startswith("```"):
        return text
    language = _FENCE_LANGUAGE.match(text, 3)
    text = text[language.end() if language else 3 :].strip()
    if text.endswith("```"):
        text = text[:-3]
    return text.strip()


def decode_value(text: str) -> Any:
    """One value written as text, read as leniently as a ``<tool_call>`` block: JSON, then
    trailing and missing commas repaired, then a Python-style literal (single quotes,
    ``True``/``None``). Raises ``ValueError`` with a message a model can act on. The
    ToolSelector types the text values of XML calls with it."""
    try:
        return _loads_lenient(text.strip())
    except _InvalidJSON as exc:
        raise ValueError(str(exc)) from None


def _loads_lenient(text: str) -> Any:
    """JSON, then a few explicit repairs; raises ``_InvalidJSON`` with JSON's own complaint."""
    if _too_deep(text):
        raise _InvalidJSON(_TOO_DEEP)
    try:
        return _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        first = exc
    except RecursionError:  # a caller that is itself deep in the stack
        raise _InvalidJSON(_TOO_DEEP) from None
    except ValueError as exc:  # not a syntax error: int() refused a number with too many digits
        raise _InvalidJSON(
            f"a number is too long ({_first_clause(exc)}); send it as a string"
        ) from None
    except MemoryError:
        raise _InvalidJSON("too large to read") from None
    repaired = _map_outside_strings(text, _repair_commas)
    for attempt in (_json_sequence, _python_literal):
        try:
            return attempt(repaired)
        except Exception:
            # Untrusted text through a best-effort repair: any failure (ast.literal_eval alone
            # has six kinds) only means "not this way"; JSON's complaint is the one reported.
            continue
    where = "char" if first.msg.endswith(" at") else "at char"  # "Unterminated string starting at"
    raise _InvalidJSON(f"{first.msg} {where} {first.pos}") from None


def _too_deep(text: str) -> bool:
    """Whether ``[ { (`` nest deeper than ``MAX_NESTING`` outside quoted strings in ``text``.

    Exact for JSON and for Python literals without comments. Where it is off (broken text, a
    ``#`` comment holding a quote) the decoders' own limits still stop the descent, and their
    errors are caught. Linear, and nearly free for the usual text with few brackets.
    """
    if text.count("[") + text.count("{") + text.count("(") <= MAX_NESTING:
        return False
    brackets = _NOT_NESTING.sub("", text)
    depths = itertools.accumulate(map(_NESTING_STEP.__getitem__, brackets))
    return max(depths, default=0) > MAX_NESTING


def _first_clause(exc: BaseException) -> str:
    """The part of an exception's message before any advice meant for programmers."""
    return str(exc).split(";", 1)[0]


def _json_sequence(text: str) -> Any:
    """JSON with trailing commas removed; several values in a row become a list."""
    values: list[Any] = []
    pos = 0
    while True:
        value, pos = _DECODER.raw_decode(text, pos)
        values.append(value)
        # Between values: only blanks and at most one comma.
        while pos < len(text) and text[pos] in _WHITESPACE:
            pos += 1
        if pos < len(text) and text[pos] == ",":
            pos += 1
            while pos < len(text) and text[pos] in _WHITESPACE:
                pos += 1
        if pos == len(text):
            return values[0] if len(values) == 1 else values


def _python_literal(text: str) -> Any:
    """A Python-style literal (single quotes, True/None, tuples) as plain JSON values."""
    source = _map_outside_strings(text, _json_words_to_python)
    with warnings.catch_warnings():
        # Model output such as '\d' would make the compiler warn about escapes on every call.
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        return _jsonable(ast.literal_eval(source))


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _jsonable(v) for k, v in value.items()}
    raise ValueError(f"{type(value).__name__} is not a JSON value")


_ANY_QUOTE: Final = re.compile(r"[\"']")
_TRAILING_COMMA: Final = re.compile(r",(\s*[}\]])")
_MISSING_COMMA: Final = re.compile(r"\}(\s*)\{")
_JSON_WORD: Final = re.compile(r"\b(true|false|null)\b")
_PYTHON_WORDS: Final = {"true": "True", "false": "False", "null": "None"}


def _map_outside_strings(text: str, repair: Callable[[str], str]) -> str:
    """Apply ``repair`` to the parts of ``text`` outside quoted strings, so values stay intact.

    One forward pass (a regex that retried every quote would be quadratic on broken input);
    a string that never closes runs to the end.
    """
    out: list[str] = []
    done = 0
    while (opening := _ANY_QUOTE.search(text, done)) is not None:
        start = opening.start()
        end = _string_end(text, start + 1, text[start])
        out.append(repair(text[done:start]))
        out.append(text[start:end])
        done = end
    out.append(repair(text[done:]))
    return "".join(out)


def _string_end(text: str, pos: int, quote: str) -> int:
    """Index just past the quote that closes a string whose body starts at ``pos``."""
    stop = _IN_STRING_STOP[quote]
    while (found := stop.search(text, pos)) is not None:
        if text[found.start()] == quote:
            return found.end()
        pos = found.start() + 2  # a backslash escapes the next character
    return len(text)


def _repair_commas(code: str) -> str:
    """Drop trailing commas, and add the comma between two objects that lack one (a list of
    calls written as ``[{...} {...}]``; valid JSON never has ``}`` then ``{`` without one)."""
    return _MISSING_COMMA.sub(r"},\1{", _TRAILING_COMMA.sub(r"\1", code))


def _json_words_to_python(code: str) -> str:
    return _JSON_WORD.sub(lambda m: _PYTHON_WORDS[m.group()], code)
