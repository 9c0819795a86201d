"""Where channels keep what an operator needs: dead letters and the channel log.

- ``hermes_channel_dead_letters``: a message whose delivery failed after its last retry, with
  its rendered parts (what would have been sent), the error and the attempts; ``hermes-agent
  channels resend`` delivers it later and marks it ``delivered``.
- ``hermes_channel_log``: one row per channel event — an inbound message accepted or refused
  (bad signature, old timestamp, missing user field, over quota) with the user id it was mapped
  to, a delivery, a dead letter, a resend.
- ``hermes_channel_signatures``: the signatures of the inbound requests seen, each until it
  can no longer be inside the replay window (twice the window: a timestamp may be off either
  way). Kept here, not in a process's memory, so that every process of the service on this
  database, and the service after a restart, refuses a replay.

All three live in the database of the API keys and quota counts (the key store's engine), or
in memory when the keys are.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Protocol

import sqlalchemy as sa

from hermes_agent.storage.engine import is_memory_url, make_engine, shared_engine
from hermes_agent.storage.schema import channel_log as channel_log
from hermes_agent.storage.schema import dead_letters as dead_letters
from hermes_agent.storage.schema import seen_signatures as seen_signatures
from hermes_agent.storage.schema import upgrade

LOG_LIMIT = 10_000
"""Entries the memory log keeps (the oldest go first)."""
MAX_SEEN_SIGNATURES = 100_000
"""Signatures the memory store keeps (the oldest go first)."""
PRUNE_EVERY = 100
"""A SQL store deletes the signatures past their expiry once per this many new ones."""


def signature_key(channel: str, signature: str) -> str:
    """What is stored for a seen signature: the SHA-256 of the channel and the signature (of
    a fixed length whatever the header held)."""
    return hashlib.sha256(f"{channel}\0{signature}".encode("utf-8", "replace")).hexdigest()


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message that was not delivered."""

    id: str
    channel: str
    created: float
    parts: list[dict[str, Any]]
    error: str
    attempts: int
    kind: str = "answer"
    user_id: str | None = None
    request_id: str | None = None
    status: str = "pending"
    """``pending`` or ``delivered`` (by a resend)."""
    delivered: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "channel": self.channel,
            "created": self.created,
            "kind": self.kind,
            "user_id": self.user_id,
            "request_id": self.request_id,
            "status": self.status,
            "attempts": self.attempts,
            "error": self.error,
            "delivered": self.delivered,
            "parts": self.parts,
        }


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One channel event."""

    time: float
    channel: str
    event: str
    user_id: str | None = None
    request_id: str | None = None
    detail: str = ""


def new_dead_letter_id() -> str:
    return uuid.uuid4().hex[:16]


class ChannelStore(Protocol):
    """Dead letters and the channel log (safe to call from several threads)."""

    def add_dead_letter(self, letter: DeadLetter) -> None: ...

    def dead_letters(
        self, *, status: str | None = "pending", channel: str | None = None
    ) -> list[DeadLetter]:
        """Oldest first."""
        ...

    def get_dead_letter(self, letter_id: str) -> DeadLetter | None: ...

    def update_dead_letter(self, letter: DeadLetter) -> None: ...

    def log(self, entry: LogEntry) -> None: ...

    def first_time(self, channel: str, signature: str, expires: float) -> bool:
        """Whether ``signature`` of ``channel`` was not seen before (or only past its expiry);
        it is then remembered until ``expires`` (seconds since the epoch). Atomic across every
        process sharing the store: of two at once, one is first."""
        ...

    def entries(
        self, *, channel: str | None = None, event: str | None = None, limit: int = 100
    ) -> list[LogEntry]:
        """Newest first."""
        ...

    def close(self) -> None: ...


class MemoryChannelStore:
    """In this process only (for keys in memory, and tests)."""

    def __init__(self) -> None:
        self._letters: dict[str, DeadLetter] = {}
        self._log: list[LogEntry] = []
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def add_dead_letter(self, letter: DeadLetter) -> None:
        with self._lock:
            self._letters[letter.id] = letter

    def dead_letters(
        self, *, status: str | None = "pending", channel: str | None = None
    ) -> list[DeadLetter]:
        with self._lock:
            found = list(self._letters.values())
        return [
            letter
            for letter in sorted(found, key=lambda item: item.created)
            if (status is None or letter.status == status)
            and (channel is None or letter.channel == channel)
        ]

    def get_dead_letter(self, letter_id: str) -> DeadLetter | None:
        return self._letters.get(letter_id)

    def update_dead_letter(self, letter: DeadLetter) -> None:
        self.add_dead_letter(letter)

    def log(self, entry: LogEntry) -> None:
        with self._lock:
            self._log.append(entry)
            del self._log[:-LOG_LIMIT]

    def first_time(self, channel: str, signature: str, expires: float) -> bool:
        key, now = signature_key(channel, signature), time.time()
        with self._lock:
            while self._seen and (
                next(iter(self._seen.values())) < now or len(self._seen) > MAX_SEEN_SIGNATURES
            ):
                self._seen.popitem(last=False)
            if self._seen.get(key, 0.0) >= now:
                return False
            self._seen[key] = expires
            self._seen.move_to_end(key)
            return True

    def entries(
        self, *, channel: str | None = None, event: str | None = None, limit: int = 100
    ) -> list[LogEntry]:
        with self._lock:
            found = list(reversed(self._log))
        return [
            entry
            for entry in found
            if (channel is None or entry.channel == channel)
            and (event is None or entry.event == event)
        ][:limit]

    def close(self) -> None:
        return None


class SqlChannelStore:
    """The three tables in a SQLAlchemy database (SQLite or PostgreSQL), brought up to the
    project's schema when the store opens (``storage.schema.upgrade``: one read when the key
    store opened the database already)."""

    def __init__(self, engine: sa.Engine, *, owns_engine: bool = False) -> None:
        self.engine = engine
        self._owns_engine = owns_engine
        self._added = 0
        try:
            upgrade(engine)
        except Exception:
            if owns_engine:
                engine.dispose()
            raise

    @classmethod
    def open(cls, url: str) -> SqlChannelStore:
        return cls(make_engine(url, echo=False), owns_engine=True)

    def add_dead_letter(self, letter: DeadLetter) -> None:
        with self.engine.begin() as conn:
            conn.execute(dead_letters.insert().values(**_row(letter)))

    def dead_letters(
        self, *, status: str | None = "pending", channel: str | None = None
    ) -> list[DeadLetter]:
        query = sa.select(dead_letters).order_by(dead_letters.c.created)
        if status is not None:
            query = query.where(dead_letters.c.status == status)
        if channel is not None:
            query = query.where(dead_letters.c.channel == channel)
        with self.engine.connect() as conn:
            return [_letter(row) for row in conn.execute(query)]

    def get_dead_letter(self, letter_id: str) -> DeadLetter | None:
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(dead_letters).where(dead_letters.c.id == letter_id)
            ).first()
        return _letter(row) if row is not None else None

    def update_dead_letter(self, letter: DeadLetter) -> None:
        values = _row(letter)
        del values["id"]
        with self.engine.begin() as conn:
            conn.execute(dead_letters.update().where(dead_letters.c.id == letter.id).values(values))

    def log(self, entry: LogEntry) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                channel_log.insert().values(
                    time=entry.time,
                    channel=entry.channel,
                    event=entry.event,
                    user_id=entry.user_id,
                    request_id=entry.request_id,
                    detail=entry.detail,
                )
            )

    def first_time(self, channel: str, signature: str, expires: float) -> bool:
        key, now = signature_key(channel, signature), time.time()
        try:
            with self.engine.begin() as conn:
                conn.execute(seen_signatures.insert().values(key=key, expires=expires))
        except sa.exc.IntegrityError:
            # Seen before: first again only when that entry has expired, and only for the one
            # process whose update takes it.
            with self.engine.begin() as conn:
                taken = conn.execute(
                    seen_signatures.update()
                    .where(seen_signatures.c.key == key, seen_signatures.c.expires < now)
                    .values(expires=expires)
                )
            return bool(taken.rowcount)
        self._added += 1
        if self._added % PRUNE_EVERY == 0:
            with self.engine.begin() as conn:
                conn.execute(seen_signatures.delete().where(seen_signatures.c.expires < now))
        return True

    def entries(
        self, *, channel: str | None = None, event: str | None = None, limit: int = 100
    ) -> list[LogEntry]:
        query = sa.select(channel_log).order_by(channel_log.c.id.desc()).limit(limit)
        if channel is not None:
            query = query.where(channel_log.c.channel == channel)
        if event is not None:
            query = query.where(channel_log.c.event == event)
        with self.engine.connect() as conn:
            return [
                LogEntry(r.time, r.channel, r.event, r.user_id, r.request_id, r.detail)
                for r in conn.execute(query)
            ]

    def close(self) -> None:
        if self._owns_engine:
            self.engine.dispose()


def _row(letter: DeadLetter) -> dict[str, Any]:
    return {
        "id": letter.id,
        "channel": letter.channel,
        "created": letter.created,
        "kind": letter.kind,
        "user_id": letter.user_id,
        "request_id": letter.request_id,
        "status": letter.status,
        "attempts": letter.attempts,
        "error": letter.error,
        "delivered": letter.delivered,
        "parts": json.dumps(letter.parts, ensure_ascii=False),
    }


def _letter(row: Any) -> DeadLetter:
    return DeadLetter(
        id=row.id,
        channel=row.channel,
        created=row.created,
        parts=json.loads(row.parts),
        error=row.error,
        attempts=row.attempts,
        kind=row.kind,
        user_id=row.user_id,
        request_id=row.request_id,
        status=row.status,
        delivered=row.delivered,
    )


def delivered(letter: DeadLetter, attempts: int) -> DeadLetter:
    """``letter`` once a resend delivered it."""
    return replace(
        letter, status="delivered", delivered=time.time(), attempts=letter.attempts + attempts
    )


def open_channel_store(url: str) -> ChannelStore:
    """``MemoryChannelStore`` for ``memory://`` or an in-memory SQLite URL, else the tables in
    that database."""
    if url.startswith("memory:") or (url.startswith("sqlite") and is_memory_url(url)):
        return MemoryChannelStore()
    return SqlChannelStore.open(url)


def channel_store_for(keys: object) -> ChannelStore:
    """Beside the API keys: the database the key store shares (``storage.engine.SharesEngine``),
    else memory (as the quota counts)."""
    engine = shared_engine(keys)
    return SqlChannelStore(engine) if engine is not None else MemoryChannelStore()
