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
  thought only ``</think>`` ends it, even inside a quoted string. A ``<tool_call>`` (or
  ``<tools>``) block there stays text of the thought (streamed as ``ThoughtDelta``) and is
  never one of ``tool_calls``: its calls go to ``thought_calls`` (a broken block is only text),
  and ``notes`` says one was seen; whether they run is the caller's thought policy. A
  repeated ``<think>`` inside a thought is a line break (``"\n"``), so the words either side
  of it stay apart. A thought that never closes runs to the end of the text (never cut short,
  unlike a scratch pad, so that no call inside it can escape).
- A template that opens the thought in the prompt (QwQ, DeepSeek-R1 distills: the prompt ends
  with ``<think>``) makes a completion that starts inside it. ``in_thought=True`` (both entry
  points) reads it so from the first character: nothing of it is ever streamed as content.
  Without it, a bare ``</think>`` before any ``<think>`` shows it after the fact: all before
  it becomes the thought, its calls ``thought_calls``, and whatever else was read there as
  content or errors is dropped (``StreamParser`` sends ``ThoughtRevealed``).
- A ``<tool_call>`` block (or ``<tools>``, which Qwen2.5-Coder writes instead) ends at either
  closing tag, at the next opening tag (a forgotten closing tag), at ``<think>`` or
  ``</think>``, at a special token, or at the end of the text (an unclosed final block). The
  scan is JSON-aware: tags inside a quoted string (double or single quotes) do not end a block.
  A quote opens a string only where a JSON value or key can start (after ``{ [ , : (`` or at the
  start of the block), so an apostrophe in prose inside a broken block does not.
- A bare ``<function=NAME>...</function>`` (Qwen3-Coder's call with no ``<tool_call>`` around
  it) is not content and never a call: it runs to its ``</function>`` (or to whatever would end
  a block) and is one ``ParseError`` (``BARE_FUNCTION``), streamed as a block of its own.
- Recovery, at most once per completion: a block that yields no call although a tag sits inside
  one of its strings most likely holds a string that never closed and swallowed what followed.
  It is cut at that tag, reported as an error, and the text after the cut is read again. An
  unclosed scratch pad is likewise cut at its first ``<tool_call>`` or special token. (Once
  keeps the cost linear; a second such block is reported whole.)

What a block may hold, and how a broken one is reported, is ``protocol.decoding``'s job (JSON
repairs, Python-style literals, Qwen3-Coder's XML functions). Neither entry point raises on any
text: every block that cannot be turned into calls becomes one ``ParseError(block, message)``,
and a bad block never hides the good ones around it. A block nested deeper than
``MAX_NESTING`` levels is an error "nested too deeply (max depth 64)" on both paths.

Example::

    >>> c = parse_completion('Sure.<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')
    >>> c.content, c.tool_calls[0].name, c.tool_calls[0].arguments
    ('Sure.', 'add', {'a': 1})
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

from hermes_agent.protocol.decoding import FUNCTION_OPEN as _FUNCTION_OPEN
from hermes_agent.protocol.decoding import IN_STRING_STOP as _IN_STRING_STOP
from hermes_agent.protocol.decoding import MAX_NESTING, SPECIAL_TOKENS, decode_value, loads_finite
from hermes_agent.protocol.decoding import WHITESPACE as _WHITESPACE
from hermes_agent.protocol.decoding import parse_block as _parse_block
from hermes_agent.protocol.decoding import strip_special_suffix as _strip_special_suffix
from hermes_agent.protocol.decoding import too_deep as _too_deep
from hermes_agent.protocol.stream_events import (
    ScratchPadDelta,
    StreamEvent,
    TextDelta,
    ThoughtDelta,
    ThoughtRevealed,
    ToolCallArgumentsDelta,
    ToolCallFinished,
    ToolCallStarted,
)
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

_FUNCTION_CLOSE: Final = "</function>"

# Outside any element: tags that switch mode, plus stray closers and special tokens (dropped).
# A bare </think> is not always dropped: see StreamParser._reveal. A bare <function= opens a
# call written outside <tool_call>: reported, never content (see _scan_bare).
_TEXT_TAGS: Final = (
    *_BLOCK_OPENERS, _PAD_OPEN, _THINK_OPEN, *_BLOCK_CLOSERS, _PAD_CLOSE, _THINK_CLOSE,
    *SPECIAL_TOKENS, _FUNCTION_OPEN,
)  # fmt: skip
# Inside a block, outside strings: what ends the block. Only a closing tag belongs to the
# block; an opening tag (or a thought's tag) starts what follows, a special token is dropped.
_BLOCK_END_TAGS: Final = (
    *_BLOCK_CLOSERS, *_BLOCK_OPENERS, _THINK_OPEN, _THINK_CLOSE, *SPECIAL_TOKENS,
)  # fmt: skip
# What ends a bare <function=...>: its closing tag (or a block's, kept with it), or whatever
# would end a block (not kept: read next).
_BARE_CLOSERS: Final = (_FUNCTION_CLOSE, *_BLOCK_CLOSERS)
_BARE_END_TAGS: Final = (*_BARE_CLOSERS, *_BLOCK_END_TAGS)
BARE_FUNCTION: Final = (
    "a <function=...> call outside <tool_call>...</tool_call> is not run; write the call "
    "inside <tool_call>...</tool_call>"
)
# Where an unclosed scratch pad is cut: the model evidently moved on to calling or stopped.
_PAD_CUT_TAGS: Final = (*_BLOCK_OPENERS, *SPECIAL_TOKENS)
# Inside a thought: its end, a repeated opening tag (a line break), and the call tags that
# open a block read into thought_calls (its text stays the thought's).
_THINK_TAGS: Final = (_THINK_CLOSE, _THINK_OPEN, *_BLOCK_OPENERS)

_LONGEST_TAG: Final = max(len(tag) for tag in _TEXT_TAGS)
_TAG_SECOND_CHARS: Final = frozenset(tag[1] for tag in _TEXT_TAGS)  # every tag is in _TEXT_TAGS

# Returned by _tag_at when the buffer ends inside what may still become a tag.
_PARTIAL: Final = "<partial>"

_TEXT, _BLOCK, _PAD, _THINK, _BARE = 0, 1, 2, 3, 4

# A quote opens a string only where JSON (or a Python literal) can have one: at the start of
# the block or after one of these. "" stands for the start of the block.
_VALUE_START: Final = frozenset(("", "{", "[", ",", ":", "("))
_OUTSIDE_STRING_STOP: Final = re.compile(r"[\"'<]")
_TAG_START: Final = re.compile("<")

# Chunks up to this long may take StreamParser's per-character fast path (token-sized ones).
_FAST_CHUNK: Final = 32

NOTE_CALL_IN_THOUGHT: Final = (
    "a <tool_call> written inside the thought was not run: nothing inside <think>...</think> "
    "is ever a call (a call goes after </think>)"
)
"""The parser's word; a pipeline whose thought policy runs such calls says so instead."""
NOTE_UNCLOSED_THOUGHT: Final = (
    "the text ended inside <think> (no </think>): all of it after <think> is the thought"
)
NOTE_REVEALED_THOUGHT: Final = (
    "a </think> with no <think> before it: the text before it is the thought (the chat "
    "template opened <think> in the prompt)"
)


# --- public entry points ---------------------------------------------------------------------


def parse_completion(
    text: str, *, new_id: Callable[[], str] = new_call_id, in_thought: bool = False
) -> Completion:
    """Split a whole completion into content, tool calls, scratch pad and parse errors.

    ``new_id`` makes ids for calls whose JSON has no ``"id"`` (pass a counter for
    reproducible ids in tests and replays). ``in_thought``: the chat template opened
    ``<think>`` in the prompt, so the text starts inside the thought.
    """
    fast = None if in_thought else _common_case(text, new_id)
    if fast is not None:
        return fast
    parser = StreamParser(new_id=new_id, in_thought=in_thought)
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
        item = loads_finite(payload)  # NaN or Infinity: the full path words the error
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

    def __init__(
        self, *, new_id: Callable[[], str] = new_call_id, in_thought: bool = False
    ) -> None:
        self._new_id = new_id
        self._buf = ""  # unread input: what the last chunk left undecided, plus the new chunk
        self._mode = _THINK if in_thought else _TEXT
        self._may_recover = True
        self._flushed = False
        self._completion: Completion | None = None
        # What the completion is built from.
        self._content: list[str] = []
        self._calls: list[ToolCall] = []
        self._thought_calls: list[ToolCall] = []
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
        # The thought's parts while a block inside it is read (its text is both), else None.
        self._thought_parts: list[str] | None = None
        self._close_in, self._close_at = "", -1  # where the next </think> is, in which buffer
        # The raw input so far, kept only while no thought has been seen: a bare </think>
        # would make all of it a thought (see _reveal). None once a thought was seen.
        # _buf is always a suffix of the raw input (held back, or put back by a recovery).
        self._fed: list[str] | None = None if in_thought else []
        # Bound once: called per chunk.
        self._keep: Callable[[str], None] | None = None if self._fed is None else self._fed.append
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
        if self._thought_parts is not None and "<" in chunk:
            return None  # a block inside a thought ends at </think>, even inside a string
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
            if self._thought_parts is None:
                event = ToolCallArgumentsDelta(self._blocks - 1, chunk)
            else:
                self._thought_parts.append(chunk)
                event = ThoughtDelta(chunk)
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
                thought_calls=self._thought_calls,
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
            elif self._mode == _BLOCK and self._thought_parts is not None:
                pos, stalled = self._scan_thought_block(self._buf, pos, events, final)
            elif self._mode == _BLOCK:
                pos, stalled = self._scan_block(self._buf, pos, events, final)
            elif self._mode == _THINK:
                pos, stalled = self._scan_think(self._buf, pos, events, final)
            elif self._mode == _BARE:
                pos, stalled = self._scan_bare(self._buf, pos, events, final)
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
            if tag == _FUNCTION_OPEN:
                self._open_block(tag, events)
                self._mode = _BARE
                self._emit_block_text(tag, events)
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
        self, buf: str, pos: int, events: list[StreamEvent], final: bool, stop: int = -1
    ) -> tuple[int, bool]:
        start, end = pos, len(buf) if stop < 0 else stop  # stop: read no further
        while pos < end:
            quote = self._quote
            if quote is not None:
                if self._escape:
                    self._escape = False
                    pos += 1
                    continue
                found = _IN_STRING_STOP[quote].search(buf, pos, end)
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
            found = (_TAG_START if self._xml else _OUTSIDE_STRING_STOP).search(buf, pos, end)
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
            if self._thought_parts is not None:
                kept = j + len(tag) if tag in _BLOCK_CLOSERS else j
                self._finish_thought_block()
                self._emit_thought(buf[j:kept], events)  # the closing tag is the thought's too
                return kept, False
            rest = self._finish_block("".join(self._parts), events)
            if rest is not None:
                # Read the cut-off text again, then the tag that ended the block, then on.
                self._chars_scanned += len(rest)
                self._reread(rest + buf[j:])
                return 0, False
            return (j + len(tag) if tag in _BLOCK_CLOSERS else j), False
        self._emit_block_text(buf[start:pos], events)
        return pos, False

    def _scan_thought_block(
        self, buf: str, pos: int, events: list[StreamEvent], final: bool
    ) -> tuple[int, bool]:
        # Read like any block up to the first </think> (or a tail that may become one), which
        # ends it wherever it stands, inside a string too. No tag straddles that point (a tag
        # holds one "<"), so the part before it is read as final.
        if self._close_in is not buf or 0 <= self._close_at < pos:  # once per buffer and thought
            self._close_in, self._close_at = buf, buf.find(_THINK_CLOSE, pos)
        end, held = self._close_at, False
        if end < 0:
            end = len(buf)
            if not final:
                k = buf.rfind("<", max(pos, end - len(_THINK_CLOSE) + 1))
                held = k >= 0 and _THINK_CLOSE.startswith(buf[k:])
                end = k if held else end
        if end == len(buf):
            return self._scan_block(buf, pos, events, final)
        new_pos, stalled = self._scan_block(buf, pos, events, True, end)
        if new_pos < end or self._mode != _BLOCK:  # the block ended before that point
            return new_pos, stalled
        if held:
            return end, True
        self._finish_thought_block()  # at </think>: the thought reads it next
        return end, False

    def _scan_bare(
        self, buf: str, pos: int, events: list[StreamEvent], final: bool
    ) -> tuple[int, bool]:
        # A call outside <tool_call> (Qwen3-Coder's form): never parsed, never content. It is
        # numbered and streamed as a block so that clients see it end as the error it is.
        start = search = pos
        while True:
            i = buf.find("<", search)
            if i < 0:
                self._emit_block_text(buf[start:], events)
                return len(buf), False
            tag = _tag_at(buf, i, _BARE_END_TAGS, final)
            if tag is None:
                search = i + 1
                continue
            if tag == _PARTIAL:
                self._emit_block_text(buf[start:i], events)
                return i, True
            kept = i + len(tag) if tag in _BARE_CLOSERS else i
            self._emit_block_text(buf[start:kept], events)
            self._finish_bare(events)
            return kept, False

    def _finish_bare(self, events: list[StreamEvent]) -> None:
        error = ParseError("".join(self._parts), BARE_FUNCTION)
        self._parts = []
        self._mode = _TEXT
        self._errors.append(error)
        events.append(ToolCallFinished(self._blocks - 1, error=error))

    def _scan_think(
        self, buf: str, pos: int, events: list[StreamEvent], final: bool
    ) -> tuple[int, bool]:
        # Only </think> ends a thought. A call tag opens a block whose text stays the thought's
        # and whose calls are thought_calls, never tool_calls.
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
                after = i + len(tag)
                self._emit_thought(buf[start:after], events)
                self._thought_parts = self._parts  # the block's calls are thought_calls
                self._open_block(tag, None)
                return after, False
            self._emit_thought(buf[start:i], events)
            if tag == _PARTIAL:
                return i, True
            if tag == _THINK_OPEN:
                # The model repeated the opening tag: a line break, so that the words either
                # side of it stay apart.
                self._emit_thought("\n", events)
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
        # The calls read so far were written inside the thought: they are its calls now.
        self._thought_calls, self._calls = self._calls, []
        self._content, self._errors, self._pads = [], [], []
        self._notes.append(NOTE_REVEALED_THOUGHT)
        self._end_thought(raw)
        events.append(ThoughtRevealed(raw))

    def _emit_block_text(self, text: str, events: list[StreamEvent]) -> None:
        if text:
            self._parts.append(text)
            if self._thought_parts is None:
                events.append(ToolCallArgumentsDelta(self._blocks - 1, text))
            else:  # a block inside a thought: its text is the thought's
                self._thought_parts.append(text)
                events.append(ThoughtDelta(text))

    def _finish_thought_block(self) -> None:
        """Parse a block read inside a thought into ``thought_calls`` and go back to the
        thought. A block that does not parse stays what it was, text of the thought; no
        recovery cuts it (nothing after it could become a call)."""
        assert self._thought_parts is not None
        listing = self._block_tag == _TOOLS_OPEN
        results = _parse_block("".join(self._parts), self._new_id, listing=listing)
        self._thought_calls += [r for r in results if isinstance(r, ToolCall)]
        self._parts, self._thought_parts = self._thought_parts, None
        self._mode = _THINK

    def _open_block(self, tag: str, events: list[StreamEvent] | None) -> None:
        """Start reading a block; ``events`` None: a block inside a thought, not one of the
        turn's blocks (no index, no tool-call events; its text stays the thought's)."""
        self._mode = _BLOCK
        self._block_tag = tag
        self._xml = False
        self._parts = []
        self._quote, self._escape, self._prev = None, False, ""
        if events is not None:
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
        if self._mode == _BLOCK and self._thought_parts is not None:
            self._finish_thought_block()  # the thought it was in is closed next
            return
        if self._mode == _BLOCK:
            rest = self._finish_block(text, events)
            if rest is not None:
                self._reread(rest)
            return
        if self._mode == _BARE:
            self._finish_bare(events)
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
