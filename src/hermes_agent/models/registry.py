"""Model backends by provider name: how a ``model:`` config section becomes a ``Model``.

A new backend is one module and one registration::

    from hermes_agent.config import ModelConfig
    from hermes_agent.models.registry import register_model

    class EchoConfig(ModelConfig):
        provider: Literal["echo"] = "echo"
        prefix: str = ""

    register_model("echo", EchoConfig, lambda config: EchoModel(config.prefix))

after which ``model: {provider: echo, prefix: ">"}`` in a config file builds an ``EchoModel``,
and a key that ``EchoConfig`` does not declare is a config error naming it. The built-in
providers (``openai``, ``llamacpp``, ``scripted``) are registered the same way below; their
modules are imported only when a model is built, so the optional dependencies stay optional.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hermes_agent.config import (
    LlamaCppConfig,
    ModelConfig,
    OpenAIConfig,
    ScriptedConfig,
    model_section,
    register_model_section,
)
from hermes_agent.errors import ConfigError, HermesAgentError
from hermes_agent.models.base import Model

ModelFactory = Callable[[Any], Model]
"""Builds a model from its validated config section (an instance of the registered class)."""


@dataclass(frozen=True, slots=True)
class ModelBackend:
    """A registered provider: the class that validates its config section, and its factory."""

    provider: str
    section: type[ModelConfig]
    build: ModelFactory


_BACKENDS: dict[str, ModelBackend] = {}


def register_model(
    provider: str,
    section: type[ModelConfig],
    build: ModelFactory,
    *,
    replace: bool = False,
) -> ModelBackend:
    """Register a model backend under ``provider`` (the ``model.provider`` value in a config).

    ``section`` validates the config section (subclass ``ModelConfig``); ``build`` turns a
    validated section into a model. Registering a taken name needs ``replace=True``.
    """
    if not isinstance(section, type) or not issubclass(section, ModelConfig):
        raise HermesAgentError(
            f"register_model({provider!r}): the section must be a subclass of ModelConfig, "
            f"got {section!r}"
        )
    if provider in _BACKENDS and not replace:
        raise HermesAgentError(
            f"a model backend named {provider!r} is already registered; "
            "pass replace=True to replace it"
        )
    backend = ModelBackend(provider, section, build)
    _BACKENDS[provider] = backend
    register_model_section(provider, section)
    return backend


def model_backends() -> dict[str, ModelBackend]:
    """The registered backends, by provider name."""
    return dict(_BACKENDS)


def build_model(config: ModelConfig) -> Model:
    """The model a ``model:`` config section describes."""
    backend = _BACKENDS.get(config.provider)
    if backend is None:
        model_section(config.provider)  # raises, naming the known providers
        raise ConfigError(f"model.provider: no backend registered for {config.provider!r}")
    if not isinstance(config, backend.section):
        # A base ModelConfig (built in code) for a provider with its own section: validate it
        # as that section so provider defaults and checks apply.
        config = backend.section.model_validate(config.model_dump(exclude_unset=True))
    return backend.build(config)


def _openai(config: OpenAIConfig) -> Model:
    from hermes_agent.models.openai import OpenAICompatible

    if not config.model_name:
        raise ConfigError(
            "model.model_name: required with provider 'openai' (the model id the endpoint "
            "serves, e.g. hermes-3); add it to the config"
        )
    return OpenAICompatible(
        config.model_name,
        base_url=config.base_url,
        api_key=config.api_key,
        mode=config.mode,
        chat_format=config.chat_format,
        temperature=config.temperature,
        max_tokens=config.max_tokens,
        timeout=config.timeout,
        max_retries=config.max_retries,
        context_window=config.context_window,
        grammar=config.grammar,
        # ``auto`` is resolved by the service and the workers (``loading.on_owned_loops``).
        transport="httpx" if config.transport == "auto" else config.transport,
        thought_calls=config.thought_calls,
        opens_thought=config.opens_thought,
    )


def _llamacpp(config: LlamaCppConfig) -> Model:
    from hermes_agent.models.llamacpp import LlamaCpp

    return LlamaCpp(
        config.model_path,
        n_ctx=config.n_ctx,
        temperature=config.temperature if config.temperature is not None else 0.0,
        max_tokens=config.max_tokens or 256,
        chat_format=config.chat_format,
        use_grammar=config.use_grammar,
        max_calls=config.max_calls,
        call_bias=config.call_bias,
        thought_calls=config.thought_calls,
        opens_thought=bool(config.opens_thought),
    )


def _scripted(config: ScriptedConfig) -> Model:
    from hermes_agent.models.scripted import ScriptedModel

    return ScriptedModel(
        config.responses,
        name=config.model_name or "scripted",
        thought_calls=config.thought_calls,
        opens_thought=config.opens_thought,
    )


register_model("openai", OpenAIConfig, _openai)
register_model("llamacpp", LlamaCppConfig, _llamacpp)
register_model("scripted", ScriptedConfig, _scripted)
