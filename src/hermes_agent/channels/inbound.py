"""An inbound payload → the message, the service's stable user id, and the session.

The user id is the channel's **stable** id for the person (``user_field``, e.g.
``external_userid``), never a per-session or per-message one: quotas, sessions and runs belong
to it. The service's id is ``<namespace>~<id>`` (the namespace is the channel's name unless
``user_namespace`` says otherwise), so a channel's users can never be taken for API-key users
(whose ids have no ``:``) nor for another channel's. An id that is not 1-64 letters, digits,
``_ . @ -``, or that makes the whole longer than 64 characters, is replaced by
``h-<first 32 hex digits of its SHA-256>``: still stable, still one per person.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from hermes_agent.channels.config import InboundSettings
from hermes_agent.errors import HermesAgentError

_PLAIN = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
MAX_USER_ID = 64
DEFAULT_SESSION = "chat"


class InboundRefused(HermesAgentError):
    """A payload the channel cannot take: ``status_code`` (400, 422) and why."""

    def __init__(self, status_code: int, message: str, event: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.event = event
        """What the channel log calls it (``bad_payload``, ``missing_user``)."""


@dataclass(frozen=True, slots=True)
class InboundMessage:
    """What an inbound payload asks for."""

    message: str
    user_id: str
    """The service's id: ``<namespace>~<stable id>``."""
    external_id: str
    """The channel's own id, as given."""
    session_id: str
    used_field: str
    """The field the id came from (``user_field``, or ``fallback_field``)."""


def field_at(payload: Any, path: str) -> Any:
    """The value at a dotted path (``from.userid``; a list index is a number), or ``None``."""
    node = payload
    for key in path.split("."):
        if isinstance(node, dict):
            node = node.get(key)
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
    return node


def _text(value: Any) -> str | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        return None
    return value.strip()


NAMESPACE_SEPARATOR = "~"
"""Between a channel's namespace and its user's id. API-key user ids cannot hold it, and the
service stores sessions as ``<user>:<session>``: with ``:`` here, a key for the user
``relay`` could name the session ``wm-42:c1`` and so reach the channel user ``relay:wm-42``'s
session ``c1``."""


def namespaced(namespace: str, external_id: str, *, limit: int = MAX_USER_ID) -> str:
    """The service's user id for a channel's id (hashed when it is not plain or too long)."""
    if _PLAIN.match(external_id) and len(namespace) + 1 + len(external_id) <= limit:
        return f"{namespace}{NAMESPACE_SEPARATOR}{external_id}"
    digest = hashlib.sha256(external_id.encode()).hexdigest()[:32]
    return f"{namespace}{NAMESPACE_SEPARATOR}h-{digest}"


def map_inbound(channel: str, settings: InboundSettings, payload: Any) -> InboundMessage:
    """Map a payload; ``InboundRefused`` when it has no message or no user id."""
    if not isinstance(payload, dict):
        raise InboundRefused(400, "the payload must be a JSON object", "bad_payload")
    message = _text(field_at(payload, settings.message_field))
    if message is None:
        raise InboundRefused(
            422, f"the payload has no message at {settings.message_field!r}", "bad_payload"
        )
    used = settings.user_field
    external = _text(field_at(payload, used))
    if external is None and settings.on_missing_user == "fallback":
        assert settings.fallback_field is not None
        used = settings.fallback_field
        external = _text(field_at(payload, used))
    if external is None:
        tried = settings.user_field
        if settings.on_missing_user == "fallback":
            tried += f" or {settings.fallback_field}"
        raise InboundRefused(
            422,
            f"the payload has no user id at {tried!r}; the channel answers only messages that "
            "name their user (quotas count per user)",
            "missing_user",
        )
    session = DEFAULT_SESSION
    if settings.session_field:
        found = _text(field_at(payload, settings.session_field))
        if found is not None:
            hashed = namespaced("s", found).split(NAMESPACE_SEPARATOR, 1)[1]
            session = found if _PLAIN.match(found) else hashed
    return InboundMessage(
        message=message,
        user_id=namespaced(settings.user_namespace or channel, external),
        external_id=external,
        session_id=session,
        used_field=used,
    )
