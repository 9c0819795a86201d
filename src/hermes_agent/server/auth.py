"""Who is calling: ``current_user(request) -> Principal``.

With ``auth: keys`` the caller presents ``Authorization: Bearer <key>``, checked against the
service's ``KeyStore`` (``runs.keys``). With ``auth: none`` every caller is the user ``local``.

A key is checked when a request arrives, and again on connections that outlive one request:
an open WebSocket before each message it sends, an event stream before each frame and
keep-alive (``LiveCheck``, which asks the store at most once per ``key_check_s`` for each
key): a revoked key stops acting within that bound everywhere. A browser's event stream may
instead present a stream token (``server.stream_tokens``), good for one run's events only.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request
from starlette.concurrency import run_in_threadpool

from hermes_agent.runs.keys import KeyStore, authenticate
from hermes_agent.runs.principal import LOCAL_USER, Principal

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
