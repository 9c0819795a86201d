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
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hermes_agent.errors import ConfigError

DEFAULT_STORAGE_URL = "sqlite:///.hermes/state.db"
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelConfig(_Strict):
    """Which model to talk to, and how."""

    provider: Literal["openai", "llamacpp", "scripted"] = "llamacpp"
    base_url: str | None = None
    api_key: str | None = None
    model_name: str | None = None
    """The endpoint's model id (required for ``openai``); for the others, a display name."""
    mode: Literal["native", "hermes"] = "hermes"
    chat_format: Literal["hermes", "qwen"] = "hermes"
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    max_tokens: int | None = Field(default=None, gt=0)
    timeout: float = Field(default=60.0, gt=0)
    max_retries: int = Field(default=2, ge=0)
    model_path: str | None = None
    n_ctx: int = Field(default=4096, gt=0)
    use_grammar: bool = True
    max_calls: int = Field(default=1, ge=1)
    """llamacpp: how many tool calls the grammar allows in one turn."""
    context_window: int | None = Field(default=None, gt=0)
    """openai: the endpoint model's context size in tokens; prompts are fitted to it."""
    price_per_1k_prompt: float | None = Field(default=None, ge=0)
    price_per_1k_completion: float | None = Field(default=None, ge=0)
    responses: list[str] = Field(default_factory=list)
    """For ``provider: scripted``: the completions to answer with, in order."""


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
    toolset: str | None = None

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


class OutputConfig(_Strict):
    """How answers are rendered: a default format, and formats per channel."""

    format: str = "text"
    channels: dict[str, str] = Field(default_factory=dict)


class StorageConfig(_Strict):
    """Where sessions and the audit trail live (SQLAlchemy URL; SQLite or PostgreSQL)."""

    url: str = DEFAULT_STORAGE_URL


class AuditConfig(_Strict):
    """The audit trail: on or off, and what to redact besides the API key."""

    enabled: bool = True
    redact_patterns: list[str] = Field(default_factory=list)


class HermesConfig(_Strict):
    """The whole configuration file."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    tools: dict[str, ToolConfig] = Field(default_factory=dict)
    hooks: dict[str, list[HookSpec]] = Field(default_factory=dict)
    renderers: dict[str, HookSpec] = Field(default_factory=dict)
    output: OutputConfig = Field(default_factory=OutputConfig)
    storage: StorageConfig | None = None
    audit: AuditConfig = Field(default_factory=AuditConfig)
    source: str = Field(default="<config>", exclude=True)
    """Where the config came from (for error messages); set by the loader."""


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
    if not isinstance(data, dict):
        raise ConfigError(
            f"{file}: the top level must be a mapping with 'model:' and 'agent:' sections"
        )
    return parse_config(data, source=str(file))


def parse_config(data: dict[str, Any], *, source: str = "<config>") -> HermesConfig:
    """Validate an already-loaded config mapping (``source`` names it in errors)."""
    interpolated = _interpolate(data, source, ())
    try:
        config = HermesConfig.model_validate(interpolated)
        config.source = source
        return config
    except ValidationError as exc:
        raise ConfigError(_explain(exc, source)) from None


def _interpolate(node: Any, source: str, path: tuple[str, ...]) -> Any:
    if isinstance(node, dict):
        return {k: _interpolate(v, source, (*path, str(k))) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate(v, source, (*path, str(i))) for i, v in enumerate(node)]
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
        raise ConfigError(
            f"{source}: {key}: environment variable {name} is not set; "
            f"export {name}=... or write ${{{name}:-default}} in the file"
        )

    return _VARIABLE.sub(substitute, node)


def _explain(exc: ValidationError, source: str) -> str:
    lines = []
    for error in exc.errors():
        key = ".".join(str(part) for part in error["loc"])
        if error["type"] == "extra_forbidden":
            lines.append(f"{source}: {key}: unknown key{_suggestion(error['loc'])}")
        else:
            lines.append(
                f"{source}: {key}: {error['msg'].lower()} (got {error.get('input')!r}); "
                "fix the value in the file"
            )
    return "\n".join(lines)


def _suggestion(location: tuple[int | str, ...]) -> str:
    model: type[BaseModel] = HermesConfig
    parts = list(location[:-1])
    if parts[:1] == ["tools"] and len(parts) == 2:
        model, parts = ToolConfig, []
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
