"""A required tool call is enforced by the pipeline for every model, not only stated in the
prompt: a reply without a call is fed back within ``max_retries``, then the run says the
requirement was not met."""

from __future__ import annotations

from hermes_agent import Agent, ScriptedModel, Status
from hermes_agent.testing import tool_call as call


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


def test_a_call_to_another_tool_does_not_meet_a_named_choice() -> None:
    agent, model = make(call("add", a=1, b=1), "All done.", call("mul", a=2, b=3), "6")

    @agent.tool
    def mul(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    result = agent.run("2 * 3?", tool_choice="mul")
    assert [c.name for c in result.tool_calls] == ["add", "mul"]
    assert [r.settings.tool_choice for r in model.requests] == ["mul", "mul", "mul", "auto"]
    assert result.status == Status.OK and result.output == "6"


def test_a_malformed_call_does_not_meet_the_requirement() -> None:
    script = ("<tool_call>{broken</tool_call>", "No call.", call("add", a=1, b=2), "3")
    agent, model = make(*script, max_retries=5)
    result = agent.run("1 + 2?", tool_choice="required")
    assert result.status == Status.OK and result.output == "3"
    assert [c.name for c in result.tool_calls][-1] == "add"
    assert [r.settings.tool_choice for r in model.requests] == ["required"] * 3 + ["auto"]


def test_the_reminder_is_sent_but_not_saved_to_the_session() -> None:
    agent, model = make("No call.", call("add", a=1, b=2), "3")
    agent.run("1 + 2?", session_id="s", tool_choice="required")
    stored = agent.sessions.load("s")
    assert not any("You must call" in m.content for m in stored)
    assert any("You must call" in m.content for m in model.requests[1].messages)
