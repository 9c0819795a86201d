"""YAML configuration → validated settings.

    model:
      provider: openai          # openai | llamacpp | scripted
      base_url: http://localhost:8000/v1
      api_key: ${OPENAI_API_KEY}
      model_name: hermes-3
      mode: hermes              # native | hermes
      temperature: 0.2
    agent:
      max_iterations: 5
      history_window: 10
      summary_max_chars: 200
      default_timeout: 30

``${VAR}`` is replaced by the environment variable ``VAR``; ``${VAR:-fallback}`` uses
``fallback`` when it is unset. Every problem — an unknown key, a wrong type, a missing variable —
is a ``ConfigError`` naming the file, the key, and what to do.

A config file is code: the hooks and renderers it names are imported and instantiated, so load
only files you would run. YAML aliases are honoured, but a file whose aliases expand past
``MAX_CONFIG_NODES`` values is refused (a few hundred bytes of nested aliases can otherwise
expand to gigabytes), and error messages are bounded in length.
"""

from __future__ import annotations

import difflib
import os
import re
import reprlib
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    ValidationError,
    field_validator,
    model_validator,
)

from hermes_agent.errors import ConfigError
from hermes_agent.stages import HookStage

DEFAULT_STORAGE_URL = "sqlite:///.hermes/state.db"
MAX_CONFIG_NODES = 100_000
"""The most values (mappings, lists and scalars, aliases counted as expanded) a config may hold."""
_MAX_ERROR_LINES = 20
_MAX_VALUE_CHARS = 120
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_Section = TypeVar("_Section", bound=BaseModel)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelConfig(_Strict):
    """Which model to talk to, and how: the fields every provider shares.

    Each provider has its own section class (``OpenAIConfig``, ``LlamaCppConfig``,
    ``ScriptedConfig``, or one a new backend registers with ``register_model``); ``provider``
    picks which one validates the section, so a key that belongs to another provider is an error
    that names it.
    """

    provider: str = "llamacpp"
    model_name: str | None = None
    """The endpoint's model id (required for ``openai``); for the others, a display name."""
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    max_tokens: int | None = Field(default=None, gt=0)
    price_per_1k_prompt: float | None = Field(default=None, ge=0)
    price_per_1k_completion: float | None = Field(default=None, ge=0)
    thought_calls: Literal["ignore", "run", "ask"] | None = None
    """What a ``<tool_call>`` the model writes inside its ``<think>`` thought is: ``ignore``
    (thought, never run; the result warns), ``run`` (run as if written after the thought) or
    ``ask`` (run once the approver approves). ``null``: the model family's (see
    ``models.profiles``)."""
    opens_thought: bool | None = None
    """The model's chat template ends the prompt inside ``<think>``, so its completions start
    in the thought (QwQ, DeepSeek-R1 distills). ``null``: the model family's; set ``false``
    for such a model served with thinking turned off."""

    def secrets(self) -> list[str]:
        """Values in this section that must never be stored in clear (API keys)."""
        return []


class OpenAIConfig(ModelConfig):
    """``provider: openai`` — any OpenAI-compatible endpoint."""

    provider: Literal["openai"] = "openai"
    base_url: str | None = None
    api_key: str | None = None
    mode: Literal["native", "hermes"] = "hermes"
    chat_format: Literal["hermes", "qwen"] = "hermes"
    timeout: float = Field(default=60.0, gt=0)
    max_retries: int = Field(default=2, ge=0)
    context_window: int | None = Field(default=None, gt=0)
    """The endpoint model's context size in tokens; prompts are fitted to it."""
    grammar: bool = False
    """hermes mode: constrain a turn that must call a tool with a GBNF grammar of the calls
    (llama.cpp's server and llama-cpp-python's server accept one)."""
    transport: Literal["auto", "httpx", "aiohttp"] = "auto"
    """The SDK's HTTP client: httpx (its default) or aiohttp, which costs a busy process less
    CPU per request (docs/benchmarks.md) but must be closed on its event loop. ``auto``:
    aiohttp in the service and the workers, which own their loops and close what was opened
    on them, when aiohttp is installed (the ``server``, ``worker`` and ``aiohttp`` extras);
    httpx everywhere else (``Agent.run``, ``Agent.arun`` on a loop of yours)."""

    def secrets(self) -> list[str]:
        return [self.api_key] if self.api_key else []


class LlamaCppConfig(ModelConfig):
    """``provider: llamacpp`` — the embedded model (a GGUF file through llama.cpp)."""

    provider: Literal["llamacpp"] = "llamacpp"
    model_path: str | None = None
    n_ctx: int = Field(default=4096, gt=0)
    chat_format: Literal["hermes", "qwen"] = "hermes"
    use_grammar: bool = True
    max_calls: int = Field(default=1, ge=1)
    """How many tool calls the grammar allows in one turn."""
    call_bias: float | None = 6.5
    """With ``tool_choice: auto``, how readily the model opens a tool call (added to the score
    of the call path over text; higher calls more); ``null`` leaves the choice to the model's
    first token, which never calls unforced. 6.5 is calibrated on BFCL and the quick start for
    the bundled model (docs/evaluation.md)."""


class ScriptedConfig(ModelConfig):
    """``provider: scripted`` — canned completions, for tests and demos."""

    provider: Literal["scripted"] = "scripted"
    responses: list[str] = Field(default_factory=list)
    """The completions to answer with, in order."""


_MODEL_SECTIONS: dict[str, type[ModelConfig]] = {
    "openai": OpenAIConfig,
    "llamacpp": LlamaCppConfig,
    "scripted": ScriptedConfig,
}


def register_model_section(provider: str, section: type[ModelConfig]) -> None:
    """Make ``provider: <provider>`` validate with ``section`` (``models.registry`` calls it)."""
    _MODEL_SECTIONS[provider] = section


def model_section(provider: str) -> type[ModelConfig]:
    """The config class of a provider; ``ConfigError`` naming the known ones otherwise."""
    try:
        return _MODEL_SECTIONS[provider]
    except KeyError:
        raise ConfigError(
            f"model.provider: unknown provider {provider!r}; use one of: "
            f"{', '.join(sorted(_MODEL_SECTIONS))} (or register a backend with register_model)"
        ) from None


class AgentConfig(_Strict):
    """How the loop behaves."""

    system_prompt: str | None = None
    max_iterations: int = Field(default=5, ge=1)
    max_retries: int = Field(default=2, ge=0)
    history_window: int = Field(default=10, ge=0)
    summary_max_chars: int = Field(default=200, ge=0)
    default_timeout: float = Field(default=30.0, gt=0)
    max_concurrency: int = Field(default=8, ge=1)
    max_calls_per_turn: int = Field(default=32, ge=1)
    tool_choice: str = "auto"
    scratch_pad: bool = False
    explain: bool = False
    """Ask the model for a one-line reason with each turn (``Step.reason`` and the trail)."""
    toolsets: list[str] | None = None
    """Only the tools of these toolsets are shown to the model (default: every tool)."""
    language: Literal["en", "zh"] = "en"
    """The language of the runtime's own messages to the end user: a run that stopped short
    (206), a model that failed (502), a refused input, the "more rows" line under a table
    (``hermes_agent.messages``). A run's ``lang`` variable chooses it per run."""
    max_run_tokens: int | None = Field(default=None, gt=0)
    """Tokens one run may use (prompt and completion, every model turn); see pipeline.budget."""
    max_run_cost: float | None = Field(default=None, gt=0)
    """What one run may cost at the model's prices (needs ``price_per_1k_*``)."""
    run_timeout_s: float | None = Field(default=None, gt=0)
    """Seconds one run may take, from its start; then it ends timed out (504)."""
    tool_search_threshold: int | None = Field(default=None, ge=1)
    """Past this many tools, the prompt carries ``search_tools`` and the ``tool_search_top_k``
    definitions that match the message best, not every definition (``tools.search``)."""
    tool_search_top_k: int = Field(default=5, ge=0)
    max_result_chars: int = Field(default=100_000, gt=0)
    """The longest result (characters of its JSON) a tool's call keeps, unless the tool's own
    ``max_result_chars`` is larger; a longer one is cut, with a note saying so, before it is
    stored or sent (``tools.runtime.DEFAULT_MAX_RESULT_CHARS``)."""


class ToolConfig(_Strict):
    """Per-tool settings, applied to the registered tool of the same name."""

    execution_mode: Literal["in_process", "subprocess", "inline"] | None = None
    timeout: float | None = Field(default=None, gt=0)
    memory_limit_mb: int | None = Field(default=None, gt=0)
    cpu_time_limit_s: int | None = Field(default=None, gt=0)
    cache_ttl: float | None = Field(default=None, ge=0)
    max_result_chars: int | None = Field(default=None, gt=0)
    requires_approval: bool | None = None
    fallback: str | None = None
    aliases: list[str] | None = None
    rate_limit: int | None = Field(default=None, gt=0)
    max_concurrent: int | None = Field(default=None, ge=1)
    toolset: str | None = None
    idempotent: bool | None = None

    def settings(self) -> dict[str, Any]:
        """Only what the file sets."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


class HookSpec(BaseModel):
    """A hook to load: ``module`` and ``class`` (called with ``options`` as keyword args)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    module: str
    class_: str = Field(alias="class")
    enabled: bool = True
    options: dict[str, Any] = Field(default_factory=dict)


class TableConfig(_Strict):
    """How the ``table`` and ``markdown`` formats draw tool records (``pipeline.tables``)."""

    columns: dict[str, str] = Field(default_factory=dict)
    """Field name → column header (``flight_no: 航班号``); a nested field is ``dep.time``."""
    only_mapped: bool = False
    """Show only the fields ``columns`` names, in its order."""
    max_rows: int = Field(default=50, ge=1)
    """Rows shown; a last line says how many more there were."""
    max_cell_chars: int = Field(default=80, ge=4)


class OutputConfig(_Strict):
    """How answers are rendered: a default format, formats per channel, and tables."""

    format: str = "text"
    channel_formats: dict[str, str] = Field(default_factory=dict)
    """A channel's name → the format of its answers (``web: markdown``), over the built-in
    ones (``pipeline.renderers.DEFAULT_CHANNEL_FORMATS``). Delivery channels
    (``service.channels``) name their renderer themselves."""
    table: TableConfig = Field(default_factory=TableConfig)


class PromptConfig(_Strict):
    """The system prompt's fixed parts."""

    preamble: str | None = None
    """The role text that opens the Hermes tools prompt, before the tool signatures (``None``:
    the Hermes text, ``protocol.prompts.HERMES_PREAMBLE``; ``""``: none)."""


class StorageConfig(_Strict):
    """Where sessions and the audit trail live (SQLAlchemy URL; SQLite or PostgreSQL)."""

    url: str = DEFAULT_STORAGE_URL


class AuditConfig(_Strict):
    """The audit trail: on or off, and what to redact besides the API key."""

    enabled: bool = True
    redact_patterns: list[str] = Field(default_factory=list)


class TracingConfig(_Strict):
    """OpenTelemetry spans of every run (``hermes_agent.tracing``; needs the ``otel`` extra).
    Spans go to the global TracerProvider (configure it in code or with the standard
    ``OTEL_*`` variables under ``opentelemetry-instrument``)."""

    enabled: bool = False
    capture_content: bool = False
    """Record messages, tool arguments and results (masked like the audit trail)."""
    agent_name: str | None = None
    redact_patterns: list[str] = Field(default_factory=list)
    """More patterns to mask in captured content (besides ``audit.redact_patterns``)."""


_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)


_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
_TokenAuth = Literal["client_secret_basic", "client_secret_post", "none"]


class McpOAuthConfig(_Strict):
    """OAuth for one MCP server over HTTP (``mcp_servers.<name>.oauth``): the client signs the
    user in when the server asks (a 401), opening the authorization page in the browser and
    taking the answer on a loopback address. Tokens and the registration made with the server
    are kept per server in ``.hermes/mcp_oauth/`` beside the config file (mode 0600), never
    here. Scopes are the ones the server asks for (its ``WWW-Authenticate`` or metadata)."""

    client_id: str | None = None
    """A client registered with the authorization server beforehand (else the client uses
    ``client_metadata_url`` where the server supports it, or registers itself)."""
    client_secret: str | None = None
    """The pre-registered client's secret (a confidential client)."""
    token_endpoint_auth_method: _TokenAuth | None = None
    """How the pre-registered client authenticates to the token endpoint (default:
    ``client_secret_basic`` with a secret, ``none`` without)."""
    client_metadata_url: str | None = None
    """An HTTPS URL of this client's metadata document, used as its client id where the
    authorization server supports client ID metadata documents."""
    client_name: str = "Hermes Agent"
    """The name the authorization server shows when the client registers itself."""
    redirect_uri: str | None = None
    """Where the browser brings the answer: ``http://127.0.0.1:PORT/PATH`` (or ``localhost``),
    a listener of the agent's own while the user signs in. Default: a free port, kept with the
    registration; give it when a pre-registered client has a fixed one."""
    sign_in_timeout: float = Field(default=300.0, gt=0)
    """Seconds the user has to approve in the browser (on top of ``connect_timeout``)."""

    @model_validator(mode="after")
    def _consistent(self) -> McpOAuthConfig:
        if self.client_secret and not self.client_id:
            raise ValueError("client_secret needs the client_id it belongs to")
        if self.token_endpoint_auth_method and not self.client_id:
            raise ValueError("token_endpoint_auth_method is for a pre-registered client_id")
        if self.client_metadata_url is not None:
            parts = urlsplit(self.client_metadata_url)
            if parts.scheme != "https" or not parts.netloc or parts.path in ("", "/"):
                raise ValueError("client_metadata_url is an https URL with a path")
        if self.redirect_uri is not None:
            parts = urlsplit(self.redirect_uri)
            if parts.scheme != "http" or parts.hostname is None or not parts.port:
                raise ValueError("redirect_uri is http://127.0.0.1:PORT/PATH (a loopback port)")
            if parts.netloc.rpartition(":")[0] not in _LOOPBACK_HOSTS:
                raise ValueError("redirect_uri is on 127.0.0.1, localhost or [::1] only")
        return self


class McpServerConfig(_Strict):
    """One MCP server whose tools the agent may call (``mcp_servers.<name>``): a ``command``
    to start over stdio, or the ``url`` of a streamable HTTP endpoint. Its tools join the
    toolset ``toolset`` (default: the server's name); see docs/mcp.md."""

    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    """Variables added to the server's environment (stdio)."""
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    """HTTP headers sent with every request (streamable HTTP), e.g. Authorization."""
    oauth: McpOAuthConfig | None = None
    """Sign in with OAuth when the server asks (``oauth: {}`` for the defaults)."""
    toolset: str | None = None
    tool_prefix: str = ""
    """Put before each tool's name (``files_`` → ``files_read``), to keep names apart."""
    tools: list[str] | None = None
    """Only these of the server's tools (default: all)."""
    exclude_tools: list[str] = Field(default_factory=list)
    timeout: float = Field(default=30.0, gt=0)
    """Seconds one call may take (a tool's own ``tools:`` setting overrides it)."""
    connect_timeout: float = Field(default=20.0, gt=0)
    """Seconds to start the server, initialise the session and list the tools."""
    max_tools: int = Field(default=500, gt=0)
    """The most tools the server may list (all pages together); a listing past it is refused
    when the server is loaded, naming the setting."""
    max_result_bytes: int = Field(default=1_000_000, gt=0)
    """The largest result (as JSON, UTF-8) one call may return; a larger one is an error result
    and is neither kept, shown to the model nor written to the trail."""
    requires_approval: bool = False
    """Every tool of this server needs the approver's yes."""
    strict_schemas: bool = True
    """Make tool schemas strict where that is safe (docs/mcp.md says when)."""

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either command (a server started over stdio) or url")
        if self.url is not None and (self.args or self.env or self.cwd):
            raise ValueError("args, env and cwd are for a command; a url server takes headers")
        if self.command is not None and self.headers:
            raise ValueError("headers are for a url server; a command takes env")
        if self.oauth is not None:
            if self.command is not None:
                raise ValueError("oauth is for a url server; a command takes env")
            if any(name.lower() == "authorization" for name in self.headers):
                raise ValueError("give either oauth or an Authorization header, not both")
        return self

    @field_validator("oauth", mode="before")
    @classmethod
    def _oauth_on(cls, value: Any) -> Any:
        return {} if value is True else None if value is False else value

    @property
    def connect_budget(self) -> float:
        """Seconds to connect: ``connect_timeout``, and ``oauth.sign_in_timeout`` on top for a
        server that may send the user to sign in."""
        extra = self.oauth.sign_in_timeout if self.oauth is not None else 0.0
        return self.connect_timeout + extra

    def secrets(self) -> list[str]:
        """Values never to store in clear: every header value, and environment values whose
        name says they are secret (``API_KEY``, ``TOKEN``...)."""
        found = [value for value in self.headers.values() if value]
        found += [token for value in found if (token := value.partition(" ")[2].strip())]
        found += [v for k, v in self.env.items() if v and _SECRET_NAME.search(k)]
        if self.oauth is not None and self.oauth.client_secret:
            found.append(self.oauth.client_secret)
        return found


class QueueConfig(_Strict):
    """Scale-out on Celery workers (``hermes_agent.worker``; needs the ``worker`` extra): where
    runs are queued, and how a run lost with its worker is taken over."""

    broker: str = "redis://127.0.0.1:6379/0"
    """The Celery broker: ``redis://host:port/db`` or ``amqp://user:pw@host:5672//``."""
    queue_name: str = Field(default="hermes-runs", min_length=1, max_length=200)
    lease_ttl: float = Field(default=30.0, gt=0)
    """Seconds a worker's hold on a run lasts without a heartbeat (it beats every third);
    a run whose worker died is taken over once its lease has expired."""
    max_redeliveries: int = Field(default=3, ge=0)
    """How many times a run lost with its worker is taken over again; beyond it the run is
    dead-lettered (``hermes-agent runs requeue`` puts it back)."""
    visibility_timeout: float = Field(default=3600.0, gt=0)
    """Redis broker: seconds before an unacknowledged task is delivered again."""
    sweep_interval: float | None = Field(default=None, gt=0)
    """How often each worker looks for runs to take over (default: ``lease_ttl``)."""
    task_events: bool = False
    """Send Celery's task events (what Flower and ``celery events`` show) from the start: a
    message to the broker as a run is sent, received, started and done (2–5 ms of a
    worker's CPU a run, docs/benchmarks.md). Off, a worker sends them only once something
    asks it to (``celery control enable_events``; Flower does so by itself while it runs)."""


class HermesConfig(_Strict):
    """The whole configuration file."""

    model: SerializeAsAny[ModelConfig] = Field(default_factory=LlamaCppConfig)
    answer_model: SerializeAsAny[ModelConfig] | None = None
    """Writes the final answer while ``model`` makes the tool calls (same keys as ``model``)."""
    agent: AgentConfig = Field(default_factory=AgentConfig)
    prompt: PromptConfig = Field(default_factory=PromptConfig)
    tools: dict[str, ToolConfig] = Field(default_factory=dict)
    hooks: dict[str, list[HookSpec]] = Field(default_factory=dict)
    renderers: dict[str, HookSpec] = Field(default_factory=dict)
    output: OutputConfig = Field(default_factory=OutputConfig)
    storage: StorageConfig | None = None
    audit: AuditConfig = Field(default_factory=AuditConfig)
    tracing: TracingConfig = Field(default_factory=TracingConfig)
    mcp_servers: dict[str, McpServerConfig] = Field(default_factory=dict)
    """MCP servers whose tools the agent gets (``hermes_agent.mcp``; needs the ``mcp`` extra)."""
    mcp_pins: str | None = None
    """The file of approved MCP tool definitions (``tools.mcp.pins``); default
    ``.hermes/mcp_pins.json`` beside the config file, in memory for a config from no file."""
    queue: QueueConfig | None = None
    """Where ``agent.submit`` and the service (``execution: queue``) send runs, and where the
    workers (``hermes-agent worker``) take them from."""
    service: dict[str, Any] | None = None
    """The service's settings (``hermes-agent serve``, ``create_app``): validated by
    ``hermes_agent.runs.settings.service_settings`` when the agent is served, so a config
    with a ``service:`` section loads without the ``server`` extra."""
    source: str = Field(default="<config>", exclude=True)
    """Where the config came from (for error messages); set by the loader."""

    @model_validator(mode="before")
    @classmethod
    def _point_hook_lists(cls, data: Any) -> Any:
        """``pre_thought_hooks: [...]`` (at the top, or inside ``hooks:``) is
        ``hooks: {pre_thought: [...]}``: hook configs written per hook point load as they
        are."""
        if not isinstance(data, dict):
            return data
        lists = {key: data[key] for key in data if _point_of(key) is not None}
        hooks = data.get("hooks", {})
        if not lists and not (isinstance(hooks, dict) and any(map(_point_of, hooks))):
            return data
        merged: dict[Any, Any] = {}
        if isinstance(hooks, dict):
            for key, specs in hooks.items():
                merged.setdefault(_point_of(key) or key, []).extend(_as_list(specs))
        for key, specs in lists.items():
            merged.setdefault(_point_of(key), []).extend(_as_list(specs))
        rest = {key: value for key, value in data.items() if key not in lists}
        return {**rest, "hooks": merged}


_HOOK_POINTS = frozenset(f"{when}_{stage}" for stage in HookStage for when in ("pre", "post"))


def _point_of(key: object) -> str | None:
    """The hook point a ``<point>_hooks`` key names (``None``: not such a key)."""
    if isinstance(key, str) and key.endswith("_hooks") and key[: -len("_hooks")] in _HOOK_POINTS:
        return key[: -len("_hooks")]
    return None


def _as_list(specs: Any) -> list[Any]:
    return list(specs) if isinstance(specs, list) else [specs]


def load_config(path: str | os.PathLike[str]) -> HermesConfig:
    """Read, interpolate and validate a YAML config file."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read the config file ({exc.strerror})") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file}: not valid YAML: {exc}") from exc
    if data is None:
        data = {}
    _check_expansion(data, str(file))
    if not isinstance(data, dict):
        raise ConfigError(
            f"{file}: the top level must be a mapping with 'model:' and 'agent:' sections"
        )
    return parse_config(data, source=str(file))


def _check_expansion(data: Any, source: str) -> None:
    """Refuse a document whose aliases expand past ``MAX_CONFIG_NODES`` values; the walk stops
    as soon as the budget is spent, so checking costs at most that many steps."""
    seen = 0
    pending = [data]
    while pending:
        node = pending.pop()
        seen += 1
        if seen > MAX_CONFIG_NODES:
            raise ConfigError(
                f"{source}: the config expands to more than {MAX_CONFIG_NODES:,} values "
                "(nested YAML aliases?); write the values out or use fewer aliases"
            )
        if isinstance(node, dict):
            pending.extend(node.keys())
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)


def parse_config(data: dict[str, Any], *, source: str = "<config>") -> HermesConfig:
    """Validate an already-loaded config mapping (``source`` names it in errors).

    Every problem is found before any is reported: one ``ConfigError`` holds them all, one per
    line (unset variables, both model sections, and the rest of the file), so that fixing a
    config takes one round, not one per mistake."""
    problems: list[str] = []
    interpolated = _interpolate(data, source, (), problems)
    models: dict[str, ModelConfig] = {}
    separate = [key for key in ("model", "answer_model") if isinstance(interpolated.get(key), dict)]
    for key in separate:
        section = interpolated[key]
        # The provider picks the class that validates the section (a discriminated union that
        # a new backend can join), so a key of another provider is an unknown key here.
        provider = section.get("provider", "llamacpp")
        if not isinstance(provider, str):
            problems.append(f"{source}: {key}.provider: must be a string, got {provider!r}")
            continue
        try:
            section_class = model_section(provider)
        except ConfigError as exc:
            message = str(exc).replace("model.provider", f"{key}.provider", 1)
            problems.append(f"{source}: {message}")
            continue
        try:
            models[key] = section_class.model_validate(section)
        except ValidationError as exc:
            problems.extend(_explain_lines(exc, source, prefix=(key,), root=section_class))
    rest = {k: v for k, v in interpolated.items() if k not in separate}
    config: HermesConfig | None = None
    try:
        config = HermesConfig.model_validate(rest)
    except ValidationError as exc:
        problems.extend(_explain_lines(exc, source))
    if problems or config is None:
        raise ConfigError(_bounded(problems, source))
    if "model" in models:
        config.model = models["model"]
    config.answer_model = models.get("answer_model")
    config.source = source
    return config


def _bounded(lines: list[str], source: str) -> str:
    if len(lines) > _MAX_ERROR_LINES:
        hidden = len(lines) - _MAX_ERROR_LINES
        lines = [*lines[:_MAX_ERROR_LINES], f"{source}: … and {hidden} more problems"]
    return "\n".join(lines)


def validate_section(section: type[_Section], data: Any, *, source: str, key: str) -> _Section:
    """Validate the section ``key`` of a config (already interpolated) with ``section``; a
    ``ConfigError`` names the file and each bad key, as for the rest of the file."""
    try:
        return section.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_explain(exc, source, prefix=(key,), root=section)) from None


def _interpolate(node: Any, source: str, path: tuple[str, ...], problems: list[str]) -> Any:
    """``node`` with ``${VAR}`` replaced; each unset variable is added to ``problems`` (and
    replaced by nothing, so the rest of the file is still checked)."""
    if isinstance(node, dict):
        return {k: _interpolate(v, source, (*path, str(k)), problems) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate(v, source, (*path, str(i)), problems) for i, v in enumerate(node)]
    if not isinstance(node, str) or "${" not in node:
        return node

    def substitute(match: re.Match[str]) -> str:
        name, fallback = match.group(1), match.group(2)
        value = os.environ.get(name)
        if value is not None:
            return value
        if fallback is not None:
            return fallback
        key = ".".join(path)
        problems.append(
            f"{source}: {key}: environment variable {name} is not set; "
            f"export {name}=... or write ${{{name}:-default}} in the file"
        )
        return ""

    return _VARIABLE.sub(substitute, node)


def _explain(
    exc: ValidationError,
    source: str,
    *,
    prefix: tuple[str, ...] = (),
    root: type[BaseModel] | None = None,
) -> str:
    return _bounded(_explain_lines(exc, source, prefix=prefix, root=root), source)


def _explain_lines(
    exc: ValidationError,
    source: str,
    *,
    prefix: tuple[str, ...] = (),
    root: type[BaseModel] | None = None,
) -> list[str]:
    lines = []
    for error in exc.errors():
        location = (*prefix, *error["loc"])
        key = ".".join(str(part) for part in location)
        if error["type"] == "extra_forbidden":
            hint = _suggestion(error["loc"], root) if root else _suggestion(location)
            lines.append(f"{source}: {key}: unknown key{hint}")
        else:
            secret = any(_SECRET_NAME.search(str(part)) for part in location)
            got = "a value not shown here" if secret else _short(error.get("input"))
            lines.append(
                f"{source}: {key}: {error['msg'].lower()} (got {got}); fix the value in the file"
            )
    return lines


_SECRET_NAME = re.compile(
    r"(?i)(?:^|[_-])(?:key|token|secret|password|passwd|pwd|credentials?|authorization|"
    r"cookies?|headers)$"
)
"""A config key, or an environment variable, whose value an error never shows."""
_URL_PASSWORD = re.compile(r"(://[^:/@\s]*:)[^@\s]+@")
_KEY_LIKE = re.compile(r"\b((?:sk|pk|rk)-|xox[a-z]-|gh[a-z]_)[A-Za-z0-9_-]{6,}")
"""An API key written as a literal (OpenAI's ``sk-``, Slack's ``xoxb-``, GitHub's ``ghp_``)."""


def _short(value: Any) -> str:
    """``value`` as an error shows it: bounded, with every secret in it hidden — a value under
    a key named like one (``api_key``, ``headers``…), a URL's password, what looks like an API
    key, and the value of an environment variable named like one (a ``${OPENAI_API_KEY}`` the
    file used), which reads as its name."""
    text = reprlib.repr(_hidden(value))
    return text if len(text) <= _MAX_VALUE_CHARS else text[: _MAX_VALUE_CHARS - 1] + "…"


def _hidden(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: "<hidden>" if _SECRET_NAME.search(str(k)) else _hidden(v) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_hidden(item) for item in value]
    if not isinstance(value, str):
        return value
    for name, secret in os.environ.items():
        if len(secret) >= 6 and secret in value and _SECRET_NAME.search(name):
            value = value.replace(secret, f"${{{name}}}")
    return _KEY_LIKE.sub(r"\1…", _URL_PASSWORD.sub(r"\1***@", value))


def _suggestion(location: tuple[int | str, ...], root: type[BaseModel] | None = None) -> str:
    model: type[BaseModel] = root or HermesConfig
    parts = list(location[:-1])
    if parts[:1] == ["tools"] and len(parts) == 2:
        model, parts = ToolConfig, []
    if parts[:1] == ["mcp_servers"] and len(parts) == 2:
        model, parts = McpServerConfig, []
    for part in parts:
        field = model.model_fields.get(str(part))
        annotation = field.annotation if field else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return ""
        model = annotation
    allowed = [name for name in model.model_fields if name != "source"]
    close = difflib.get_close_matches(str(location[-1]), allowed, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return f"{hint} (allowed keys: {', '.join(allowed)})"
