"""Who a run belongs to, and how a session id is kept per user.

A ``Principal`` is the caller every front door resolves before anything runs: an API key's
user, a channel's mapped user (``<channel>~<their id>``), the MCP server's configured local
user (``mcp!<name>``), or the service's ``local`` user where the operator turned keys off. The
three kinds of id are drawn from disjoint alphabets (an API key's user id holds neither ``~``
nor ``!``), so no one kind can name another's sessions.

The store keeps a user's session under ``<user_id>:<session_id>``: a session id on the API is
always the caller's own, and no door can name another user's conversation.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

LOCAL_USER = "local"
"""The user of a service with ``auth: none`` (loopback only)."""
MCP_USER_PREFIX = "mcp!"
"""The MCP server's local users (stdio, or HTTP without keys on loopback)."""

_MCP_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,48}$")


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller: a stable user id (what runs, sessions, quotas and approvals belong to) and
    whether the caller may see everyone's runs."""

    user_id: str
    admin: bool = False


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address, ``[v6]``, or ``localhost``) is this machine's loopback:
    the only place a door may take callers without credentials."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def mcp_local_user(name: str = "local") -> Principal:
    """The principal of an MCP client the server cannot authenticate (stdio): ``mcp!<name>``,
    an id no API key or channel user can have."""
    if not _MCP_NAME.match(name):
        raise ValueError(
            f"MCP user name {name!r}: use 1-48 letters, digits or _ . @ - (e.g. --user local)"
        )
    return Principal(MCP_USER_PREFIX + name)


def stored_session_id(user_id: str, session_id: str) -> str:
    """The id the store keeps a user's session under."""
    return f"{user_id}:{session_id}"


def client_session_id(user_id: str, stored: str) -> str | None:
    """The user's own session id for a stored one, or ``None`` when it is not theirs."""
    prefix = f"{user_id}:"
    return stored[len(prefix) :] if stored.startswith(prefix) else None
