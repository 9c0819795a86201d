"""What the service is told: where it listens, who may call it, and its limits."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ServiceSettings(BaseModel):
    """The service's own settings (the agent's come from its config).

    ``auth: none`` makes every caller the user ``local`` and is refused on any host but
    loopback; ``approval_policy`` says what an approval does while nobody is listening to the
    run: ``deny`` at once, or ``wait`` until ``approval_timeout_s`` (then it is denied as
    ``expired``).
    """

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    auth: Literal["keys", "none"] = "keys"
    keys_url: str | None = None
    """Where API keys are kept (a SQLAlchemy URL or ``memory://``); by default the agent's
    storage URL, or memory when it has none."""
    approval_timeout_s: float = Field(default=300.0, gt=0)
    approval_policy: Literal["deny", "wait"] = "deny"
    max_body_bytes: int = Field(default=1_000_000, gt=0)
    max_message_chars: int = Field(default=32_000, gt=0)
    max_runs_in_flight: int = Field(default=64, gt=0)
    max_runs_in_flight_per_user: int = Field(default=8, gt=0)
    run_timeout_s: float = Field(default=600.0, gt=0)
    keepalive_s: float = Field(default=15.0, gt=0)
    send_timeout_s: float = Field(default=30.0, gt=0)
    """A stream client that takes longer than this to accept one event is dropped (the run
    goes on)."""
    shutdown_grace_s: float = Field(default=30.0, ge=0)
    """On shutdown, how long runs in flight may finish before they are cancelled."""
    max_finished_runs: int = Field(default=1000, gt=0)
    """Finished runs kept in memory for reconnecting clients; older ones are read from the
    store."""
    finished_run_ttl_s: float = Field(default=3600.0, gt=0)
    retry_after_s: int = Field(default=1, ge=1)
    """The ``Retry-After`` sent with a 429."""


RunStatus = Literal["running", "waiting_approval", "completed", "failed", "cancelled", "timed_out"]
"""Where a run is: the last four are final."""

FINAL_STATUSES: frozenset[str] = frozenset({"completed", "failed", "cancelled", "timed_out"})
