"""Model routing: a cheap ``model`` makes the tool calls, ``answer_model`` writes the answer.

The tool model's turns run until one calls no tool; then the answer model answers from the same
conversation (without that turn), tools withdrawn. Every step, audit record and token is
attributed to the model that served it, and the cost is split per model.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from hermes_agent import (
    Agent,
    ConfigError,
    HermesAgentError,
    Pricing,
    ScriptedModel,
    TextDeltaEvent,
    Usage,
    load_config,
)
from hermes_agent.audit.records import Role
from server_harness import add

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 17, "b": 25}}\n</tool_call>'
DRAFT = "the sum is 42 i think"
ANSWER = "17 + 25 = 42."


def routed(
    tool_script: list[str], answer_script: list[str], **options: Any
) -> tuple[Agent, ScriptedModel, ScriptedModel]:
    cheap = ScriptedModel(tool_script, name="cheap")
    strong = ScriptedModel(answer_script, name="strong")
    agent = Agent(model=cheap, answer_model=strong, tools=[add], **options)
    return agent, cheap, strong


def test_tool_turns_go_to_the_model_and_the_answer_to_the_answer_model() -> None:
    agent, cheap, strong = routed(
        [CALL, DRAFT],
        [ANSWER],
        storage="memory://",
        pricing=Pricing(
            prompt_per_1k=0.5,
            completion_per_1k=1.0,
            answer_prompt_per_1k=5.0,
            answer_completion_per_1k=10.0,
        ),
    )
    result = agent.run("What is 17 + 25?")
    assert result.status == 200
    assert result.output == ANSWER
    assert result.tool_calls[0].result == 42

    # Each step names the model that served it.
    assert [(s.index, s.model, s.completion_text) for s in result.steps] == [
        (0, "cheap", CALL),
        (1, "cheap", DRAFT),
        (2, "strong", ANSWER),
    ]
    # The answer model saw the same conversation — the call and its result — but not the
    # tool model's draft, and was offered no tool.
    assert len(cheap.requests) == 2 and len(strong.requests) == 1
    sent = strong.requests[0]
    assert [m.role for m in sent.messages] == ["user", "assistant", "tool"]
    assert sent.messages[1].tool_calls[0].name == "add"
    assert sent.messages[2].tool_results[0].content["data"] == 42
    assert sent.settings.tool_choice == "none"
    assert all(m.content != DRAFT for m in sent.messages)

    # Usage and cost per model; the totals are their sums.
    by_model = result.usage_by_model
    assert set(by_model) == {"cheap", "strong"}
    assert by_model["cheap"].requests == 2 and by_model["strong"].requests == 1
    for field in ("prompt_tokens", "completion_tokens", "requests"):
        assert getattr(result.usage, field) == sum(getattr(u, field) for u in by_model.values())
    expected = {
        "cheap": round(by_model["cheap"].prompt_tokens / 1000 * 0.5
                       + by_model["cheap"].completion_tokens / 1000 * 1.0, 8),
        "strong": round(by_model["strong"].prompt_tokens / 1000 * 5.0
                        + by_model["strong"].completion_tokens / 1000 * 10.0, 8),
    }  # fmt: skip
    assert result.cost_by_model == expected
    assert expected["strong"] > 0 and expected["cheap"] > 0
    assert result.cost == pytest.approx(expected["cheap"] + expected["strong"])

    # The trail attributes every record to the model that served its step.
    assert agent.storage is not None
    records = agent.storage.records(result.request_id)
    by_step = {(r.step, r.role): r.model_name for r in records}
    assert by_step[(0, Role.COMPLETION)] == "cheap"
    assert by_step[(0, Role.TOOL)] == "cheap"
    assert by_step[(1, Role.COMPLETION)] == "cheap"
    assert by_step[(2, Role.COMPLETION)] == "strong"
    assert by_step[(2, Role.OUTPUT)] == "strong"
    # The answer model's prompt is recorded whole, as it rendered it (no tools offered).
    answer_prompt = next(r for r in records if r.step == 2 and r.role == Role.PROMPT)
    assert "<tools>" not in answer_prompt.content and "<tool_response>" in answer_prompt.content
    first_prompt = next(r for r in records if r.step == 0 and r.role == Role.PROMPT)
    assert "<tools>" in first_prompt.content

    dumped = result.to_dict()
    assert dumped["usage_by_model"]["strong"]["total_tokens"] == by_model["strong"].total_tokens
    assert dumped["steps"][2]["model"] == "strong"
    agent.close()


def test_hooks_see_the_model_of_the_turn() -> None:
    agent, _, _ = routed([CALL, DRAFT], [ANSWER])
    seen: list[tuple[str, str]] = []
    agent.add_hook("pre_thought", lambda ctx: seen.append(("pre", ctx.model.name)))
    agent.add_hook("post_thought", lambda ctx: seen.append(("post", ctx.model.name)))
    agent.run("What is 17 + 25?")
    assert seen == [
        ("pre", "cheap"), ("post", "cheap"),
        ("pre", "cheap"), ("post", "cheap"),
        ("pre", "strong"), ("post", "strong"),
    ]  # fmt: skip


def test_several_rounds_of_calls_stay_with_the_tool_model() -> None:
    agent, _, strong = routed([CALL, CALL, DRAFT], [ANSWER])
    result = agent.run("Add twice")
    assert [s.model for s in result.steps] == ["cheap", "cheap", "cheap", "strong"]
    assert [c.name for c in result.tool_calls] == ["add", "add"]
    assert len(strong.requests) == 1


def test_without_a_tool_to_call_the_answer_model_answers_at_once() -> None:
    cheap = ScriptedModel([DRAFT], name="cheap")
    strong = ScriptedModel(["Hello!"], name="strong")
    result = Agent(model=cheap, answer_model=strong).run("hi")
    assert result.output == "Hello!"
    assert cheap.requests == []  # no tools: nothing for the tool model to do
    assert [s.model for s in result.steps] == ["strong"]

    agent, cheap, strong = routed([DRAFT], ["Hello!"])
    assert agent.run("hi", tool_choice="none").output == "Hello!"
    assert cheap.requests == []


def test_max_iterations_bounds_the_tool_rounds_not_the_answer() -> None:
    agent, _, strong = routed([DRAFT], [ANSWER], max_iterations=1)
    result = agent.run("What is 17 + 25?")
    assert result.status == 200 and result.output == ANSWER
    assert len(strong.requests) == 1


def test_the_tool_models_text_is_not_streamed() -> None:
    agent, _, _ = routed([CALL, DRAFT], [ANSWER])

    async def collect() -> str:
        text = ""
        async for event in agent.astream("What is 17 + 25?"):
            if isinstance(event, TextDeltaEvent):
                text += event.text
        return text

    assert asyncio.run(collect()) == ANSWER


def test_structured_answers_come_from_the_answer_model() -> None:
    class Sum(BaseModel):
        total: int

    agent, _, strong = routed([CALL, DRAFT], ["42", '{"total": 42}'])
    result = agent.run("What is 17 + 25?", output_type=Sum)
    assert result.data == Sum(total=42)
    assert result.output_retries == 1
    assert [s.model for s in result.steps] == ["cheap", "cheap", "strong", "strong"]
    assert len(strong.requests) == 2


def test_models_with_one_name_are_refused() -> None:
    agent = Agent(model=ScriptedModel(["a"]), answer_model=ScriptedModel(["b"]))
    with pytest.raises(HermesAgentError, match="distinct names"):
        agent.run("hi")
    with pytest.raises(HermesAgentError, match="is not a Model"):
        Agent(model=ScriptedModel(["a"]), answer_model=object())  # type: ignore[arg-type]


def test_replay_of_a_routed_run_matches() -> None:
    agent, _, _ = routed([CALL, DRAFT], [ANSWER], storage="memory://")
    result = agent.run("What is 17 + 25?")
    report = agent.replay(result.request_id)
    assert report.matched, report.summary()
    agent.close()


def test_answer_model_in_the_config(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "model:\n"
        "  provider: scripted\n"
        "  model_name: cheap\n"
        f"  responses: [{json.dumps(CALL)}, {json.dumps(DRAFT)}]\n"
        "  price_per_1k_prompt: 0.5\n"
        "answer_model:\n"
        "  provider: scripted\n"
        "  model_name: strong\n"
        f"  responses: [{json.dumps(ANSWER)}]\n"
        "  price_per_1k_completion: 10\n",
        encoding="utf-8",
    )
    settings = load_config(config)
    assert settings.answer_model is not None and settings.answer_model.provider == "scripted"
    agent = Agent.from_config(config, tools=[add])
    assert agent.model.name == "cheap"
    assert agent.answer_model is not None and agent.answer_model.name == "strong"
    result = agent.run("What is 17 + 25?")
    assert result.output == ANSWER
    assert [s.model for s in result.steps] == ["cheap", "cheap", "strong"]
    strong_usage: Usage = result.usage_by_model["strong"]
    assert result.cost_by_model["strong"] == round(strong_usage.completion_tokens / 100, 8)
    assert result.cost_by_model["cheap"] == round(
        result.usage_by_model["cheap"].prompt_tokens / 2000, 8
    )

    config.write_text("answer_model:\n  provider: scripted\n  temprature: 1\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"answer_model\.temprature: unknown key"):
        load_config(config)
    config.write_text("answer_model:\n  provider: nope\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"answer_model\.provider: unknown provider"):
        load_config(config)
