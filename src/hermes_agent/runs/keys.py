"""API keys: who a key stands for (``KeyStore``), kept in memory (``MemoryKeyStore``) or in
the agent's database (``SqlKeyStore``), and the log filter that keeps a key's secret out of
every log line (``KeyRedaction``).

A key is ``hk_<key_id>.<secret>``; the store keeps the key id, the SHA-256 of the whole key,
the user id it is bound to, whether it is an admin key, and an optional name (what the key is
for). The presented key's hash is compared with ``hmac.compare_digest``. ``KeyStore`` is the
seam for key management (``hermes-agent keys``; quotas are keyed by the same stable user id
and kept in the same database) and for other ways of knowing the user.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import logging
import re
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

import sqlalchemy as sa

from hermes_agent.runs.principal import Principal
from hermes_agent.storage.base import StorageError
from hermes_agent.storage.engine import is_memory_url, make_engine, safe_url
from hermes_agent.storage.schema import MAX_KEY_NAME_CHARS, api_keys, upgrade

_USER_ID = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
_KEY = re.compile(r"^hk_([0-9a-f]{16})\.([A-Za-z0-9_-]{20,128})$")
MAX_NAME_CHARS = MAX_KEY_NAME_CHARS


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """A key as listed (never the key itself)."""

    key_id: str
    user_id: str
    admin: bool
    created: str
    revoked: bool
    name: str | None = None
    """What the key is for (``--name``), if it was given one."""


class KeyStore(Protocol):
    """Where API keys are kept."""

    def create(self, user_id: str, *, admin: bool = False, name: str | None = None) -> str:
        """A new key for ``user_id``; the only time the key itself is seen."""
        ...

    def lookup(self, key: str) -> Principal | None:
        """The principal a key stands for; ``None`` for an unknown, malformed or revoked key."""
        ...

    def revoke(self, key_id: str) -> bool:
        """Revoke a key; ``True`` when it existed."""
        ...

    def active(self, key_id: str) -> bool:
        """Whether the key ``key_id`` exists and is not revoked (for what was granted on its
        behalf, such as a stream token)."""
        ...

    def list(self) -> list[KeyInfo]:
        """Every key, oldest first."""
        ...

    def ping(self) -> None:
        """Raise if the store cannot be reached."""
        ...

    def close(self) -> None:
        """Release resources."""
        ...


def check_user_id(user_id: str) -> str:
    """``user_id`` if it is a valid stable user id, else ``ValueError`` saying what is."""
    if not _USER_ID.match(user_id):
        raise ValueError(
            f"user id {user_id!r} is invalid: use 1-64 letters, digits, '_', '.', '@' or '-'"
        )
    return user_id


def _new_key() -> tuple[str, str, str]:
    key_id = secrets.token_hex(8)
    key = f"hk_{key_id}.{secrets.token_urlsafe(32)}"
    return key_id, key, hashlib.sha256(key.encode()).hexdigest()


def _matches(key: str, digest: str) -> bool:
    return hmac.compare_digest(hashlib.sha256(key.encode()).hexdigest(), digest)


def _now() -> str:
    return datetime.now(UTC).isoformat()


class MemoryKeyStore:
    """Keys in this process only (for ``memory://`` storage and tests)."""

    def __init__(self) -> None:
        self._keys: dict[str, tuple[str, KeyInfo]] = {}
        self._lock = threading.Lock()

    def create(self, user_id: str, *, admin: bool = False, name: str | None = None) -> str:
        key_id, key, digest = _new_key()
        info = KeyInfo(key_id, check_user_id(user_id), admin, _now(), False, check_name(name))
        with self._lock:
            self._keys[key_id] = (digest, info)
        return key

    def lookup(self, key: str) -> Principal | None:
        match = _KEY.match(key)
        found = self._keys.get(match.group(1)) if match else None
        if found is None or found[1].revoked or not _matches(key, found[0]):
            return None
        return Principal(found[1].user_id, found[1].admin)

    def revoke(self, key_id: str) -> bool:
        with self._lock:
            found = self._keys.get(key_id)
            if found is None:
                return False
            digest, info = found
            self._keys[key_id] = (digest, dataclasses.replace(info, revoked=True))
            return True

    def active(self, key_id: str) -> bool:
        found = self._keys.get(key_id)
        return found is not None and not found[1].revoked

    def list(self) -> list[KeyInfo]:
        return [info for _, info in self._keys.values()]

    def ping(self) -> None:
        return None

    def close(self) -> None:
        return None


class SqlKeyStore:
    """Keys in a table of their own (``hermes_api_keys``), in any SQLAlchemy database — by
    default the one the agent's storage uses. The engine is made as the storage makes its own
    (``storage.engine.make_engine``), the database is brought up to the project's schema
    (``storage.schema.upgrade``), and the quota counts, stream tokens and channel tables share
    it (``shared_engine``)."""

    def __init__(self, url: str) -> None:
        self.engine = make_engine(url, echo=False)
        # An in-memory SQLite database is one connection for every thread: take turns on it.
        self.in_memory = self.engine.dialect.name == "sqlite" and is_memory_url(url)
        self._guard: threading.Lock | None = threading.Lock() if self.in_memory else None
        try:
            with self._turn():
                upgrade(self.engine)
        except sa.exc.SQLAlchemyError as exc:
            self.engine.dispose()
            raise StorageError(f"cannot open the key store {safe_url(url)}: {exc}") from exc
        except StorageError:
            self.engine.dispose()
            raise

    @property
    def shared_engine(self) -> sa.Engine | None:
        """The engine the stores kept beside the keys use (``storage.engine.SharesEngine``):
        ``None`` for an in-memory database, whose neighbours then live in memory too."""
        return None if self.in_memory else self.engine

    @contextmanager
    def _turn(self) -> Iterator[None]:
        with self._guard if self._guard is not None else nullcontext():
            yield

    def create(self, user_id: str, *, admin: bool = False, name: str | None = None) -> str:
        key_id, key, digest = _new_key()
        row = {
            "key_id": key_id,
            "key_sha256": digest,
            "user_id": check_user_id(user_id),
            "admin": admin,
            "created": _now(),
            "revoked": False,
            "name": check_name(name),
        }
        with self._turn(), self.engine.begin() as conn:
            conn.execute(api_keys.insert().values(**row))
        return key

    def lookup(self, key: str) -> Principal | None:
        match = _KEY.match(key)
        if match is None:
            return None
        with self._turn(), self.engine.connect() as conn:
            row = conn.execute(
                sa.select(api_keys).where(api_keys.c.key_id == match.group(1))
            ).first()
        if row is None or row.revoked or not _matches(key, row.key_sha256):
            return None
        return Principal(row.user_id, bool(row.admin))

    def revoke(self, key_id: str) -> bool:
        with self._turn(), self.engine.begin() as conn:
            done = conn.execute(
                api_keys.update().where(api_keys.c.key_id == key_id).values(revoked=True)
            )
        return bool(done.rowcount)

    def active(self, key_id: str) -> bool:
        with self._turn(), self.engine.connect() as conn:
            row = conn.execute(
                sa.select(api_keys.c.revoked).where(api_keys.c.key_id == key_id)
            ).first()
        return row is not None and not row.revoked

    def list(self) -> list[KeyInfo]:
        with self._turn(), self.engine.connect() as conn:
            rows = conn.execute(sa.select(api_keys).order_by(api_keys.c.created)).all()
        return [
            KeyInfo(r.key_id, r.user_id, bool(r.admin), r.created, bool(r.revoked), r.name)
            for r in rows
        ]

    def ping(self) -> None:
        with self._turn(), self.engine.connect() as conn:
            conn.execute(sa.select(1))

    def close(self) -> None:
        self.engine.dispose()


def check_name(name: str | None) -> str | None:
    """``name`` if it is a valid key name (or ``None``), else ``ValueError`` saying why."""
    if name is None:
        return None
    if not name.strip() or len(name) > MAX_NAME_CHARS or not name.isprintable():
        raise ValueError(
            f"key name {name!r} is invalid: use 1-{MAX_NAME_CHARS} printable characters"
        )
    return name


def open_key_store(url: str) -> KeyStore:
    """``MemoryKeyStore`` for ``memory://``, else ``SqlKeyStore(url)`` (``StorageError`` when
    the database cannot be opened)."""
    if url.startswith("memory:"):
        return MemoryKeyStore()
    return SqlKeyStore(url)


_SECRET_IN_TEXT = re.compile(r"\b(hk_[0-9a-f]{16}|hst_[0-9a-f]{16})\.[A-Za-z0-9_-]+")


class KeyRedaction(logging.Filter):
    """A log filter that leaves a key's id and blanks its secret (``hk_<id>.***``, stream
    tokens too) in every record it sees. Installed on the handlers of ``hermes-agent serve``:
    a library that logs what a client sent at debug level (the WebSocket handshake's
    ``Sec-WebSocket-Protocol: bearer, <key>``) writes no key."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if _SECRET_IN_TEXT.search(text):
            record.msg, record.args = _SECRET_IN_TEXT.sub(r"\1.***", text), None
        return True


def key_id_of(key: str) -> str | None:
    """The key id part of a well-formed key (``hk_<key_id>.<secret>``), else ``None``."""
    match = _KEY.match(key.strip())
    return match.group(1) if match else None


def authenticate(keys: KeyStore, header: str | None) -> Principal | None:
    """The principal for an ``Authorization`` header value, if any."""
    scheme, _, key = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        return None
    return keys.lookup(key.strip())
