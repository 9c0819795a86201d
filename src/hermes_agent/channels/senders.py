"""Senders: a rendered message → the parts a channel delivers, and the delivery of one part.

A sender turns an ``OutboundMessage`` into **parts** (plain JSON-able dicts: a webhook body, a
WeCom bot message, an email's fields), and sends one part at a time. Parts are what the dead
letters keep, so a resend delivers exactly what was rendered, signed afresh. ``send_part``
raises ``DeliveryError`` with ``transient`` set for what is worth retrying (a connection that
failed, a timeout, 5xx, 429, an SMTP 4xx reply, WeCom's rate limit), unset otherwise.
"""

from __future__ import annotations

import asyncio
import json
import smtplib
import ssl
import uuid
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.utils import make_msgid
from typing import Any, Protocol

import httpx

from hermes_agent.channels.config import (
    ChannelSettings,
    EmailChannel,
    WebhookChannel,
    WecomChannel,
)
from hermes_agent.channels.signing import DELIVERY_HEADER, signed_headers
from hermes_agent.errors import HermesAgentError

WECOM_TRANSIENT_ERRCODES = frozenset({-1, 45009})
"""WeCom ``errcode`` values worth retrying: system busy, and the bot's rate limit (20 messages
a minute)."""


class DeliveryError(HermesAgentError):
    """A part that was not delivered; ``transient`` when a retry may succeed."""

    def __init__(self, message: str, *, transient: bool, retry_after: float | None = None):
        super().__init__(message)
        self.transient = transient
        self.retry_after = retry_after


@dataclass(slots=True)
class OutboundMessage:
    """An answer rendered for one channel."""

    channel: str
    content: str
    format: str = "text"
    user_id: str | None = None
    request_id: str | None = None
    kind: str = "answer"
    """``answer``, ``quota`` (the polite refusal), ``failure`` or ``test``."""
    metadata: dict[str, Any] = field(default_factory=dict)


class Sender(Protocol):
    """One channel's way out."""

    def parts(self, message: OutboundMessage) -> list[dict[str, Any]]:
        """The parts that deliver ``message``, in order."""
        ...

    async def send_part(self, part: dict[str, Any]) -> None:
        """Deliver one part; ``DeliveryError`` when it was not delivered."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...


def _http_failure(reply: httpx.Response, what: str) -> DeliveryError:
    status = reply.status_code
    transient = status >= 500 or status in (408, 429)
    retry_after: float | None = None
    header = reply.headers.get("retry-after")
    if header is not None:
        try:
            retry_after = max(0.0, float(header))
        except ValueError:
            retry_after = None
    return DeliveryError(
        f"{what} answered HTTP {status}: {reply.text[:200]}",
        transient=transient,
        retry_after=retry_after,
    )


def _http_error(exc: httpx.HTTPError, what: str) -> DeliveryError:
    return DeliveryError(f"{what}: {type(exc).__name__}: {exc}", transient=True)


class WebhookSender:
    """POSTs a JSON body signed with HMAC-SHA256 (``hermes_agent.channels.signing``)."""

    def __init__(self, name: str, settings: WebhookChannel) -> None:
        self.name = name
        self.settings = settings
        self._client = httpx.AsyncClient(timeout=settings.timeout_s)

    def parts(self, message: OutboundMessage) -> list[dict[str, Any]]:
        return [
            {
                "delivery_id": uuid.uuid4().hex,
                "channel": message.channel,
                "kind": message.kind,
                "user_id": message.user_id,
                "request_id": message.request_id,
                "format": message.format,
                "content": message.content,
                **({"metadata": message.metadata} if message.metadata else {}),
            }
        ]

    async def send_part(self, part: dict[str, Any]) -> None:
        body = json.dumps(part, ensure_ascii=False, separators=(",", ":")).encode()
        headers = {
            **self.settings.headers,
            "Content-Type": "application/json",
            DELIVERY_HEADER: str(part.get("delivery_id", "")),
            **signed_headers(self.settings.secret, body),
        }
        try:
            reply = await self._client.post(self.settings.url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            raise _http_error(exc, f"webhook {self.name}") from exc
        if not reply.is_success:
            raise _http_failure(reply, f"webhook {self.name}")

    async def aclose(self) -> None:
        await self._client.aclose()


def split_utf8(text: str, limit: int) -> list[str]:
    """``text`` in pieces of at most ``limit`` UTF-8 bytes, cut at line ends where possible,
    else between characters (never inside one); the pieces joined give ``text`` back."""
    if len(text.encode()) <= limit:
        return [text]
    pieces: list[str] = []
    current = ""
    size = 0
    for line in text.splitlines(keepends=True):
        line_size = len(line.encode())
        if size + line_size <= limit:
            current += line
            size += line_size
            continue
        if current:
            pieces.append(current)
            current, size = "", 0
        while line_size > limit:  # one line longer than a piece: cut between characters
            cut = _prefix_within(line, limit)
            pieces.append(line[:cut])
            line = line[cut:]
            line_size = len(line.encode())
        current, size = line, line_size
    if current:
        pieces.append(current)
    return pieces


def _prefix_within(text: str, limit: int) -> int:
    """The number of characters of ``text`` that fit in ``limit`` UTF-8 bytes."""
    cut = len(text.encode()[:limit].decode("utf-8", errors="ignore"))
    return max(1, cut)


class WecomSender:
    """A WeCom group bot: ``{"msgtype": "markdown", "markdown": {"content": ...}}`` (or
    ``text``), each message within the bot's byte limit; a long answer goes as several messages
    marked ``(1/3)``, ``(2/3)``, ... The bot answers HTTP 200 with ``{"errcode": 0}`` on success."""

    MARK_BYTES = 16
    """Room kept in each piece for its ``(i/n)`` mark."""

    def __init__(self, name: str, settings: WecomChannel) -> None:
        self.name = name
        self.settings = settings
        self._client = httpx.AsyncClient(timeout=settings.timeout_s)

    def parts(self, message: OutboundMessage) -> list[dict[str, Any]]:
        limit = self.settings.limit
        pieces = split_utf8(message.content, limit)
        if len(pieces) > 1:
            pieces = split_utf8(message.content, limit - self.MARK_BYTES)
            total = len(pieces)
            pieces = [f"({i}/{total})\n{piece}" for i, piece in enumerate(pieces, 1)]
        kind = self.settings.msgtype
        return [{"msgtype": kind, kind: {"content": piece}} for piece in pieces]

    async def send_part(self, part: dict[str, Any]) -> None:
        what = f"WeCom bot {self.name}"
        try:
            reply = await self._client.post(self.settings.url, json=part)
        except httpx.HTTPError as exc:
            raise _http_error(exc, what) from exc
        if not reply.is_success:
            raise _http_failure(reply, what)
        try:
            answer = reply.json()
            code = int(answer.get("errcode", 0))
        except (ValueError, AttributeError, TypeError):
            raise DeliveryError(f"{what} answered {reply.text[:200]!r}", transient=True) from None
        if code != 0:
            raise DeliveryError(
                f"{what} answered errcode {code}: {answer.get('errmsg', '')}",
                transient=code in WECOM_TRANSIENT_ERRCODES,
            )

    async def aclose(self) -> None:
        await self._client.aclose()


def markdown_to_html(text: str) -> str:
    """The HTML part of an email: the rendered markdown (tables included); HTML in the text is
    escaped, never passed through."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(text)
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8"></head>\n'
        '<body style="font-family: sans-serif">\n'
        f"{body}</body></html>\n"
    )


class EmailSender:
    """Email over SMTP (the standard library's ``smtplib`` in a thread): STARTTLS, SSL or
    neither, with login when a username is set; ``multipart/alternative`` plain text (the
    rendered answer) + HTML (the same, as HTML)."""

    def __init__(self, name: str, settings: EmailChannel) -> None:
        self.name = name
        self.settings = settings

    def parts(self, message: OutboundMessage) -> list[dict[str, Any]]:
        values = {
            "channel": message.channel,
            "user_id": message.user_id or "",
            "request_id": message.request_id or "",
        }
        subject = self.settings.subject.format_map(_Blank(values))
        return [
            {
                "from": self.settings.from_,
                "to": list(self.settings.to),
                "subject": subject,
                "text": message.content,
                "html": markdown_to_html(message.content),
                "request_id": message.request_id,
            }
        ]

    def _context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.settings.ca_file)

    def _send(self, part: dict[str, Any]) -> None:
        email = EmailMessage()
        email["From"] = part["from"]
        email["To"] = ", ".join(part["to"])
        email["Subject"] = part["subject"]
        email["Message-ID"] = make_msgid(domain=str(part["from"]).rpartition("@")[2] or None)
        if part.get("request_id"):
            email["X-Hermes-Request-Id"] = str(part["request_id"])
        email.set_content(part["text"])
        email.add_alternative(part["html"], subtype="html")
        s = self.settings
        client: smtplib.SMTP
        if s.security == "ssl":
            client = smtplib.SMTP_SSL(
                s.host, s.smtp_port, timeout=s.timeout_s, context=self._context()
            )
        else:
            client = smtplib.SMTP(s.host, s.smtp_port, timeout=s.timeout_s)
        with client:
            if s.security == "starttls":
                client.starttls(context=self._context())
            if s.username:
                client.login(s.username, s.password or "")
            client.send_message(email)

    async def send_part(self, part: dict[str, Any]) -> None:
        what = f"SMTP {self.settings.host}:{self.settings.smtp_port} ({self.name})"
        try:
            await asyncio.to_thread(self._send, part)
        except smtplib.SMTPAuthenticationError as exc:
            raise DeliveryError(f"{what}: login refused: {exc}", transient=False) from exc
        except (smtplib.SMTPNotSupportedError, ssl.SSLCertVerificationError) as exc:
            # The server cannot do what the settings ask (STARTTLS, AUTH), or its certificate
            # is not trusted: the same next time.
            raise DeliveryError(f"{what}: {type(exc).__name__}: {exc}", transient=False) from exc
        except smtplib.SMTPRecipientsRefused as exc:
            codes = [code for code, _ in exc.recipients.values()]
            transient = all(400 <= code < 500 for code in codes)
            raise DeliveryError(f"{what}: recipients refused: {exc}", transient=transient) from exc
        except smtplib.SMTPResponseException as exc:
            transient = 400 <= exc.smtp_code < 500
            raise DeliveryError(
                f"{what}: {exc.smtp_code} {exc.smtp_error!r}", transient=transient
            ) from exc
        except (smtplib.SMTPException, OSError) as exc:  # disconnected, refused, timed out, TLS
            raise DeliveryError(f"{what}: {type(exc).__name__}: {exc}", transient=True) from exc

    async def aclose(self) -> None:
        return None


class _Blank(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def make_sender(name: str, settings: ChannelSettings) -> Sender:
    """The sender for a channel's settings."""
    if isinstance(settings, WebhookChannel):
        return WebhookSender(name, settings)
    if isinstance(settings, WecomChannel):
        return WecomSender(name, settings)
    return EmailSender(name, settings)
