"""Renamed public names keep working for one release, each with a warning naming the new name:
``Agent(channels=...)`` / ``agent.channels`` / ``output.channels`` / ``DEFAULT_CHANNELS`` (now
``channel_formats``) and ``Status.TOOL_ERROR`` (now ``Status.INTERNAL_ERROR``, the same 500,
whose trace label stays ``tool_error``)."""

from __future__ import annotations

import json
import pickle
import warnings
from pathlib import Path

import pytest

from hermes_agent import Agent, ConfigError, ScriptedModel, Status
from hermes_agent.config import OutputConfig, parse_config
from hermes_agent.pipeline import renderers
from hermes_agent.tracing import error_type


def test_channel_formats_pick_the_renderer_of_a_runs_channel() -> None:
    agent = Agent(ScriptedModel(["Done."]), channel_formats={"wecom": "json"})
    assert agent.channel_formats["web"] == "markdown"  # the defaults stay under it
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        shown = agent.run("status?", channel="wecom").rendered
    assert shown.format == "json" and json.loads(shown.content)["output"] == "Done."


def test_the_old_channels_argument_and_attribute_warn_and_mean_the_same() -> None:
    with pytest.warns(DeprecationWarning, match=r"channel_formats"):
        agent = Agent(ScriptedModel(["Done."]), channels={"wecom": "json"})
    assert agent.channel_formats["wecom"] == "json"
    with pytest.warns(DeprecationWarning, match=r"Agent\.channel_formats"):
        agent.channels["slack"] = "text"
    assert agent.channel_formats["slack"] == "text"
    with pytest.warns(DeprecationWarning, match=r"Agent\.channel_formats"):
        agent.channels = {"only": "json"}
    assert agent.channel_formats == {"only": "json"}
    assert agent.run("status?", channel="only").rendered.format == "json"


def test_both_names_at_once_are_refused() -> None:
    with pytest.raises(Exception, match=r"channel_formats only"):
        Agent(ScriptedModel(["x"]), channels={"a": "json"}, channel_formats={"b": "json"})


def test_an_unknown_channel_names_the_new_config_key() -> None:
    agent = Agent(ScriptedModel(["x"]))
    with pytest.raises(Exception, match=r"output\.channel_formats"):
        agent.run("hi", channel="pager")


def test_the_old_module_constant_warns() -> None:
    with pytest.warns(DeprecationWarning, match=r"DEFAULT_CHANNEL_FORMATS"):
        old = renderers.DEFAULT_CHANNELS
    assert old is renderers.DEFAULT_CHANNEL_FORMATS
    with pytest.raises(AttributeError):
        renderers.NO_SUCH_NAME  # noqa: B018


def test_the_old_config_key_loads_with_a_warning_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(
        "model: {provider: scripted, responses: [Done.]}\noutput:\n  channels: {wecom: json}\n",
        encoding="utf-8",
    )
    with pytest.warns(FutureWarning, match=r"agent\.yaml: output\.channels .*channel_formats"):
        agent = Agent.from_config(path)
    assert agent.channel_formats["wecom"] == "json"
    assert agent.run("hi", channel="wecom").rendered.format == "json"
    with pytest.warns(FutureWarning, match=r"output\.channel_formats"):
        assert OutputConfig.model_validate({"channels": {"a": "b"}}).channel_formats == {"a": "b"}
    with pytest.warns(DeprecationWarning, match="channel_formats"):
        assert OutputConfig(channel_formats={"a": "b"}).channels == {"a": "b"}


def test_the_new_config_key_loads_silently_and_both_are_one_error() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config = parse_config({"output": {"channel_formats": {"wecom": "card"}}})
    assert config.output.channel_formats == {"wecom": "card"}
    with pytest.raises(ConfigError) as raised:
        parse_config(
            {"output": {"channels": {"a": "json"}, "channel_formats": {"b": "json"}}},
            source="both.yaml",
        )
    assert str(raised.value).count("channel_formats only") == 1
    assert str(raised.value).startswith("both.yaml: output:")


def test_500_is_internal_error_and_the_old_member_name_warns() -> None:
    assert Status(500) is Status.INTERNAL_ERROR and Status(500).name == "INTERNAL_ERROR"
    with pytest.warns(DeprecationWarning, match=r"Status\.INTERNAL_ERROR"):
        assert Status.TOOL_ERROR is Status.INTERNAL_ERROR
    with pytest.warns(DeprecationWarning, match=r"Status\.INTERNAL_ERROR"):
        assert Status["TOOL_ERROR"] is Status.INTERNAL_ERROR
    assert "TOOL_ERROR" not in Status.__members__ and len(list(Status)) == 11
    with pytest.raises(AttributeError):
        Status.NO_SUCH  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(KeyError):
        Status["NO_SUCH"]


def test_what_leaves_the_process_is_unchanged() -> None:
    # Records, results and the API carry the number; traces keep the old label.
    assert json.dumps({"status": Status.INTERNAL_ERROR}) == '{"status": 500}'
    assert pickle.loads(pickle.dumps(Status.INTERNAL_ERROR)) is Status.INTERNAL_ERROR
    assert f"{Status.INTERNAL_ERROR}" == "500"
    assert error_type(500) == "tool_error" and error_type(502) == "model_error"


def test_a_failing_hook_ends_the_run_with_internal_error() -> None:
    agent = Agent(ScriptedModel(["x"]))

    def broken(ctx: object) -> None:
        raise RuntimeError("profile service down")

    agent.add_hook("pre_thought", broken)
    result = agent.run("hi")
    assert result.status == Status.INTERNAL_ERROR and "profile service down" in (result.error or "")
