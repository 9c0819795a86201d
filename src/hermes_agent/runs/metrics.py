"""Prometheus metrics, one registry per app (so two apps in one process never share counts)."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from hermes_agent.events import (
    Event,
    InputEvent,
    OutputEvent,
    SelectionEvent,
    ThoughtEvent,
    ToolResultsEvent,
)
from hermes_agent.stages import HookStage

_STAGE_EVENTS: dict[type[Event], str] = {
    InputEvent: HookStage.INPUT,
    ThoughtEvent: HookStage.THOUGHT,
    SelectionEvent: HookStage.SELECTION,
    ToolResultsEvent: HookStage.EXECUTION,
    OutputEvent: HookStage.OUTPUT,
}


class ServiceMetrics:
    """Runs by final status, runs in flight, tool calls by status, per-stage latency, and
    requests refused before a run started (quota rejections also on their own).

    Stage latency is measured between stage events (time from the previous stage's event, or
    the run's start, to this stage's event), which is what the service can see through the
    event seam; the audit records hold each stage's own latency.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.runs = Counter(
            "hermes_runs", "Runs by how they ended.", ["status"], registry=self.registry
        )
        self.in_flight = Gauge(
            "hermes_runs_in_flight", "Runs not finished yet.", registry=self.registry
        )
        self.tool_calls = Counter(
            "hermes_tool_calls", "Tool calls by status code.", ["status"], registry=self.registry
        )
        self.stage_latency = Histogram(
            "hermes_stage_latency_seconds",
            "Time between stage events, by stage.",
            ["stage"],
            registry=self.registry,
        )
        self.rejections = Counter(
            "hermes_rejections",
            "Requests refused before a run started, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.quota_rejections = Counter(
            "hermes_quota_rejections",
            "Runs refused because the user's daily quota was spent, by quota "
            "(runs_per_day, tokens_per_day); also counted in hermes_rejections.",
            ["quota"],
            registry=self.registry,
        )

    def refused(self, reason: str, *, quota: bool = False) -> None:
        """Count a run the gate refused (``runs.gate.RefusalCounter``)."""
        self.rejections.labels(reason).inc()
        if quota:
            self.quota_rejections.labels(reason).inc()

    def observe(self, event: Event, since: float) -> float:
        """Count what one event says; returns the time to measure the next stage from."""
        stage = _STAGE_EVENTS.get(type(event))
        if stage is None:
            return since
        now = time.perf_counter()
        self.stage_latency.labels(stage).observe(now - since)
        if isinstance(event, ToolResultsEvent):
            for result in event.results:
                self.tool_calls.labels(str(result.status)).inc()
        elif isinstance(event, SelectionEvent):
            for refused in event.rejected:
                self.tool_calls.labels(str(refused.status)).inc()
        return now

    def exposition(self) -> bytes:
        """The text format ``/metrics`` serves."""
        return generate_latest(self.registry)
