"""``ScriptedModel``: a model whose answers you write, for tests, dry runs and replay.

Give it a list of completions (Hermes text, exactly what a model would write) or a function of
the conversation. It records every request, so a test can assert on what the agent sent::

    from hermes_agent import Agent, ScriptedModel

    model = ScriptedModel([
        '<tool_call>\\n{"name": "add", "arguments": {"a": 2, "b": 3}}\\n</tool_call>',
        "2 + 3 = 5",
    ])
    agent = Agent(model=model)

    @agent.tool
    def add(a: int, b: int) -> int:
        return a + b

    assert agent.run("What is 2 + 3?").output == "2 + 3 = 5"
    assert model.requests[1].messages[-1].role == "tool"
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hermes_agent.errors import ModelError
from hermes_agent.models.base import ModelBase, ModelProfile, ModelSettings
from hermes_agent.models.profiles import ThoughtCalls, thought_policy
from hermes_agent.protocol.parser import parse_completion
from hermes_agent.types import Message, ModelResponse, StreamChunk, Usage

ScriptFunction = Callable[[Sequence[Message], Sequence[dict[str, Any]]], str]


@dataclass(slots=True)
class ScriptedRequest:
    """One request the scripted model received."""

    messages: list[Message]
    tools: list[dict[str, Any]]
    settings: ModelSettings


class ScriptedModel(ModelBase):
    """A model that answers from a script: a list of completions, or a function.

    ``chunk_size`` sets how ``stream`` splits each completion (characters per chunk);
    ``context_window`` (tokens, estimated) makes the agent fit prompts to it, as it does for a
    real model. ``thought_calls`` and ``opens_thought`` set its thought policy
    (``models.profiles``; by default the family's, by ``name``), so a script can play a
    thinking model.
    Usage counts are rough (characters / 4), enough to see them move in a test.
    """

    def __init__(
        self,
        script: Sequence[str] | ScriptFunction,
        *,
        name: str = "scripted",
        thought_calls: ThoughtCalls | None = None,
        opens_thought: bool | None = None,
        chunk_size: int = 4,
        context_window: int | None = None,
    ) -> None:
        self.name = name
        self.context_window = context_window
        # None: the family's, found by the name when asked.
        self.thought = (
            None
            if thought_calls is None and opens_thought is None
            else thought_policy(name, thought_calls=thought_calls, opens_thought=opens_thought)
        )
        self.chunk_size = max(1, chunk_size)
        self._function: ScriptFunction | None = None
        self._responses: list[str] = []
        if callable(script):
            self._function = script
        else:
            self._responses = list(script)
        self._next = 0
        self.requests: list[ScriptedRequest] = []

    @property
    def profile(self) -> ModelProfile:
        return ModelProfile(
            context_window=self.context_window, provider="scripted", thought=self.thought
        )

    def _answer(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        settings: ModelSettings,
    ) -> str:
        self.requests.append(ScriptedRequest(list(messages), list(tools), settings))
        if self._function is not None:
            return self._function(messages, tools)
        if self._next >= len(self._responses):
            raise ModelError(
                f"ScriptedModel ran out of responses after {len(self._responses)} "
                "completions; add more to its script"
            )
        text = self._responses[self._next]
        self._next += 1
        return text

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        settings: ModelSettings,
    ) -> ModelResponse:
        text = self._answer(messages, tools, settings)
        return ModelResponse(
            completion=parse_completion(text),
            text=text,
            usage=_usage(messages, text),
            model_name=self.name,
        )

    async def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        settings: ModelSettings,
    ) -> AsyncIterator[StreamChunk]:
        text = self._answer(messages, tools, settings)
        for start in range(0, len(text), self.chunk_size):
            yield StreamChunk(text[start : start + self.chunk_size])
        yield StreamChunk("", usage=_usage(messages, text))


def _usage(messages: Sequence[Message], text: str) -> Usage:
    prompt_chars = sum(len(m.content) for m in messages[-2:])
    return Usage(prompt_tokens=prompt_chars // 4, completion_tokens=len(text) // 4, requests=1)
