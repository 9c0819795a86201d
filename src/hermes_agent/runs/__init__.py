"""The run layer: one typed request, one principal, one gate, one status vocabulary, between
the front doors (REST, SSE, WebSocket, the OpenAI facade, channels, MCP, replay) and the
agent. See ``runs.gate`` for what every run passes before anything of it runs.

Implementation, not public API: import what you need from ``hermes_agent`` (docs/api.md).
"""

from hermes_agent.runs.backend import (
    ApprovalConflict,
    Item,
    RunBackend,
    RunNotFound,
    RunView,
)
from hermes_agent.runs.events import (
    END_EVENTS,
    ApprovalRequiredEvent,
    ApprovalResolvedEvent,
    RunEvent,
    RunStoppedEvent,
    StoredResultEvent,
    UnknownEvent,
    is_end,
    read_event,
    read_known,
)
from hermes_agent.runs.gate import (
    Admission,
    Gate,
    GateLimits,
    RunRejected,
    exposed_toolsets,
    tokens_used,
)
from hermes_agent.runs.principal import (
    LOCAL_USER,
    Principal,
    client_session_id,
    mcp_local_user,
    stored_session_id,
)
from hermes_agent.runs.request import RunRequest
from hermes_agent.runs.status import FINAL_STATUSES, STOP_CODES, RunStatus, ending_status

__all__ = [
    "END_EVENTS",
    "FINAL_STATUSES",
    "LOCAL_USER",
    "STOP_CODES",
    "Admission",
    "ApprovalConflict",
    "ApprovalRequiredEvent",
    "ApprovalResolvedEvent",
    "Gate",
    "GateLimits",
    "Item",
    "Principal",
    "RunBackend",
    "RunEvent",
    "RunNotFound",
    "RunRejected",
    "RunRequest",
    "RunStatus",
    "RunStoppedEvent",
    "RunView",
    "StoredResultEvent",
    "UnknownEvent",
    "client_session_id",
    "ending_status",
    "exposed_toolsets",
    "is_end",
    "mcp_local_user",
    "read_event",
    "read_known",
    "stored_session_id",
    "tokens_used",
]
