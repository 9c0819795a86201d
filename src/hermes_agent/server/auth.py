"""Who is calling: ``current_user(request) -> Principal``.

With ``auth: keys`` the caller presents ``Authorization: Bearer <key>``. A key is
``hk_<key_id>.<secret>``; the store keeps the key id, the SHA-256 of the whole key, the user
id it is bound to and whether it is an admin key. The presented key's hash is compared with
``hmac.compare_digest``. With ``auth: none`` every caller is the user ``local``.

``KeyStore`` is the seam for key management (a ``keys`` command, quotas keyed by the same
stable user id) and for other ways of knowing the user.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import re
import secrets
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Protocol

import sqlalchemy as sa
from fastapi import Depends, HTTPException, Request

_USER_ID = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
_KEY = re.compile(r"^hk_([0-9a-f]{16})\.([A-Za-z0-9_-]{20,128})$")
LOCAL_USER = "local"


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller: a stable user id (what runs, sessions and approvals belong to) and whether
    the caller may see everyone's runs."""

    user_id: str
    admin: bool = False


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """A key as listed (never the key itself)."""

    key_id: str
    user_id: str
    admin: bool
    created: str
    revoked: bool


class KeyStore(Protocol):
    """Where API keys are kept."""

    def create(self, user_id: str, *, admin: bool = False) -> str:
        """A new key for ``user_id``; the only time the key itself is seen."""
        ...

    def lookup(self, key: str) -> Principal | None:
        """The principal a key stands for; ``None`` for an unknown, malformed or revoked key."""
        ...

    def revoke(self, key_id: str) -> bool:
        """Revoke a key; ``True`` when it existed."""
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

    def create(self, user_id: str, *, admin: bool = False) -> str:
        key_id, key, digest = _new_key()
        info = KeyInfo(key_id, check_user_id(user_id), admin, _now(), False)
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

    def list(self) -> list[KeyInfo]:
        return [info for _, info in self._keys.values()]

    def ping(self) -> None:
        return None

    def close(self) -> None:
        return None


_metadata = sa.MetaData()
api_keys = sa.Table(
    "hermes_api_keys",
    _metadata,
    sa.Column("key_id", sa.String(32), primary_key=True),
    sa.Column("key_sha256", sa.String(64), nullable=False),
    sa.Column("user_id", sa.String(64), nullable=False, index=True),
    sa.Column("admin", sa.Boolean, nullable=False, default=False),
    sa.Column("created", sa.String(40), nullable=False),
    sa.Column("revoked", sa.Boolean, nullable=False, default=False),
)


class SqlKeyStore:
    """Keys in a table of their own (``hermes_api_keys``), in any SQLAlchemy database — by
    default the one the agent's storage uses."""

    def __init__(self, url: str) -> None:
        self.engine = sa.create_engine(url, pool_pre_ping=True)
        _metadata.create_all(self.engine)

    def create(self, user_id: str, *, admin: bool = False) -> str:
        key_id, key, digest = _new_key()
        row = {
            "key_id": key_id,
            "key_sha256": digest,
            "user_id": check_user_id(user_id),
            "admin": admin,
            "created": _now(),
            "revoked": False,
        }
        with self.engine.begin() as conn:
            conn.execute(api_keys.insert().values(**row))
        return key

    def lookup(self, key: str) -> Principal | None:
        match = _KEY.match(key)
        if match is None:
            return None
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(api_keys).where(api_keys.c.key_id == match.group(1))
            ).first()
        if row is None or row.revoked or not _matches(key, row.key_sha256):
            return None
        return Principal(row.user_id, bool(row.admin))

    def revoke(self, key_id: str) -> bool:
        with self.engine.begin() as conn:
            done = conn.execute(
                api_keys.update().where(api_keys.c.key_id == key_id).values(revoked=True)
            )
        return bool(done.rowcount)

    def list(self) -> list[KeyInfo]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(api_keys).order_by(api_keys.c.created)).all()
        return [
            KeyInfo(r.key_id, r.user_id, bool(r.admin), r.created, bool(r.revoked)) for r in rows
        ]

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(sa.select(1))

    def close(self) -> None:
        self.engine.dispose()


def open_key_store(url: str) -> KeyStore:
    """``MemoryKeyStore`` for ``memory://``, else ``SqlKeyStore(url)``."""
    if url.startswith("memory:"):
        return MemoryKeyStore()
    return SqlKeyStore(url)


def current_user(request: Request) -> Principal:
    """The FastAPI dependency every endpoint uses; 401 without a valid key."""
    state = request.app.state
    if state.settings.auth == "none":
        principal: Principal | None = Principal(LOCAL_USER)
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


CurrentUser = Annotated[Principal, Depends(current_user)]
"""The caller, as an endpoint parameter: ``user: CurrentUser``."""
