"""Attacks on the config loader: alias bombs, huge error messages, hooks that name a function."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from hermes_agent import Agent, ConfigError
from hermes_agent.config import MAX_CONFIG_NODES, load_config

BOMB = """\
a: &a ["x","x","x","x","x","x","x","x","x"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
model:
  provider: scripted
  responses: *h
"""


def test_a_yaml_alias_bomb_is_refused_quickly_with_a_short_message(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB, encoding="utf-8")
    assert len(BOMB) < 500
    started = time.perf_counter()
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert time.perf_counter() - started < 5  # a bound far above the real cost, not a timing
    message = str(caught.value)
    assert f"more than {MAX_CONFIG_NODES:,} values" in message
    assert len(message) < 500


def test_aliases_within_the_budget_still_work(tmp_path: Path) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text(
        "model: {provider: scripted}\ntools:\n  add: &t {timeout: 5}\n  mul: *t\n", encoding="utf-8"
    )
    config = load_config(path)
    assert config.tools["mul"].timeout == 5


def test_error_messages_are_bounded(tmp_path: Path) -> None:
    path = tmp_path / "many.yaml"
    tools = "".join(f"  t{i}: {{timeout: 'x' }}\n" for i in range(200))
    path.write_text("model: {provider: scripted, model_name: '" + "y" * 5000 + "'}\n"
                    "tools:\n" + tools, encoding="utf-8")  # fmt: skip
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert "and 180 more problems" in message
    assert len(message) < 20 * 400


@pytest.mark.parametrize(
    ("module", "name", "why"),
    [
        ("os", "system", "not a class"),
        ("subprocess", "Popen", "does not define __call__"),
        ("builtins", "eval", "not a class"),
    ],
)
def test_config_hooks_must_name_a_callable_class(
    tmp_path: Path, module: str, name: str, why: str
) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "hooks.yaml"
    path.write_text(
        "model: {provider: scripted, responses: [hi]}\n"
        "hooks:\n"
        f"  pre_input:\n    - {{module: {module}, class: {name}, "
        f"options: {{args: 'touch {marker}', command: 'touch {marker}'}}}}\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError, match=why):
        Agent.from_config(path)
    assert not marker.exists()


def test_renderers_from_a_config_are_checked_the_same_way(tmp_path: Path) -> None:
    path = tmp_path / "renderers.yaml"
    path.write_text(
        "model: {provider: scripted, responses: [hi]}\n"
        "renderers:\n  shout: {module: os, class: getcwd}\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError, match="not a class"):
        Agent.from_config(path)


def test_a_hook_class_from_a_config_still_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "myhook.py").write_text(
        "class Shout:\n"
        "    def __init__(self, suffix):\n        self.suffix = suffix\n"
        "    def __call__(self, ctx):\n        ctx.output = ctx.output.upper() + self.suffix\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "ok.yaml"
    path.write_text(
        "model: {provider: scripted, responses: [hi]}\n"
        "hooks:\n  post_output:\n    - {module: myhook, class: Shout, options: {suffix: '!'}}\n",
        encoding="utf-8",
    )
    assert Agent.from_config(path).run("hello").output == "HI!"
    sys.modules.pop("myhook", None)


SECRET = "sk-live-0123456789abcdef"


@pytest.mark.parametrize(
    ("text", "where"),
    [
        # A secret-named key whose value has the wrong type.
        ("model:\n  provider: openai\n  api_key: [SECRET]\n", "model.api_key"),
        # A secret from the environment, put where another value belongs.
        (
            "model:\n  provider: openai\n  temperature: ${HERMES_TEST_API_KEY}\n",
            "${HERMES_TEST_API_KEY}",
        ),
        # A whole section that is a secret by mistake (a literal key).
        ("model: SECRET\n", "model:"),
        # A section of the wrong type that holds a key.
        ("tools:\n  - {api_key: SECRET}\n", "tools:"),
        # A database URL with a password, where a mapping belongs.
        ("storage: postgresql://hermes:SECRET@db/hermes\n", "***@db/hermes"),
    ],
)
def test_a_config_error_never_shows_a_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, where: str
) -> None:
    monkeypatch.setenv("HERMES_TEST_API_KEY", SECRET)
    path = tmp_path / "config.yaml"
    path.write_text(text.replace("SECRET", SECRET), encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert where in message, message  # the error still says where the problem is
    assert "0123456789abcdef" not in message and "0123456789" not in message, message


def test_a_service_section_error_never_shows_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    from hermes_agent.config import validate_section
    from hermes_agent.runs.settings import ServiceSettings

    monkeypatch.setenv("HERMES_TEST_TOKEN", SECRET)
    with pytest.raises(ConfigError) as caught:
        validate_section(
            ServiceSettings,
            {"port": SECRET, "keys_url": [f"postgresql://u:{SECRET}@h/db"]},
            source="config.yaml",
            key="service",
        )
    message = str(caught.value)
    assert "service.port" in message and "${HERMES_TEST_TOKEN}" in message, message
    assert "service.keys_url" in message and "u:***@h/db" in message, message
    assert "0123456789" not in message, message
    # An ordinary value is still shown, so the error says what was wrong.
    with pytest.raises(ConfigError, match=r"got 'lots'"):
        validate_section(ServiceSettings, {"port": "lots"}, source="config.yaml", key="service")
