"""The ``service.channels`` section: one entry per channel, each a sender (``type``) with its
renderer, retry policy, messages and optional inbound mapping.

    service:
      channels:
        ops:                                   # the generic webhook
          type: webhook
          url: https://ops.example.com/hermes
          secret: ${OPS_WEBHOOK_SECRET}
        wecom:                                 # a WeCom group bot
          type: wecom
          url: https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=${WECOM_BOT_KEY}
          msgtype: markdown
          renderer: flight_brief
          inbound:
            secret: ${WECOM_RELAY_SECRET}
            user_field: external_userid        # the app's stable id, never a per-session one
            message_field: text.content
            copy_to: [reports]
        reports:                               # email over SMTP
          type: email
          host: smtp.example.com
          security: starttls
          username: bot@example.com
          password: ${SMTP_PASSWORD}
          from: bot@example.com
          to: [ops@example.com]
          renderer: flight_report

Each channel is validated by the class of its ``type``; a bad key is a ``ConfigError`` that
names the file and the key (``config.yaml: service.channels.wecom.msgtyp: unknown key; did you
mean 'msgtype'?``).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hermes_agent.config import validate_section
from hermes_agent.errors import ConfigError

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,32}$")

DEFAULT_QUOTA_MESSAGE = (
    "Sorry, you have reached today's limit of questions. It resets at 00:00 UTC; "
    "please try again then."
)
DEFAULT_FAILURE_MESSAGE = "Sorry, I could not answer that just now. Please try again later."


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class RetrySettings(_Strict):
    """Delivery attempts: ``attempts`` tries in all, waiting ``backoff_s``, then twice as long
    each time (at most ``max_backoff_s``; a ``Retry-After`` the receiver sends is honoured up to
    it) between them, on transient failures only."""

    attempts: int = Field(default=4, ge=1, le=20)
    backoff_s: float = Field(default=1.0, ge=0)
    max_backoff_s: float = Field(default=60.0, ge=0)


class InboundSettings(_Strict):
    """How ``POST /v1/channels/{name}/inbound`` reads a message for this channel."""

    secret: str = Field(min_length=16)
    """The shared secret of the HMAC-SHA256 signature (``X-Hermes-Signature``)."""
    replay_window_s: float = Field(default=300.0, gt=0)
    """A request whose ``X-Hermes-Timestamp`` is further than this from now is refused."""
    message_field: str = "text"
    """The dotted path of the message text in the JSON payload (``text.content``)."""
    user_field: str = "external_userid"
    """The dotted path of the app's **stable** user id; quotas count on it."""
    on_missing_user: Literal["reject", "fallback"] = "reject"
    """When ``user_field`` is missing or empty: ``reject`` (422, nothing runs) or ``fallback``
    to ``fallback_field``."""
    fallback_field: str | None = None
    session_field: str | None = None
    """The dotted path of a conversation id; without it each user has one conversation per
    channel."""
    user_namespace: str | None = None
    """The prefix of the service's user id (``<namespace>~<id>``); the channel's name if unset."""
    copy_to: list[str] = Field(default_factory=list)
    """Other channels that also get each answer, each rendered with its own renderer."""

    @model_validator(mode="after")
    def _fallback_named(self) -> InboundSettings:
        if self.on_missing_user == "fallback" and not self.fallback_field:
            raise ValueError("on_missing_user: fallback needs fallback_field")
        if self.user_namespace is not None and not _NAME.match(self.user_namespace):
            raise ValueError("user_namespace: use 1-32 letters, digits, '_' or '-'")
        return self


class ChannelBase(_Strict):
    """What every channel has."""

    renderer: str = "text"
    """The output format its answers are rendered with (built in, or one under ``renderers:``)."""
    timeout_s: float = Field(default=10.0, gt=0)
    retry: RetrySettings = Field(default_factory=RetrySettings)
    quota_message: str = DEFAULT_QUOTA_MESSAGE
    """Sent to a user over their daily quota (nothing runs)."""
    failure_message: str = DEFAULT_FAILURE_MESSAGE
    """Sent when the run failed, timed out or was cancelled."""
    inbound: InboundSettings | None = None


class WebhookChannel(ChannelBase):
    """A JSON POST signed with HMAC-SHA256 over ``<timestamp>.<body>``."""

    type: Literal["webhook"]
    url: str = Field(pattern=r"^https?://")
    secret: str = Field(min_length=16)
    headers: dict[str, str] = Field(default_factory=dict)


WECOM_LIMITS = {"text": 2048, "markdown": 4096}
"""The WeCom group bot's content limits, in UTF-8 bytes, per message type."""


class WecomChannel(ChannelBase):
    """A WeCom group bot's webhook (``msgtype`` text or markdown); long answers are split."""

    type: Literal["wecom"]
    url: str = Field(pattern=r"^https?://")
    msgtype: Literal["markdown", "text"] = "markdown"
    renderer: str = "markdown"
    max_bytes: int | None = Field(default=None, ge=64)
    """Bytes per message (the bot's limit for the message type unless set lower)."""

    @property
    def limit(self) -> int:
        return min(self.max_bytes or WECOM_LIMITS[self.msgtype], WECOM_LIMITS[self.msgtype])


class EmailChannel(ChannelBase):
    """Email over SMTP: multipart plain text + HTML."""

    type: Literal["email"]
    host: str
    port: int | None = Field(default=None, ge=1, le=65535)
    """587 for STARTTLS, 465 for SSL, 25 for none, unless set."""
    security: Literal["starttls", "ssl", "none"] = "starttls"
    username: str | None = None
    password: str | None = None
    ca_file: str | None = None
    """A CA bundle to trust besides the system's (a private relay's certificate)."""
    from_: str = Field(alias="from")
    to: list[str] = Field(min_length=1)
    subject: str = "Your answer"
    renderer: str = "markdown"

    @property
    def smtp_port(self) -> int:
        return self.port or {"starttls": 587, "ssl": 465, "none": 25}[self.security]


ChannelSettings = WebhookChannel | WecomChannel | EmailChannel

CHANNEL_TYPES: dict[str, type[WebhookChannel] | type[WecomChannel] | type[EmailChannel]] = {
    "webhook": WebhookChannel,
    "wecom": WecomChannel,
    "email": EmailChannel,
}


def channel_settings(data: Any, *, source: str = "<settings>") -> dict[str, ChannelSettings]:
    """Validate the ``service.channels`` mapping: ``{name: settings}``. Raises ``ConfigError``
    naming the file and the key."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: service.channels: must be a mapping of channel names")
    channels: dict[str, ChannelSettings] = {}
    for name, section in data.items():
        key = f"service.channels.{name}"
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigError(
                f"{source}: {key}: a channel name is 1-32 letters, digits, '_' or '-'"
            )
        if not isinstance(section, dict):
            raise ConfigError(f"{source}: {key}: must be a mapping with a type")
        kind = section.get("type")
        if kind not in CHANNEL_TYPES:
            raise ConfigError(
                f"{source}: {key}.type: must be one of {', '.join(CHANNEL_TYPES)} (got {kind!r})"
            )
        channels[name] = validate_section(CHANNEL_TYPES[kind], section, source=source, key=key)
    for name, channel in channels.items():
        for other in channel.inbound.copy_to if channel.inbound else []:
            if other not in channels:
                raise ConfigError(
                    f"{source}: service.channels.{name}.inbound.copy_to: no channel {other!r}; "
                    f"known: {', '.join(channels)}"
                )
    return channels
