"""The config reference (docs/configuration.md) names every key the config accepts and
no other, and each of its blocks is a config that loads.

The keys come from the config's own pydantic models, so a field added to one of them without a
line in the reference fails here (and so does a documented key that no longer exists)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from hermes_agent.config import (
    AgentConfig,
    AuditConfig,
    HermesConfig,
    HookSpec,
    LlamaCppConfig,
    McpServerConfig,
    ModelConfig,
    OpenAIConfig,
    OutputConfig,
    PromptConfig,
    QueueConfig,
    ScriptedConfig,
    StorageConfig,
    ToolConfig,
    TracingConfig,
    parse_config,
)

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
BLOCK = re.compile(r"<!-- config reference -->\n```yaml\n(.*?)```", re.S)
MODELS: dict[str, type[BaseModel]] = {
    "openai": OpenAIConfig,
    "llamacpp": LlamaCppConfig,
    "scripted": ScriptedConfig,
}
SECTIONS: dict[str, type[BaseModel]] = {
    "agent": AgentConfig,
    "prompt": PromptConfig,
    "output": OutputConfig,
    "storage": StorageConfig,
    "audit": AuditConfig,
    "tracing": TracingConfig,
    "queue": QueueConfig,
}
NAMED: dict[str, type[BaseModel]] = {
    "tools": ToolConfig,
    "renderers": HookSpec,
    "mcp_servers": McpServerConfig,
}
"""Sections holding one entry per name: the keys of all entries together."""


def fields(model: type[BaseModel]) -> set[str]:
    """The keys a section accepts: its fields, by the name the file uses (``class``)."""
    return {field.alias or name for name, field in model.model_fields.items() if name != "source"}


def blocks() -> list[dict[str, Any]]:
    found = [yaml.safe_load(text) for text in BLOCK.findall(GUIDE.read_text(encoding="utf-8"))]
    assert len(found) == 3, "the reference: the whole file, then llamacpp's and scripted's keys"
    return found


def documented() -> dict[str, set[str]]:
    """Each section's documented keys, across the blocks."""
    keys: dict[str, set[str]] = {}

    def add(section: str, names: Any) -> None:
        keys.setdefault(section, set()).update(names)

    for block in blocks():
        add("", block)
        for section in ("model", "answer_model"):
            if section in block:
                add(f"model:{block[section].get('provider', 'llamacpp')}", block[section])
        for section in SECTIONS:
            if section in block:
                add(section, block[section])
        for section in NAMED:
            for entry in block.get(section, {}).values():
                add(section, entry)
        for specs in block.get("hooks", {}).values():
            for spec in specs:
                add("hooks", spec)
    return keys


def test_every_block_of_the_reference_is_a_valid_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    for block in blocks():
        parse_config(block, source="docs/configuration.md")


def test_the_reference_names_every_key_and_no_other() -> None:
    keys = documented()
    assert keys[""] == fields(HermesConfig)
    # The keys every provider shares are documented once, with the first (openai) block.
    shared = fields(ModelConfig)
    assert keys["model:openai"] == fields(OpenAIConfig)
    for provider, model in MODELS.items():
        assert keys[f"model:{provider}"] | shared == fields(model), provider
    for section, model in {**SECTIONS, **NAMED}.items():
        assert keys[section] == fields(model), section
    assert keys["hooks"] == fields(HookSpec)


def test_the_issue_s_missing_keys_are_there() -> None:
    keys = documented()
    assert "grammar" in keys["model:openai"]
    assert "max_calls_per_turn" in keys["agent"]


def test_the_check_would_see_an_undocumented_field() -> None:
    class Wider(AgentConfig):
        new_knob: int = 1

    assert documented()["agent"] != fields(Wider)
