"""YAML config: interpolation, validation errors that name the file, key and fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from hermes_agent import Agent, ConfigError, ScriptedModel, load_config

EXAMPLE = """\
model:
  provider: openai
  base_url: http://localhost:8000/v1
  api_key: ${OPENAI_API_KEY}
  model_name: hermes-3
  mode: hermes
  temperature: 0.2
agent:
  max_iterations: 5
  history_window: 10
  summary_max_chars: 200
  default_timeout: 30
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_example_config_loads_with_env_interpolation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    config = load_config(write(tmp_path, EXAMPLE))
    assert config.model.api_key == "sk-test"
    assert config.model.temperature == 0.2
    assert config.agent.default_timeout == 30
    agent = Agent.from_config(write(tmp_path, EXAMPLE))
    assert agent.model.name == "hermes-3"
    assert agent.model.context_window is None  # unknown unless the config says
    assert agent.limits.max_iterations == 5


def test_missing_variable_names_file_key_and_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    path = write(tmp_path, EXAMPLE)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert str(path) in message and "model.api_key" in message
    assert "export OPENAI_API_KEY=" in message


def test_default_value_syntax(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HERMES_TEST_URL", raising=False)
    config = load_config(
        write(tmp_path, "model:\n  provider: openai\n  base_url: ${HERMES_TEST_URL:-http://x/v1}\n")
    )
    assert config.model.base_url == "http://x/v1"


def test_unknown_key_suggests_the_right_one(tmp_path: Path) -> None:
    path = write(tmp_path, "model:\n  temprature: 0.2\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert f"{path}: model.temprature: unknown key; did you mean 'temperature'?" in message


def test_wrong_type_names_the_key_and_the_value(tmp_path: Path) -> None:
    path = write(tmp_path, "agent:\n  max_iterations: many\n")
    with pytest.raises(ConfigError, match=r"agent\.max_iterations: .*'many'"):
        load_config(path)


def test_bad_provider_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"model\.provider"):
        load_config(write(tmp_path, "model:\n  provider: gpt\n"))
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_config(tmp_path / "absent.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "model: [unclosed\n"))


def test_scripted_provider_builds_a_working_agent(tmp_path: Path) -> None:
    path = write(tmp_path, "model:\n  provider: scripted\n  responses: ['hello there']\n")
    agent = Agent.from_config(path)
    assert isinstance(agent.model, ScriptedModel)
    assert agent.run("hi").output == "hello there"


def test_openai_provider_needs_a_model_name(tmp_path: Path) -> None:
    path = write(tmp_path, "model:\n  provider: openai\n  base_url: http://localhost:1/v1\n")
    with pytest.raises(ConfigError, match=r"model\.model_name: required with provider 'openai'"):
        Agent.from_config(path)


def test_context_window_reaches_the_endpoint_model(tmp_path: Path) -> None:
    text = "model:\n  provider: openai\n  model_name: m\n  context_window: 4096\n"
    agent = Agent.from_config(write(tmp_path, text), storage=None)
    assert agent.model.context_window == 4096


def test_the_embedded_models_call_bias_comes_from_the_config() -> None:
    from hermes_agent.config import LlamaCppConfig, parse_config
    from hermes_agent.models.llamacpp import DEFAULT_CALL_BIAS

    assert LlamaCppConfig().call_bias == DEFAULT_CALL_BIAS  # one calibrated default
    config = parse_config({"model": {"provider": "llamacpp", "call_bias": None}})
    assert isinstance(config.model, LlamaCppConfig) and config.model.call_bias is None
    config = parse_config({"model": {"provider": "llamacpp", "call_bias": 3.5}})
    assert isinstance(config.model, LlamaCppConfig) and config.model.call_bias == 3.5
