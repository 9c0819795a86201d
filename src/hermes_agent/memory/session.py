"""Session history: a store per conversation and the window a prompt sees.

A *turn* is a user message and everything that answered it (tool calls, results, the final
answer). The prompt carries the last ``history_window`` turns verbatim (``split_history``); the
agent folds older turns into a short summary — written by the model where it can, else the
extractive ``summarize`` (their questions and answers, clipped to ``summary_max_chars``) — so the
model keeps the gist without the prompt growing with the conversation.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Protocol, TypedDict, TypeVar, runtime_checkable

from hermes_agent.late_cancels import finish_despite_cancels
from hermes_agent.types import Message

logger = logging.getLogger("hermes_agent")

_T = TypeVar("_T")


class SessionStore(Protocol):
    """Where sessions live. ``load`` returns the whole history, ``append`` adds one turn
    (atomically: a reader sees all of it or none), ``lock`` serialises runs on one session.

    The agent calls ``load`` and ``append`` from a thread of its own, off its event loop,
    unless the store's class declares ``AnswersAtOnce`` and says so for the call: a store must
    not hold anything bound to one thread (a ``sqlite3`` connection made with
    ``check_same_thread``, say)."""

    def load(self, session_id: str) -> list[Message]: ...

    def append(self, session_id: str, messages: Sequence[Message]) -> None: ...

    def lock(self, session_id: str) -> SessionLock: ...


class SessionLock(Protocol):
    """What ``SessionStore.lock`` returns: a ``threading.Lock``, or a lock that also holds
    the session in other processes (``storage.session_lease``)."""

    def acquire(self, blocking: bool = ..., timeout: float = ...) -> bool: ...

    def release(self) -> None: ...


@runtime_checkable
class AcquiresAsync(Protocol):
    """A session lock that a run on an event loop waits for there (``acquire_async``),
    rather than from a thread of the loop's shared pool. ``unheld`` says why the acquisition
    holds the session in this process only (the store had no room for its lease), else
    ``None``: the run reports it among its warnings."""

    unheld: str | None

    async def acquire_async(self) -> None: ...


@runtime_checkable
class AnswersAtOnce(Protocol):
    """A session store that can say which of its calls answer without waiting (the session
    is in memory; a local SQLite file): the agent makes those on the event loop, with no thread
    hop (``off_the_loop``)."""

    def answers_at_once(self, session_id: str, *, append: bool) -> bool:
        """Whether a ``load`` (or, with ``append``, an ``append``) of ``session_id`` returns
        without waiting on a lock, a disk or the network."""
        ...


async def off_the_loop(
    store: SessionStore, session_id: str, call: Callable[[], _T], *, append: bool = False
) -> _T:
    """``call()`` (a ``load``, or with ``append`` an ``append``, of ``session_id`` in ``store``)
    in a thread, so that a store that waits on its database — a lock, a slow disk, the network
    — stalls only this run, never the event loop every other run and request shares. What a
    store says answers at once (``AnswersAtOnce``) is called here: a hop costs the process
    about 0.09 ms of CPU alone, and more under load (the GIL changes hands). A cancel (the
    run's timeout, a client's cancel, a shutdown) lands at once on a load, whose result is then
    dropped. On an append it waits for the append to end: a turn being appended is in the
    session whole, or not at all. An append that went through means the cancel came too late —
    the run has had its effects, recorded its output and saved its turn — so it is not raised
    and the run ends as it finished; an append that failed raises the cancel, chained to the
    failure. A cancel not raised is taken back (``Task.uncancel``), so an ``asyncio.timeout``
    around the run still tells its own expiry apart (one that sent this cancel raises
    nothing: nothing was cancelled). ``Agent`` catches an append's failure itself (a turn not
    saved is a warning of the run), so for a run a cancel during its append always comes too
    late."""
    # The class, not the instance: a wrapper that delegates through ``__getattr__`` does not
    # answer for the store it wraps (``isinstance`` would ask the instance on Python 3.11).
    if issubclass(type(store), AnswersAtOnce) and store.answers_at_once(  # type: ignore[attr-defined]
        session_id, append=append
    ):
        return call()
    if not append:
        return await asyncio.to_thread(call)
    done, cancelled = await finish_despite_cancels(asyncio.to_thread(call))
    if cancelled and (done.cancelled() or done.exception() is not None):
        raise asyncio.CancelledError from (None if done.cancelled() else done.exception())
    return done.result()


def save_turn(store: SessionStore, session_id: str, messages: Sequence[Message]) -> str | None:
    """Append a run's turn (redacted already) to ``session_id``; what to warn of when the
    store fails. The run's tools have run by then, so a store that fails does not fail the
    run: the failure is logged and returned, for ``result.warnings``."""
    try:
        store.append(session_id, messages)
    except Exception as exc:
        problem = (
            f"storage: this turn was not saved to session {session_id!r}: "
            f"{type(exc).__name__}: {exc}"
        )
        logger.error("%s", problem)
        return problem
    return None


class SessionSummary(TypedDict):
    """One row of a store's ``list_sessions``."""

    id: str
    created: str
    """ISO 8601, UTC."""
    updated: str
    turns: int
    """User messages."""
    messages: int


class InMemorySessionStore:
    """Sessions in a dict, for one process. Runs on one session are serialised by its lock."""

    def __init__(self) -> None:
        self._sessions: dict[str, list[Message]] = {}
        self._times: dict[str, tuple[int, int]] = {}  # session → (created, updated) in ns
        # Weak values: a session's lock lives while a run holds it, not forever.
        self._locks: weakref.WeakValueDictionary[str, threading.Lock] = (
            weakref.WeakValueDictionary()
        )
        self._guard = threading.Lock()

    def answers_at_once(self, session_id: str, *, append: bool) -> bool:
        return True  # a dict in this process

    def load(self, session_id: str) -> list[Message]:
        with self._guard:
            return list(self._sessions.get(session_id, ()))

    def append(self, session_id: str, messages: Sequence[Message]) -> None:
        if not messages:
            return
        now = time.time_ns()
        with self._guard:
            self._sessions.setdefault(session_id, []).extend(messages)
            created = self._times.get(session_id, (now, now))[0]
            self._times[session_id] = (created, now)

    def lock(self, session_id: str) -> threading.Lock:
        with self._guard:
            found = self._locks.get(session_id)
            if found is None:
                found = threading.Lock()
                self._locks[session_id] = found
            return found

    def create(self, session_id: str) -> None:
        """Make ``session_id`` a session with no message, where it is none yet."""
        now = time.time_ns()
        with self._guard:
            self._sessions.setdefault(session_id, [])
            self._times.setdefault(session_id, (now, now))

    def exists(self, session_id: str) -> bool:
        with self._guard:
            return session_id in self._sessions

    def delete(self, session_id: str) -> bool:
        """Forget a session; ``True`` when it existed."""
        with self._guard:
            self._times.pop(session_id, None)
            return self._sessions.pop(session_id, None) is not None

    def session_ids(self) -> list[str]:
        """Every session id."""
        with self._guard:
            return list(self._sessions)

    def list_sessions(self, limit: int | None = None) -> list[SessionSummary]:
        """Sessions, most recently updated first (as ``SqlSessionStore.list_sessions``)."""
        with self._guard:
            rows = [
                SessionSummary(
                    id=session_id,
                    created=_iso(self._times[session_id][0]),
                    updated=_iso(self._times[session_id][1]),
                    turns=sum(1 for m in messages if m.role == "user"),
                    messages=len(messages),
                )
                for session_id, messages in self._sessions.items()
            ]
            order = {sid: times[1] for sid, times in self._times.items()}
        rows.sort(key=lambda row: (-order[row["id"]], row["id"]))
        return rows if limit is None else rows[:limit]


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).isoformat(timespec="milliseconds")


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
