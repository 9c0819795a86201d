"""Test an agent without a real model.

Three things, for this project's tests and for yours:

- ``tool_call(name, **arguments)``: the text a Hermes model writes to call a tool, to put in
  a ``ScriptedModel``'s script.
- ``ScriptedModel`` (the same class as ``hermes_agent.ScriptedModel``): a model that answers
  from a list of completions or from a function of the conversation, and records every
  request it gets.
- ``override(agent, model=...)``: the agent answers with another model inside a ``with``
  block, so code that builds its own agent can be tested without changing that code.

::

    from hermes_agent import Agent
    from hermes_agent.testing import ScriptedModel, tool_call

    model = ScriptedModel([tool_call("add", a=2, b=3), "2 + 3 = 5"])
    agent = Agent(model=model)

    @agent.tool
    def add(a: int, b: int) -> int:
        return a + b

    assert agent.run("What is 2 + 3?").output == "2 + 3 = 5"
    assert model.requests[1].messages[-1].tool_results[0].content["data"] == 5
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from typing import TYPE_CHECKING

from hermes_agent.models.base import Model
from hermes_agent.models.scripted import ScriptedModel, ScriptedRequest, ScriptFunction

if TYPE_CHECKING:
    from hermes_agent.agent import Agent

__all__ = ["ScriptFunction", "ScriptedModel", "ScriptedRequest", "override", "tool_call"]


def tool_call(name: str, /, **arguments: object) -> str:
    """The ``<tool_call>`` block a model writes to call tool ``name`` with ``arguments``.

    The JSON is written as ``json.dumps`` writes it (non-ASCII characters as ``\\u`` escapes),
    as a model's output carries it; the parser turns the escapes back into characters. Join
    several blocks with ``+`` for calls made in one turn.
    """
    body = json.dumps({"name": name, "arguments": arguments})
    return f"<tool_call>\n{body}\n</tool_call>"


class _Keep(Enum):
    KEEP = "keep"


@contextmanager
def override(
    agent: Agent,
    *,
    model: Model | _Keep = _Keep.KEEP,
    answer_model: Model | _Keep | None = _Keep.KEEP,
) -> Iterator[Agent]:
    """Run ``agent`` with other models inside the block; the old ones are back after it.

    ``model`` replaces the model that makes the tool calls (and answers, without an
    ``answer_model``); ``answer_model`` replaces the one that writes the final answer
    (``None``: the model answers itself). What is not given stays. The agent itself is
    changed, not copied, so code that holds it (a server, a worker) sees the override; for a
    separate agent with other models, use ``agent.fork(model=...)``.
    """
    for candidate in (model, answer_model):
        if not isinstance(candidate, _Keep | None) and not isinstance(candidate, Model):
            raise TypeError(f"override needs a model, got {type(candidate).__name__}")
    saved = (agent._model, agent.answer_model)
    if not isinstance(model, _Keep):
        agent._model = model
    if not isinstance(answer_model, _Keep):
        agent.answer_model = answer_model
    try:
        yield agent
    finally:
        agent._model, agent.answer_model = saved
