"""Moved: replay is behaviour, not storage, and lives in ``hermes_agent.replay``. This name
stays for one release so that existing imports keep working."""

from __future__ import annotations

from hermes_agent.replay import Replayable, ReplayReport, ReplayRun, StepDiff, replay

__all__ = ["ReplayReport", "ReplayRun", "Replayable", "StepDiff", "replay"]
