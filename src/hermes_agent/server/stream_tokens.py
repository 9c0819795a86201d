"""Stream tokens: a browser follows a run without its API key in the URL.

``EventSource`` cannot send an ``Authorization`` header, so a page used to put the key itself in
``?access_token=``, where it may end up in a proxy's log or the browser's history. Instead the
page asks, with its key in the header,

    POST /v1/runs/{id}/stream-token        → {"token": "hst_…", "expires_in": 300, "events_url"}

and opens ``GET /v1/runs/{id}/events?stream_token=hst_…``. The token stands for the run's owner
on that run's event stream only (any other route or run: 401), may open (or reopen) the stream
for ``stream_token_ttl_s`` seconds, and stops with the key it was granted for: revoking the key
ends the streams opened with it at their next keep-alive.

Tokens are kept like keys (only their SHA-256), beside the keys: in the key store's database
(``hermes_stream_tokens``), so that any process of the service honours a token another one
granted, or in memory when the keys are.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Protocol

import sqlalchemy as sa
from fastapi import APIRouter, Request
from pydantic import BaseModel
from starlette.responses import Response

from hermes_agent.runs.backend import RunBackend
from hermes_agent.runs.keys import KeyStore, key_id_of
from hermes_agent.runs.principal import Principal
from hermes_agent.server.api_models import AUTHENTICATED, errors
from hermes_agent.server.auth import CurrentUser
from hermes_agent.storage.engine import shared_engine
from hermes_agent.storage.schema import stream_tokens as stream_tokens
from hermes_agent.storage.schema import upgrade

_TOKEN = re.compile(r"^hst_([0-9a-f]{16})\.([A-Za-z0-9_-]{20,128})$")


@dataclass(frozen=True, slots=True)
class StreamGrant:
    """What a stream token stands for."""

    request_id: str
    principal: Principal
    key_id: str | None
    """The key that asked for it (``None`` with ``auth: none``): the token stops with it."""
    expires: float
    """Seconds since the epoch after which it opens no stream."""

    def admits(self, request_id: str, now: float | None = None) -> bool:
        """Whether it may open ``request_id``'s event stream now."""
        return request_id == self.request_id and (time.time() if now is None else now) < (
            self.expires
        )


class StreamTokenStore(Protocol):
    """Where stream tokens are kept."""

    def grant(self, grant: StreamGrant) -> str:
        """A new token for ``grant``; the only time the token itself is seen."""
        ...

    def lookup(self, token: str) -> StreamGrant | None:
        """What ``token`` stands for (expired or not); ``None`` for an unknown one."""
        ...


def _new_token() -> tuple[str, str, str]:
    token_id = secrets.token_hex(8)
    token = f"hst_{token_id}.{secrets.token_urlsafe(24)}"
    return token_id, token, hashlib.sha256(token.encode()).hexdigest()


def _matches(token: str, digest: str) -> bool:
    return hmac.compare_digest(hashlib.sha256(token.encode()).hexdigest(), digest)


class MemoryStreamTokens:
    """Tokens in this process only (keys in memory)."""

    def __init__(self) -> None:
        self._tokens: dict[str, tuple[str, StreamGrant]] = {}
        self._lock = threading.Lock()

    def grant(self, grant: StreamGrant) -> str:
        token_id, token, digest = _new_token()
        now = time.time()
        with self._lock:
            for old in [k for k, (_, g) in self._tokens.items() if g.expires < now]:
                del self._tokens[old]
            self._tokens[token_id] = (digest, grant)
        return token

    def lookup(self, token: str) -> StreamGrant | None:
        match = _TOKEN.match(token)
        found = self._tokens.get(match.group(1)) if match else None
        if found is None or not _matches(token, found[0]):
            return None
        return found[1]


class SqlStreamTokens:
    """Tokens in the key store's database (one table; expired rows go when new ones come)."""

    KEEP_EXPIRED_S = 3600.0
    """Expired tokens are kept this long (an open stream still checks its key through one)."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        upgrade(engine)  # one read when the key store opened the database already

    def grant(self, grant: StreamGrant) -> str:
        token_id, token, digest = _new_token()
        with self.engine.begin() as conn:
            conn.execute(
                stream_tokens.delete().where(
                    stream_tokens.c.expires < time.time() - self.KEEP_EXPIRED_S
                )
            )
            conn.execute(
                stream_tokens.insert().values(
                    token_id=token_id,
                    token_sha256=digest,
                    request_id=grant.request_id,
                    user_id=grant.principal.user_id,
                    admin=grant.principal.admin,
                    key_id=grant.key_id,
                    expires=grant.expires,
                )
            )
        return token

    def lookup(self, token: str) -> StreamGrant | None:
        match = _TOKEN.match(token)
        if match is None:
            return None
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(stream_tokens).where(stream_tokens.c.token_id == match.group(1))
            ).first()
        if row is None or not _matches(token, row.token_sha256):
            return None
        return StreamGrant(
            row.request_id, Principal(row.user_id, bool(row.admin)), row.key_id, row.expires
        )


def stream_tokens_for(keys: KeyStore) -> StreamTokenStore:
    """Beside the API keys: the key store's database, else memory (as the quota counts)."""
    engine = shared_engine(keys)
    return SqlStreamTokens(engine) if engine is not None else MemoryStreamTokens()


class StreamTokenBody(BaseModel):
    """A stream token for one run's event stream."""

    token: str
    expires_in: float
    """Seconds during which it may open (or reopen) the stream."""
    request_id: str
    events_url: str
    """The run's event stream with the token in it."""


router = APIRouter(prefix="/v1")


@router.post(
    "/runs/{request_id}/stream-token",
    response_model=StreamTokenBody,
    responses=errors(404, *AUTHENTICATED),
)
async def stream_token(request_id: str, request: Request, user: CurrentUser) -> Response:
    """A short-lived token that opens this run's event stream
    (``GET /v1/runs/{id}/events?stream_token=…``) and nothing else, for a browser's
    ``EventSource``, which cannot send the key in a header."""
    backend: RunBackend = request.app.state.backend
    await backend.view(request_id, user)  # the caller's own run, else 404
    ttl: float = request.app.state.settings.stream_token_ttl_s
    key = request.headers.get("authorization", "").partition(" ")[2]
    grant = StreamGrant(request_id, user, key_id_of(key), time.time() + ttl)
    store: StreamTokenStore = request.app.state.stream_tokens
    token = await asyncio.to_thread(store.grant, grant)
    body = StreamTokenBody(
        token=token,
        expires_in=ttl,
        request_id=request_id,
        events_url=f"/v1/runs/{request_id}/events?stream_token={token}",
    )
    return Response(
        body.model_dump_json(),
        media_type="application/json",
        headers={"Cache-Control": "no-store"},
    )
