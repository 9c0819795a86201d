"""Explain mode: the model gives a one-line reason with each turn; it is recorded in the step and
in the audit trail. Off by default."""

from __future__ import annotations

from pathlib import Path

from hermes_agent import Agent, ScriptedModel
from hermes_agent.audit.records import Role
from hermes_agent.pipeline.thought_generator import MAX_REASON_CHARS, reason_of
from hermes_agent.protocol.prompts import EXPLAIN_PROMPT
from openai_server import (  # noqa: F401  (running_fixture, server_fixture: the fixtures)
    ScriptedServer,
    call,
    running_fixture,
    server_fixture,
    text,
    tool_calls,
)
from server_harness import add

CALL = (
    "<scratch_pad>\nReason: the user asks for a sum, and add computes it\n</scratch_pad>\n"
    '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
)
ANSWER = (
    "<scratch_pad>\nReason: add returned 5, which answers the question\n</scratch_pad>\n2 + 3 = 5"
)


def test_reasons_are_recorded_in_the_steps_and_the_trail() -> None:
    model = ScriptedModel([CALL, ANSWER])
    agent = Agent(model=model, tools=[add], explain=True, storage="memory://")
    result = agent.run("What is 2 + 3?")
    assert result.output == "2 + 3 = 5"
    assert [step.reason for step in result.steps] == [
        "the user asks for a sum, and add computes it",
        "add returned 5, which answers the question",
    ]
    assert EXPLAIN_PROMPT in model.requests[0].messages[0].content
    assert agent.storage is not None
    reasons = [
        (r.step, r.stage, r.content, r.model_name)
        for r in agent.storage.records(result.request_id)
        if r.role == Role.REASON
    ]
    assert reasons == [
        (0, "ThoughtGenerator", "the user asks for a sum, and add computes it", "scripted"),
        (1, "ThoughtGenerator", "add returned 5, which answers the question", "scripted"),
    ]
    assert result.to_dict()["steps"][0]["reason"].startswith("the user asks")
    agent.close()


def test_off_by_default() -> None:
    model = ScriptedModel([CALL, ANSWER])
    agent = Agent(model=model, tools=[add], storage="memory://")
    result = agent.run("What is 2 + 3?")
    assert [step.reason for step in result.steps] == [None, None]
    assert all(EXPLAIN_PROMPT not in m.content for m in model.requests[0].messages)
    assert agent.storage is not None
    assert not [r for r in agent.storage.records(result.request_id) if r.role == Role.REASON]
    agent.close()


def test_a_turn_without_a_reason_records_none() -> None:
    result = Agent(model=ScriptedModel(["Hi!"]), explain=True).run("hi")
    assert result.steps[0].reason is None and result.output == "Hi!"


def test_reason_of() -> None:
    assert reason_of(None) is None
    assert reason_of("  \n ") is None
    assert reason_of("Goal: add\nREASON: because") == "because"
    assert reason_of("\nno label here\nsecond line") == "no label here"
    long = reason_of("Reason: " + "x" * 1000)
    assert long is not None and len(long) == MAX_REASON_CHARS and long.endswith("…")


def test_explain_in_the_config(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "model:\n  provider: scripted\n"
        "  responses: ['<scratch_pad>Reason: greeting</scratch_pad>Hello']\n"
        "agent:\n  explain: true\n",
        encoding="utf-8",
    )
    result = Agent.from_config(config).run("hi")
    assert result.output == "Hello"
    assert result.steps[0].reason == "greeting"


def test_an_endpoint_in_native_mode_gives_reasons(server: ScriptedServer) -> None:
    from hermes_agent.models.openai import OpenAICompatible

    server.reset()
    server.push(
        tool_calls(
            call("add", {"a": 2, "b": 3}),
            content="<scratch_pad>\nReason: a sum is asked\n</scratch_pad>",
        ),
        text("<scratch_pad>\nReason: the tool answered\n</scratch_pad>\n5"),
    )
    model = OpenAICompatible(
        "scripted-model", base_url=server.base_url, mode="native", max_retries=0
    )
    result = Agent(model=model, tools=[add], explain=True).run("What is 2 + 3?")
    assert result.output == "5"
    assert [step.reason for step in result.steps] == ["a sum is asked", "the tool answered"]
    system = server.requests[0]["messages"][0]
    assert system["role"] == "system" and "Reason: <in one line" in system["content"]
