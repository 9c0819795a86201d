"""Channel formats pick a run's renderer (the old ``channels`` names are gone: refused, not
read), and ``Status.TOOL_ERROR`` keeps working with a warning (now ``Status.INTERNAL_ERROR``, the
same 500, whose trace label stays ``tool_error``)."""

from __future__ import annotations

import json
import pickle
import warnings

import pytest

from hermes_agent import Agent, ConfigError, ScriptedModel, Status
from hermes_agent.config import parse_config
from hermes_agent.pipeline import renderers
from hermes_agent.tracing import error_type


def test_channel_formats_pick_the_renderer_of_a_runs_channel() -> None:
    agent = Agent(ScriptedModel(["Done."]), channel_formats={"wecom": "json"})
    assert agent.channel_formats["web"] == "markdown"  # the defaults stay under it
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        shown = agent.run("status?", channel="wecom").rendered
    assert shown.format == "json" and json.loads(shown.content)["output"] == "Done."


def test_the_old_channels_names_are_refused() -> None:
    with pytest.raises(TypeError, match=r"channels"):
        Agent(ScriptedModel(["x"]), channels={"a": "json"})  # type: ignore[call-arg]
    assert not hasattr(renderers, "DEFAULT_CHANNELS")
    with pytest.raises(ConfigError, match=r"channels"):
        parse_config({"output": {"channels": {"a": "json"}}}, source="old.yaml")


def test_an_unknown_channel_names_the_new_config_key() -> None:
    agent = Agent(ScriptedModel(["x"]))
    with pytest.raises(Exception, match=r"output\.channel_formats"):
        agent.run("hi", channel="pager")


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
