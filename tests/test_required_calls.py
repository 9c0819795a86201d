"""A required tool call is enforced by the pipeline for every model, not only stated in the
prompt: a reply without a call is fed back within ``max_retries``, then the run says the
requirement was not met."""

from __future__ import annotations

import json

from hermes_agent import Agent, ScriptedModel, Status


def call(name: str, **arguments: object) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def make(*script: str, **options: object) -> tuple[Agent, ScriptedModel]:
    model = ScriptedModel(list(script))
    agent = Agent(model=model, **options)  # type: ignore[arg-type]

    @agent.tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    return agent, model


def test_a_reply_without_the_required_call_is_fed_back_and_retried() -> None:
    agent, model = make("It is 5.", call("add", a=2, b=3), "2 + 3 = 5")
    result = agent.run("2 + 3?", tool_choice="required")
    assert result.status == Status.OK and result.output == "2 + 3 = 5"
    assert [c.name for c in result.tool_calls] == ["add"]
    feedback = model.requests[1].messages[-1]
    assert feedback.role == "user" and "You must call one of the tools now" in feedback.content
    assert model.requests[1].settings.tool_choice == "required"  # still forced until it calls
    assert model.requests[2].settings.tool_choice == "auto"  # then free to answer
    assert result.steps[0].tool_choice_enforcement == "prompt"


def test_a_named_tool_that_never_comes_ends_the_run_with_a_clear_status() -> None:
    agent, model = make("no", "still no", "never", max_retries=2)
    result = agent.run("2 + 3?", tool_choice="add")
    assert result.status == Status.MODEL_ERROR and result.loop_status == "failed"
    assert result.error == (
        "tool_choice 'add' was not met: the model answered without calling the tool 'add' "
        "in 3 turns"
    )
    assert len(model.requests) == 3 and result.tool_calls == []


def test_auto_still_lets_the_model_answer_in_text() -> None:
    agent, model = make("Hello!")
    result = agent.run("hi")
    assert result.status == Status.OK and result.output == "Hello!" and len(model.requests) == 1
    assert result.steps[0].tool_choice_enforcement is None
