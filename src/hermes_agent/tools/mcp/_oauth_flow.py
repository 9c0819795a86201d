"""The SDK's OAuth client for one ``oauth:`` server, and what is ours around it (``oauth``).

- ``OAuthFiles``: the SDK's ``TokenStorage``, one JSON file per server in the state folder
  (mode 0600, written atomically), bound to the server's URL: a file written for another URL
  is not read. A pre-registered client comes from the config; its secret is never written.
- ``LoopbackCallback``: the sign-in. The authorization URL goes to ``OAuthSignIn.open_url``
  (the browser); a listener of our own on the loopback ``redirect_uri`` takes the answer, and
  only a request carrying the ``state`` this sign-in sent (the SDK checks ``state`` and
  ``iss`` again).

This module imports the SDK: import it where a connection is opened.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import os
import socket
import tempfile
import time
from html import escape
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
from mcp.client.auth import OAuthClientProvider, OAuthFlowError
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
)
from pydantic import AnyUrl, ValidationError

from hermes_agent.config import McpOAuthConfig
from hermes_agent.tools.mcp.oauth import OAuthSignIn

logger = logging.getLogger("hermes_agent.mcp")

CALLBACK_PATH = "/callback"
MAX_REQUEST_BYTES = 16 << 10
"""The most a request to the loopback listener may send before its blank line."""


class OAuthFiles:
    """The SDK's ``TokenStorage`` for one server: tokens and the client registration in one
    JSON file, bound to ``url`` (with no file, in ``memory``: ``OAuthSignIn.memory[server]``)."""

    def __init__(
        self, path: Path | None, url: str, config: McpOAuthConfig, memory: dict[str, Any]
    ) -> None:
        self.path = path
        self.url = url
        self.config = config
        self._memory = memory

    def read(self) -> dict[str, Any]:
        """What is kept for this server's URL (empty when nothing, or for another URL)."""
        if self.path is None:
            data: Any = dict(self._memory)
            return data if data.get("url") == self.url else {}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            logger.warning("%s is unreadable (%s): signing in afresh", self.path, exc)
            return {}
        if not isinstance(data, dict) or data.get("url") != self.url:
            return {}
        return data

    def _write(self, key: str, value: dict[str, Any]) -> None:
        data = self.read()
        data.update({"url": self.url, key: value})
        if self.path is None:
            self._memory.clear()
            self._memory.update(data)
            return
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".oauth-")
        try:  # mkstemp's file is 0600 already; say so for a umask that would widen it
            os.fchmod(handle, 0o600)
            with os.fdopen(handle, "w", encoding="utf-8") as file:
                json.dump(data, file, indent=1, sort_keys=True)
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    def stored_client(self) -> OAuthClientInformationFull | None:
        """The registration kept for this URL (not a pre-registered client's)."""
        kept = self.read().get("client")
        try:
            return None if kept is None else OAuthClientInformationFull.model_validate(kept)
        except ValidationError:
            return None

    # -- TokenStorage -------------------------------------------------------------------------

    async def get_tokens(self) -> OAuthToken | None:
        kept = self.read().get("tokens")
        if isinstance(kept, dict):
            kept = {k: v for k, v in kept.items() if k != "expires_at"}
        try:
            return None if kept is None else OAuthToken.model_validate(kept)
        except ValidationError:
            return None

    async def set_tokens(self, tokens: OAuthToken) -> None:
        kept = tokens.model_dump(mode="json", exclude_none=True)
        if tokens.expires_in is not None:
            kept["expires_at"] = time.time() + float(tokens.expires_in)
        self._write("tokens", kept)

    def expires_at(self) -> float | None:
        """When the kept access token expires (seconds since the epoch), if it said."""
        kept = self.read().get("tokens") or {}
        value = kept.get("expires_at") if isinstance(kept, dict) else None
        return float(value) if isinstance(value, int | float) else None

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        config = self.config
        if config.client_id is None:
            return self.stored_client()
        method = config.token_endpoint_auth_method
        return OAuthClientInformationFull(
            client_id=config.client_id,
            client_secret=config.client_secret,
            redirect_uris=None,
            token_endpoint_auth_method=method
            or ("client_secret_basic" if config.client_secret else "none"),
        )

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        if self.config.client_id is not None:
            return  # the config's client: its secret stays in the config
        self._write("client", client_info.model_dump(mode="json", exclude_none=True))


class LoopbackCallback:
    """The listener on the loopback ``redirect_uri`` that takes one sign-in's answer: started
    when the user is sent to sign in (``redirect``), closed once the answer came (``answer``)."""

    def __init__(self, server: str, redirect_uri: str, sign_in: OAuthSignIn, timeout: float):
        self.server = server
        parts = urlsplit(redirect_uri)
        self.host = "127.0.0.1" if parts.hostname == "localhost" else str(parts.hostname)
        self.port = int(parts.port or 0)
        self.path = parts.path or "/"
        self.sign_in = sign_in
        self.timeout = timeout
        self._state: str | None = None
        self._answer: asyncio.Future[AuthorizationCodeResult] | None = None
        self._listener: asyncio.Server | None = None

    async def redirect(self, authorization_url: str) -> None:
        """The SDK's ``redirect_handler``: listen, then send the user to ``authorization_url``."""
        await self._close()
        sent = parse_qs(urlsplit(authorization_url).query).get("state")
        self._state = sent[0] if sent else None
        self._answer = asyncio.get_running_loop().create_future()
        try:
            self._listener = await asyncio.start_server(self._serve, self.host, self.port)
        except OSError as exc:
            raise OAuthFlowError(
                f"cannot listen on {self.host}:{self.port} for the sign-in's answer ({exc})"
            ) from None
        try:
            opened = await anyio.to_thread.run_sync(self.sign_in.open_url, authorization_url)
            if inspect.isawaitable(opened):
                await opened
        except BaseException:
            await self._close()
            raise

    async def answer(self) -> AuthorizationCodeResult:
        """The SDK's ``callback_handler``: the code, state and issuer the browser brought."""
        if self._answer is None:
            raise OAuthFlowError("no sign-in was started")
        try:
            with anyio.fail_after(self.timeout):
                return await self._answer
        except TimeoutError:
            raise OAuthFlowError(
                f"no sign-in to MCP server {self.server!r} within sign_in_timeout "
                f"({self.timeout:g} s)"
            ) from None
        finally:
            await self._close()

    async def _close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
            await listener.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, OSError):
            writer.close()
            return
        if len(head) > MAX_REQUEST_BYTES:
            writer.close()
            return
        method, _, rest = head.decode("latin-1").partition(" ")
        parts = urlsplit(rest.partition(" ")[0])
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        answer = self._answer
        if method != "GET" or parts.path != self.path:
            status, text = "404 Not Found", "Nothing here."
        elif self._state is None or query.get("state") != self._state:
            status, text = "400 Bad Request", "This is not the sign-in the agent started."
        elif answer is None or answer.done():
            status, text = "409 Conflict", "This sign-in was answered already."
        elif "error" in query:
            why = query.get("error_description") or query["error"]
            answer.set_exception(OAuthFlowError(f"the authorization server refused: {why}"))
            status, text = "200 OK", f"Sign-in refused: {why}. You can close this tab."
        elif query.get("code"):
            result = AuthorizationCodeResult(
                code=query["code"], state=query["state"], iss=query.get("iss")
            )
            answer.set_result(result)
            status, text = "200 OK", f"Signed in to {self.server}. You can close this tab."
        else:
            status, text = "400 Bad Request", "The answer has no code."
        body = f"<!doctype html><title>Hermes Agent</title><p>{escape(text)}</p>".encode()
        writer.write(
            f"HTTP/1.1 {status}\r\nContent-Type: text/html; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        with contextlib.suppress(OSError):
            await writer.drain()
        writer.close()


def oauth_provider(
    server: str, url: str, config: McpOAuthConfig, sign_in: OAuthSignIn
) -> OAuthClientProvider:
    """The SDK's OAuth client for ``server`` at ``url`` (an httpx auth for its HTTP client)."""
    path = None if sign_in.folder is None else sign_in.folder / f"{server}.json"
    files = OAuthFiles(path, url, config, sign_in.memory.setdefault(server, {}))
    redirect_uri = config.redirect_uri or _kept_redirect(files) or _free_redirect()
    metadata = OAuthClientMetadata(
        client_name=config.client_name,
        redirect_uris=[AnyUrl(redirect_uri)],
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
    )
    callback = LoopbackCallback(server, redirect_uri, sign_in, config.sign_in_timeout)
    return _Provider(
        files,
        server_url=url,
        client_metadata=metadata,
        storage=files,
        redirect_handler=callback.redirect,
        callback_handler=callback.answer,
        client_metadata_url=config.client_metadata_url,
    )


class _Provider(OAuthClientProvider):
    """The SDK's provider, which also knows when a kept token expires: the SDK loads kept
    tokens without their expiry, so after a restart an expired token would be sent, refused,
    and the user sent to sign in again; knowing it, the SDK refreshes it first."""

    def __init__(self, files: OAuthFiles, **options: Any) -> None:
        super().__init__(**options)
        self._files = files

    async def _initialize(self) -> None:
        await super()._initialize()
        if self.context.current_tokens is not None and self.context.token_expiry_time is None:
            self.context.token_expiry_time = self._files.expires_at()


def _kept_redirect(files: OAuthFiles) -> str | None:
    """The loopback redirect URI the kept registration was made with (the authorization
    server knows only that one)."""
    client = files.stored_client()
    for uri in (client.redirect_uris or []) if client is not None else []:
        parts = urlsplit(str(uri))
        if parts.scheme == "http" and parts.hostname in ("127.0.0.1", "localhost") and parts.port:
            return str(uri)
    return None


def _free_redirect() -> str:
    """A loopback redirect URI on a port free now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}{CALLBACK_PATH}"
