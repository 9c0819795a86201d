"""The agent as a service: HTTP, Server-Sent Events and WebSocket (the ``server`` extra).

from hermes_agent.server import create_app
app = create_app("config.yaml")

A public module: import from here, not from its submodules (docs/api.md).
"""

from hermes_agent.heap import settle_heap
from hermes_agent.runs.events import ApprovalRequiredEvent, ApprovalResolvedEvent, RunStoppedEvent
from hermes_agent.runs.keys import KeyStore, open_key_store
from hermes_agent.runs.principal import Principal
from hermes_agent.runs.settings import ServiceSettings
from hermes_agent.server.app import create_app
from hermes_agent.server.auth import current_user

__all__ = [
    "ApprovalRequiredEvent",
    "ApprovalResolvedEvent",
    "KeyStore",
    "Principal",
    "RunStoppedEvent",
    "ServiceSettings",
    "create_app",
    "current_user",
    "open_key_store",
    "settle_heap",
]
