"""Channels: answers delivered by webhook, chat-app bot (WeCom) and email, each rendered its own
way, with retries and dead letters; and inbound messages mapped to stable user ids.

The service reads them from ``service.channels`` (``hermes_agent.channels.config``) and serves
``POST /v1/channels/{name}/inbound`` (``hermes_agent.server.routes_channels``); a library user
delivers a ``RunResult`` with ``ChannelHub.deliver_result``; an operator lists and resends dead
letters with ``hermes-agent channels``. See docs/channels.md. A public module: import from
here, not from its submodules (docs/api.md).
"""

from hermes_agent.channels.config import (
    EmailChannel,
    InboundSettings,
    RetrySettings,
    WebhookChannel,
    WecomChannel,
    channel_settings,
)
from hermes_agent.channels.hub import ChannelHub, Delivery, render_input
from hermes_agent.channels.inbound import InboundMessage, map_inbound, namespaced
from hermes_agent.channels.senders import DeliveryError, OutboundMessage, split_utf8
from hermes_agent.channels.signing import signature, signed_headers, verify
from hermes_agent.channels.store import (
    ChannelStore,
    DeadLetter,
    LogEntry,
    MemoryChannelStore,
    SqlChannelStore,
    open_channel_store,
)

__all__ = [
    "ChannelHub",
    "ChannelStore",
    "DeadLetter",
    "Delivery",
    "DeliveryError",
    "EmailChannel",
    "InboundMessage",
    "InboundSettings",
    "LogEntry",
    "MemoryChannelStore",
    "OutboundMessage",
    "RetrySettings",
    "SqlChannelStore",
    "WebhookChannel",
    "WecomChannel",
    "channel_settings",
    "map_inbound",
    "namespaced",
    "open_channel_store",
    "render_input",
    "signature",
    "signed_headers",
    "split_utf8",
    "verify",
]
