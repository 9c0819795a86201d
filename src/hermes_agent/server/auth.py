"""Who is calling: ``current_user(request) -> Principal``.

With ``auth: keys`` the caller presents ``Authorization: Bearer <key>``. A key is
``hk_<key_id>.<secret>``; the store keeps the key id, the SHA-256 of the whole key, the user
id it is bound to, whether it is an admin key, and an optional name (what the key is for). The
presented key's hash is compared with ``hmac.compare_digest``. With ``auth: none`` every
caller is the user ``local``.

``KeyStore`` is the seam for key management (``hermes-agent keys``; quotas are keyed by the
same stable user id and kept in the same database) and for other ways of knowing the user.

A key is checked when a request arrives, and again on connections that outlive one request:
an open WebSocket before each message it sends, an event stream before each frame and
keep-alive (``LiveCheck``, which asks the store at most once per ``key_check_s`` for each
key): a revoked key stops acting within that bound everywhere. A browser's event stream may
instead present a stream token (``server.stream_tokens``), good for one run's events only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import logging
import re
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Protocol

import sqlalchemy as sa
from fastapi import Depends, HTTPException, Request
from starlette.concurrency import run_in_threadpool

from hermes_agent.runs.principal import LOCAL_USER as LOCAL_USER
from hermes_agent.runs.principal import Principal as Principal
from hermes_agent.storage.base import StorageError
from hermes_agent.storage.engine import is_memory_url, make_engine, safe_url
from hermes_agent.storage.schema import MAX_KEY_NAME_CHARS, upgrade
from hermes_agent.storage.schema import api_keys as api_keys

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


STREAM_ROUTES = frozenset({"/v1/runs/{request_id}/events"})
"""The routes where a stream token (``?stream_token=``) stands for its run's owner."""


def current_user(request: Request) -> Principal:
    """Who calls, for every endpoint (through ``caller``, their dependency: override that one
    in ``app.dependency_overrides``); 401 without a valid key (or, on a run's event stream, a
    valid stream token for that run). It may read the key store: call it off the event loop."""
    state = request.app.state
    if state.settings.auth == "none":
        principal: Principal | None = Principal(LOCAL_USER)
    elif "authorization" not in request.headers and "stream_token" in request.query_params:
        principal = _stream_token_user(request)
    else:
        principal = authenticate(state.keys, request.headers.get("authorization"))
    if principal is None:
        raise HTTPException(
            401,
            "missing or invalid API key: send 'Authorization: Bearer <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    request.state.user_id = principal.user_id
    return principal


def authenticate(keys: KeyStore, header: str | None) -> Principal | None:
    """The principal for an ``Authorization`` header value, if any."""
    scheme, _, key = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        return None
    return keys.lookup(key.strip())


def _stream_token_user(request: Request) -> Principal | None:
    """The run's owner for a stream token presented on that run's event stream (``None``
    anywhere else, for another run, past its expiry, or once its key is revoked)."""
    route = request.scope.get("route")
    if getattr(route, "path", None) not in STREAM_ROUTES:
        return None
    grant = request.app.state.stream_tokens.lookup(request.query_params["stream_token"])
    if grant is None or not grant.admits(request.path_params.get("request_id", "")):
        return None
    keys: KeyStore = request.app.state.keys
    if grant.key_id is not None and not keys.active(grant.key_id):
        return None
    principal: Principal = grant.principal
    return principal


async def caller(request: Request) -> Principal:
    """``current_user`` as the endpoints' dependency. With ``auth: none`` it reads nothing,
    so it runs on the event loop: a thread hop per request (FastAPI's, for a plain function)
    cost more CPU than the rest of the check. With keys it asks the key store, which may wait
    on its database, so it runs in FastAPI's thread pool as before."""
    if request.app.state.settings.auth == "none":
        return current_user(request)
    return await run_in_threadpool(current_user, request)


CurrentUser = Annotated[Principal, Depends(caller)]
"""The caller, as an endpoint parameter: ``user: CurrentUser``."""


@dataclass(frozen=True, slots=True)
class Credential:
    """What an open connection presented: an API key, a stream token, or nothing (``auth:
    none``)."""

    key: str | None = None
    stream_token: str | None = None

    @classmethod
    def of(cls, authorization: str | None, query: dict[str, str]) -> Credential:
        """From a request's ``Authorization`` header and query (the header wins, as in
        ``current_user``)."""
        scheme, _, key = (authorization or "").partition(" ")
        if scheme.lower() == "bearer" and key.strip():
            return cls(key=key.strip())
        if query.get("stream_token"):
            return cls(stream_token=query["stream_token"])
        if query.get("access_token"):
            return cls(key=query["access_token"])
        return cls()


class LiveCheck:
    """Whether the credential an open connection presented still stands: its key not revoked
    (nor the key a stream token was granted for). Each answer is kept ``ttl`` seconds, so a
    busy connection costs one store lookup per ``ttl`` whatever its traffic; the lookup runs
    in a thread (the store may be a database)."""

    def __init__(self, keys: KeyStore, tokens: Any, ttl: float) -> None:
        self.keys = keys
        self.tokens = tokens
        self.ttl = ttl
        self._answers: dict[str, tuple[float, bool]] = {}

    async def stands(self, credential: Credential) -> bool:
        """``True`` while the credential is good (always for none: ``auth: none``)."""
        if credential.key is None and credential.stream_token is None:
            return True
        # Keyed by a hash: the cache never holds a key or token itself.
        raw = credential.key if credential.key is not None else f"t:{credential.stream_token}"
        slot = hashlib.sha256(raw.encode()).hexdigest()
        now = time.monotonic()
        known = self._answers.get(slot)
        if known is not None and known[0] > now:
            return known[1]
        try:
            good = await asyncio.to_thread(self._check, credential)
        except Exception:  # a store that cannot be reached: keep the last answer a while
            good = known[1] if known is not None else True
        if len(self._answers) > 10_000:
            self._answers = {k: v for k, v in self._answers.items() if v[0] > now}
        self._answers[slot] = (now + self.ttl, good)
        return good

    def _check(self, credential: Credential) -> bool:
        if credential.key is not None:
            return self.keys.lookup(credential.key) is not None
        assert credential.stream_token is not None
        grant = self.tokens.lookup(credential.stream_token)
        # An open stream lives while the key behind its token does (the token's expiry only
        # bounds when a stream may be opened with it).
        return grant is not None and (grant.key_id is None or self.keys.active(grant.key_id))
