"""Session history: a store per conversation and the window a prompt sees.

A *turn* is a user message and everything that answered it (tool calls, results, the final
answer). The prompt carries the last ``history_window`` turns verbatim (``split_history``); the
agent folds older turns into a short summary — written by the model where it can, else the
extractive ``summarize`` (their questions and answers, clipped to ``summary_max_chars``) — so the
model keeps the gist without the prompt growing with the conversation.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol

from hermes_agent.types import Message


class SessionStore(Protocol):
    """Where sessions live. ``load`` returns the whole history, ``append`` adds one turn."""

    def load(self, session_id: str) -> list[Message]: ...

    def append(self, session_id: str, messages: Sequence[Message]) -> None: ...

    def lock(self, session_id: str) -> threading.Lock: ...


class InMemorySessionStore:
    """Sessions in a dict, for one process. Runs on one session are serialised by its lock."""

    def __init__(self) -> None:
        self._sessions: dict[str, list[Message]] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def load(self, session_id: str) -> list[Message]:
        return list(self._sessions.get(session_id, ()))

    def append(self, session_id: str, messages: Sequence[Message]) -> None:
        self._sessions.setdefault(session_id, []).extend(messages)

    def lock(self, session_id: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(session_id, threading.Lock())

    def delete(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def session_ids(self) -> list[str]:
        return list(self._sessions)


def split_turns(messages: Sequence[Message]) -> list[list[Message]]:
    """Group a history into turns, each starting at a user message."""
    turns: list[list[Message]] = []
    for message in messages:
        if message.role == "user" or not turns:
            turns.append([])
        turns[-1].append(message)
    return turns


def split_history(
    messages: Sequence[Message], history_window: int
) -> tuple[list[list[Message]], list[Message]]:
    """(turns to fold into a summary, messages to keep verbatim)."""
    turns = split_turns(messages)
    if len(turns) <= history_window:
        return [], list(messages)
    cut = len(turns) - history_window
    return turns[:cut], [message for turn in turns[cut:] for message in turn]


def transcript(turns: Sequence[Sequence[Message]]) -> str:
    """Old turns as plain "User: ... / Assistant: ..." lines, the input of a model summary."""
    lines = []
    for turn in turns:
        for message in turn:
            if message.role == "user":
                lines.append(f"User: {message.content}")
            elif message.role == "assistant" and message.content:
                lines.append(f"Assistant: {message.content}")
    return "\n".join(lines)


def summarize(turns: Sequence[Sequence[Message]], max_chars: int) -> str:
    """An extractive summary of ``turns``: the latest questions and answers that fit."""
    if max_chars <= 0:
        return ""
    header = "Earlier in this conversation: "
    pieces: list[str] = []
    budget = max_chars - len(header)
    for turn in reversed(turns):
        question = next((m.content for m in turn if m.role == "user"), "")
        answer = next(
            (m.content for m in reversed(turn) if m.role == "assistant" and m.content), ""
        )
        piece = f"Q: {_clip(question, 80)} A: {_clip(answer, 80)}"
        if len(piece) + 2 > budget:
            break
        pieces.insert(0, piece)
        budget -= len(piece) + 2
    if not pieces:
        return ""
    return (header + "; ".join(pieces))[:max_chars]


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
