"""What the service is told: where it listens, who may call it, and its limits.

The settings come from the ``service:`` section of the agent's config file (``service_settings``)
or are given in code (``ServiceSettings(...)``); the command line's flags override the file.

    service:
      host: 127.0.0.1
      port: 8000
      auth: keys
      max_runs_in_flight_per_user: 4
      quotas:
        runs_per_day: 200
        tokens_per_day: 500000
        users:
          ops: {runs_per_day: null}      # no limit on runs for the user ops
"""

from __future__ import annotations

import socket
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from hermes_agent.config import HermesConfig, validate_section
from hermes_agent.runs.gate import GateLimits

# The one status vocabulary, shared with the queue's workers.
from hermes_agent.runs.status import FINAL_STATUSES as FINAL_STATUSES
from hermes_agent.runs.status import RunStatus as RunStatus


class QuotaLimits(BaseModel):
    """One user's daily limits (UTC days); ``None`` means no limit."""

    model_config = ConfigDict(extra="forbid")

    runs_per_day: int | None = Field(default=None, ge=0)
    """Runs a user may start per day; a run counts when it starts."""
    tokens_per_day: int | None = Field(default=None, ge=0)
    """Model tokens (prompt and completion) a user's runs may use per day; a run is refused
    once the day's total has reached it (the run that crosses it finishes)."""


class QuotaSettings(QuotaLimits):
    """The daily quotas of every user, and per-user ``users`` overrides: a key an override
    sets replaces the default for that user (``null`` lifts the limit), one it leaves out
    keeps the default. Quotas apply to admin keys' users too (give them an override)."""

    users: dict[str, QuotaLimits] = Field(default_factory=dict)
    tokens_reserved_per_run: int = Field(default=4000, ge=0)
    """Tokens a run of a user with ``tokens_per_day`` holds back from the day while it is in
    flight; what it spent replaces them when it ends."""

    def limits_for(self, user_id: str) -> QuotaLimits:
        """The limits that apply to ``user_id``."""
        override = self.users.get(user_id)
        if override is None:
            return QuotaLimits(runs_per_day=self.runs_per_day, tokens_per_day=self.tokens_per_day)
        given = override.model_fields_set
        return QuotaLimits(
            runs_per_day=override.runs_per_day if "runs_per_day" in given else self.runs_per_day,
            tokens_per_day=(
                override.tokens_per_day if "tokens_per_day" in given else self.tokens_per_day
            ),
        )

    @property
    def enabled(self) -> bool:
        """Whether any user has a limit (else nothing is counted)."""
        limits = [self, *self.users.values()]
        return any(q.runs_per_day is not None or q.tokens_per_day is not None for q in limits)


class McpDoor(BaseModel):
    """The agent's tools as an MCP server (streamable HTTP) inside the service, at ``path``:
    one more front door, with the service's keys, limits, quotas and engine (in process or
    queued). ``ask`` adds the agent itself as a tool; ``approve`` names the tools whose calls
    it approves (nobody can be asked over MCP; the others are denied); ``toolsets`` narrows
    what it serves."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(default="/mcp", pattern=r"^/[A-Za-z0-9._~/-]*$")
    ask: bool = True
    approve: list[str] = Field(default_factory=list)
    toolsets: list[str] | None = None
    max_sessions_per_user: int = Field(default=16, gt=0)
    """MCP sessions one user may hold open at once; beyond it: 429."""
    session_idle_timeout_s: float = Field(default=300.0, gt=0)
    """A session with no request in flight for this long is closed (and stops counting)."""


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
    max_conversation_chars: int = Field(default=128_000, gt=0)
    """The most characters one request may bring in all: its message, tool results, and the
    earlier turns of a conversation it sends along (an OpenAI request without a session, or
    a response it continues) — 413 beyond it."""
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
    """The ``Retry-After`` sent with a 429 for runs in flight (a quota's says when the day
    resets)."""
    quotas: QuotaSettings = Field(default_factory=QuotaSettings)
    """Per-user daily quotas (runs and tokens), kept where the API keys are."""
    channels: dict[str, Any] = Field(default_factory=dict)
    """Channels (webhook, WeCom bot, email): validated by ``hermes_agent.channels``."""
    allowed_hosts: list[str] = Field(default_factory=list)
    """``Host`` names served besides loopback ones (``localhost``, ``127.0.0.1``, ``[::1]``)
    when the service listens on loopback or runs with ``auth: none`` — a reverse proxy's
    public name, say; any other gets 421 (DNS rebinding). ``name`` or ``name:port``."""
    allowed_origins: list[str] = Field(default_factory=list)
    """Web origins (``https://app.example``) whose pages may open the WebSocket — and, with
    ``auth: none``, call the API — besides the service's own; any other gets 403."""
    key_check_s: float = Field(default=2.0, gt=0)
    """How long an open connection trusts its key's last check: a revoked key stops acting
    on open WebSockets (at their next message) and event streams (at their next frame or
    keep-alive) within this."""
    stream_token_ttl_s: float = Field(default=300.0, gt=0)
    """Seconds a stream token (``POST /v1/runs/{id}/stream-token``) may open its run's
    event stream."""
    max_streams_per_user: int = Field(default=16, gt=0)
    """Event streams (``GET /v1/runs/{id}/events``) and WebSockets one user may hold open at
    once; beyond it: 429 (the stream of a ``POST /v1/runs`` with ``stream: true`` counts but
    is never refused: the runs in flight bound it)."""
    limit_concurrency: int | None = Field(default=1000, gt=0)
    """Connections (and requests in progress) uvicorn holds at once under ``hermes-agent
    serve``; beyond it new requests get 503. ``null``: no limit."""
    timeout_keep_alive_s: int = Field(default=5, gt=0)
    """Seconds an idle HTTP keep-alive connection is kept (``hermes-agent serve``)."""
    header_timeout_s: float = Field(default=10.0, gt=0)
    """Seconds a client has to send a request's headers (``hermes-agent serve``): a slow
    client (slowloris) is closed after it."""
    mcp: McpDoor | None = None
    """Serve the agent's tools over MCP inside the service too (``mcp: {path: /mcp}``)."""
    openai_client_tools: Literal["off", "alone", "with_agent_tools"] = "alone"
    """When an OpenAI client sends its own ``tools`` (the facade then hands their calls back to
    it): ``alone`` — the run sees only the client's tools; ``with_agent_tools`` — the agent's
    own tools stay available beside them (and run server-side); ``off`` — client tools are
    refused (400)."""
    openai_schema_agent_tools: bool = False
    """Whether an OpenAI request that asks for a JSON answer (``response_format`` or
    ``text.format``: ``json_schema``, ``json_object``) and brings no ``tools`` of its own keeps
    the agent's own tools (run server-side). Off by default: such a client uses the service
    as a model that answers in its schema, and the run sees only what the request allows."""
    openai_user_sessions: bool = False
    """Whether an OpenAI request's ``user`` field names a session the service keeps (as the
    ``X-Hermes-Session-Id`` header does). Off by default: ``user`` identifies an end user, and
    end users relayed under one key with the same value would share a conversation."""
    execution: Literal["in_process", "queue"] = "in_process"
    """Where runs run: in this process (``in_process``), or on the Celery workers of the
    config's ``queue:`` section (``queue``: ``POST /v1/runs`` answers ``202`` at once and the
    run's events are read back from the SQL store; see ``server.queued``)."""
    instance_name: str | None = Field(default=None, min_length=1, max_length=200)
    """This instance's name among those sharing a store (in process): each run's first record
    names it, and on start the instance ends as ``interrupted`` the runs its earlier life left
    without an ending — its own only. Default ``<machine's host name>:<port>`` (the bind
    address would be the same ``0.0.0.0:8000`` for every replica); give each instance on one
    store its own when several share a host name."""

    @property
    def instance(self) -> str:
        """``instance_name``, or ``<machine's host name>:<port>``."""
        return self.instance_name or f"{socket.gethostname()}:{self.port}"

    def gate_limits(self) -> GateLimits:
        """The limits the run layer's gate holds every run to."""
        return GateLimits(
            max_message_chars=self.max_message_chars,
            max_conversation_chars=self.max_conversation_chars,
            max_runs_in_flight=self.max_runs_in_flight,
            max_runs_in_flight_per_user=self.max_runs_in_flight_per_user,
            retry_after_s=self.retry_after_s,
            client_tools=self.openai_client_tools != "off",
        )


def service_settings(config: HermesConfig | None = None, **overrides: Any) -> ServiceSettings:
    """The settings of the config's ``service:`` section, with ``overrides`` (those not
    ``None``) on top. Raises ``ConfigError`` naming the file and the key for a bad value."""
    data: dict[str, Any] = dict(config.service or {}) if config is not None else {}
    data.update({key: value for key, value in overrides.items() if value is not None})
    source = config.source if config is not None else "<settings>"
    return validate_section(ServiceSettings, data, source=source, key="service")


def store_url(
    settings: ServiceSettings, config: HermesConfig | None, default: str = "memory://"
) -> str:
    """Where API keys and quota counts are kept: ``keys_url``, else the config's storage URL,
    else ``default``."""
    if settings.keys_url:
        return settings.keys_url
    if config is not None and config.storage is not None:
        return config.storage.url
    return default
