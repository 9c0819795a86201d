"""The run layer's own events, under their old address (``runs.events``)."""

from hermes_agent.runs.events import ApprovalRequiredEvent as ApprovalRequiredEvent
from hermes_agent.runs.events import ApprovalResolvedEvent as ApprovalResolvedEvent
from hermes_agent.runs.events import RunStoppedEvent as RunStoppedEvent
from hermes_agent.runs.events import ServiceEvent as ServiceEvent
