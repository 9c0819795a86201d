"""The ThoughtGenerator's use of a model's thought policy (``models.profiles``).

Two things depend on the model family, and both are settled here, once for every engine and
for one-shot and streamed turns alike:

- A template that opens the thought (``opens_thought``): the completion is read as starting
  inside ``<think>`` — streamed, by a ``StreamParser(in_thought=True)``; one-shot, by reading
  the model's text again that way (``read_opened``), keeping the ids a server gave its calls.
- A call written inside the thought (``Completion.thought_calls``): ``ignore`` leaves it out,
  ``run`` makes it one of the turn's calls, ``ask`` makes it one that needs the approver
  (``ToolCall.needs_approval``). Whatever the policy, the run says what happened: a call left
  out is a warning in the result, each policy decision a ``hook`` record in the trail (hook
  ``thought_calls``), and a debug line in the ``hermes_agent`` log.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from hermes_agent.models.base import Model
from hermes_agent.models.profiles import ThoughtPolicy, thought_policy
from hermes_agent.pipeline.context import RunContext
from hermes_agent.protocol.parser import (
    NOTE_CALL_IN_THOUGHT,
    NOTE_UNCLOSED_THOUGHT,
    parse_completion,
)
from hermes_agent.types import Completion, ModelResponse

__all__ = ["apply_thought_policy", "policy_of", "read_opened"]

logger = logging.getLogger("hermes_agent.thought_calls")

NOTE_RAN: dict[str, str] = {
    "run": (
        "a <tool_call> written inside the thought runs as one of the turn's calls "
        "(thought_calls: run)"
    ),
    "ask": (
        "a <tool_call> written inside the thought runs only if the approver approves it "
        "(thought_calls: ask)"
    ),
}


def policy_of(model: Model) -> ThoughtPolicy:
    """The model's thought policy: the one its profile declares, else its family's by name."""
    declared = getattr(model.profile, "thought", None)  # a profile from before it had one
    return declared if declared is not None else thought_policy(model.name)


def read_opened(response: ModelResponse, policy: ThoughtPolicy) -> ModelResponse:
    """A one-shot turn of a model whose template opens the thought, read as starting inside
    it (the model parsed it without knowing). Calls keep the ids the first reading gave them
    (a server's ids for native calls), matched by tool and arguments."""
    if not policy.opens_thought:
        return response
    completion = parse_completion(response.text, in_thought=True)
    first = response.completion
    ids = [(call.name, call.arguments, call.id) for call in first.tool_calls + first.thought_calls]
    for call in completion.tool_calls + completion.thought_calls:
        for n, (name, arguments, call_id) in enumerate(ids):
            if name == call.name and arguments == call.arguments:
                call.id = call_id
                del ids[n]
                break
    return dataclasses.replace(response, completion=completion)


def apply_thought_policy(
    ctx: RunContext, completion: Completion, policy: ThoughtPolicy
) -> Completion:
    """The completion with the calls of its thought ignored, added, or added for approval,
    as ``policy`` says; the result, the trail and the log say which."""
    if (
        policy.opens_thought
        and NOTE_UNCLOSED_THOUGHT in completion.notes
        and not completion.content
        and not completion.tool_calls
    ):
        _warn(
            ctx,
            f"step {ctx.step}: the model's whole turn was read as a thought that never closed "
            f"(its template opens <think>, opens_thought for {policy.family or 'this model'}); "
            "if thinking is off for this model, set model.opens_thought: false",
        )
    calls = completion.thought_calls
    if not calls:
        return completion
    mode = policy.thought_calls
    seen = [(call.name, call.arguments) for call in completion.tool_calls]
    record: dict[str, Any] = {
        "policy": mode,
        "family": policy.family,
        "calls": [{"name": c.name, "arguments": c.arguments, "id": c.id} for c in calls],
    }
    if mode == "ignore":
        names = ", ".join(f"'{call.name}'" for call in calls)
        _warn(
            ctx,
            f"step {ctx.step}: the model wrote {_count(len(calls))} inside its thought "
            f"({names}), not run (thought_calls: ignore); set model.thought_calls to run or "
            "ask to run such calls",
        )
        ctx.note_hook("thought_calls", "thought", **record, ran=False)
        return completion
    # A call the model wrote again after the thought (a draft, then the call) runs once.
    fresh = [call for call in calls if (call.name, call.arguments) not in seen]
    if mode == "ask":
        for call in fresh:
            call.needs_approval = True
    record["duplicates"] = len(calls) - len(fresh)
    ctx.note_hook("thought_calls", "thought", **record, ran=True)
    logger.debug(
        "run %s step %d: %s written inside the thought %s (thought_calls: %s): %s",
        ctx.request_id,
        ctx.step,
        _count(len(calls)),
        "runs" if mode == "run" else "runs if approved",
        mode,
        [call.name for call in calls],
    )
    notes = [NOTE_RAN[mode] if note == NOTE_CALL_IN_THOUGHT else note for note in completion.notes]
    return dataclasses.replace(completion, tool_calls=[*fresh, *completion.tool_calls], notes=notes)


def _warn(ctx: RunContext, warning: str) -> None:
    ctx.warnings.append(warning)
    logger.debug("run %s: %s", ctx.request_id, warning)


def _count(n: int) -> str:
    return "a call" if n == 1 else f"{n} calls"
