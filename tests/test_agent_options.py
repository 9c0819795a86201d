"""``Agent``'s options: plain keywords for the common ones, four frozen groups for the rest,
one mapping from a config onto them, and overrides typed as ``Agent``'s own keywords."""

from __future__ import annotations

import dataclasses
import inspect
import typing

import pytest

import hermes_agent
from hermes_agent import (
    Agent,
    Budget,
    HermesAgentError,
    Memory,
    Pricing,
    ScriptedModel,
    ToolExecution,
    build_agent,
    parse_config,
)
from hermes_agent.options import AgentOptions, ToolSettings, agent_options
from hermes_agent.tools.registry import SETTINGS


def test_agent_options_names_every_keyword_of_agent_and_no_other() -> None:
    parameters = inspect.signature(Agent.__init__).parameters
    keywords = [name for name in parameters if name != "self"]
    assert set(typing.get_type_hints(AgentOptions)) == set(keywords)
    assert len(keywords) <= 28  # the rarely used ones are grouped, not added one by one


def test_tool_settings_name_every_setting_a_tool_takes_besides_its_own_keywords() -> None:
    # timeout and toolset are keywords of agent.tool / register_tool themselves.
    assert set(typing.get_type_hints(ToolSettings)) == set(SETTINGS) - {"timeout", "toolset"}


def test_the_groups_are_frozen_and_check_their_values() -> None:
    budget = Budget(max_run_tokens=100)
    with pytest.raises(dataclasses.FrozenInstanceError):
        budget.max_run_tokens = 5  # type: ignore[misc]
    for bad in (
        lambda: Budget(max_run_tokens=0),
        lambda: Budget(run_timeout_s=-1),
        lambda: Pricing(prompt_per_1k=-0.5),
        lambda: Memory(history_window=-1),
        lambda: ToolExecution(max_concurrency=0),
        lambda: ToolExecution(max_result_chars=True),
    ):
        with pytest.raises(HermesAgentError, match="must be a number"):
            bad()
    assert Memory(history_window=0, summary_max_chars=0) == Memory(0, 0)
    assert Pricing(0.5, 1.0).model == (0.5, 1.0) and Pricing().answer_model == (None, None)


def test_the_groups_reach_the_run() -> None:
    agent = Agent(
        ScriptedModel(["ok"]),
        pricing=Pricing(prompt_per_1k=1000.0, completion_per_1k=1000.0),
        budget=Budget(max_run_tokens=10_000),
        memory=Memory(history_window=2, summary_max_chars=50, summarize_with_model=False),
        tool_execution=ToolExecution(default_timeout=5, max_concurrency=2, max_result_chars=99),
    )
    result = agent.run("hi")
    assert result.cost == 0.0  # priced (a scripted turn uses no tokens): a cost, not None
    assert agent.memory == Memory(2, 50, False)
    assert agent.tool_execution == ToolExecution(5, 2, 32, 99)
    assert agent.limits.default_timeout == 5 and agent.runtime.max_result_chars == 99
    twin = agent.fork()
    assert twin.memory == agent.memory and twin.tool_execution == agent.tool_execution
    assert twin.pricing is agent.pricing and twin.budget is agent.budget


def test_a_config_maps_onto_the_groups_in_one_place_and_keywords_override_them() -> None:
    config = parse_config(
        {
            "model": {"provider": "scripted", "responses": ["ok"], "price_per_1k_prompt": 0.5},
            "answer_model": {
                "provider": "scripted",
                "responses": ["fine"],
                "model_name": "answering",
                "price_per_1k_completion": 2.0,
            },
            "agent": {
                "history_window": 3,
                "summary_max_chars": 90,
                "default_timeout": 7,
                "max_concurrency": 3,
                "max_calls_per_turn": 4,
                "max_result_chars": 500,
                "max_run_tokens": 800,
                "run_timeout_s": 30,
            },
        }
    )
    options = agent_options(config)
    assert options["pricing"] == Pricing(0.5, None, None, 2.0)
    assert options["budget"] == Budget(max_run_tokens=800, run_timeout_s=30)
    assert options["memory"] == Memory(history_window=3, summary_max_chars=90)
    assert options["tool_execution"] == ToolExecution(7, 3, 4, 500)
    agent = Agent.from_settings(config)
    assert agent.memory == Memory(3, 90) and agent.tool_execution == ToolExecution(7, 3, 4, 500)
    assert agent.budget == Budget(max_run_tokens=800, run_timeout_s=30)
    replaced = build_agent(config, budget=Budget(max_run_cost=1.0))
    assert replaced.budget == Budget(max_run_cost=1.0)  # a group is replaced whole


def test_the_old_flat_keywords_are_gone() -> None:
    for old in ("history_window", "price_per_1k_prompt", "max_run_tokens", "default_timeout"):
        with pytest.raises(TypeError, match=old):
            Agent(ScriptedModel(["ok"]), **{old: 1})  # type: ignore[arg-type]


def test_the_package_offers_what_a_user_needs() -> None:
    offered = set(hermes_agent.__all__)
    assert {"Agent", "Budget", "Memory", "Pricing", "ToolExecution", "build_agent"} <= offered
    # These have one public home elsewhere, or are implementation.
    assert not offered & {"parse_completion", "InMemoryStorage", "open_storage", "OpenAIConfig"}
    assert not offered & {"RunJournal", "ClientTurn", "ScriptedRequest"}
    assert len(offered) <= 81  # the errors a caller handles included
