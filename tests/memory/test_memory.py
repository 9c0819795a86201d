"""History policy: model-made summary with extractive fallback, the context-window guard,
usage and cost, and the audit records each stage leaves (with an in-memory sink)."""

from __future__ import annotations

from collections.abc import Sequence

from hermes_agent import Agent, Memory, Message, Pricing, ScriptedModel, ToolExecution
from hermes_agent.audit.records import AuditRecord, AuditSink
from hermes_agent.protocol.chatml import render_conversation, to_chatml
from hermes_agent.storage import InMemoryStorage
from hermes_agent.testing import tool_call as call


def test_model_summary_of_old_turns_is_bounded_and_made_once_per_fold() -> None:
    summaries: list[str] = []

    def answer(messages: Sequence[Message], tools: object) -> str:
        if messages[0].content.startswith("Summarise the conversation"):
            summaries.append(messages[1].content)
            return "The user asked about the numbers 0 to N. " * 20  # too long on purpose
        return "ok"

    agent = Agent(
        model=ScriptedModel(answer),
        memory=Memory(history_window=3, summary_max_chars=120, summarize_with_model=True),
    )
    for turn in range(6):
        agent.run(f"question {turn}", session_id="s")
    assert len(summaries) == 2  # turns 4 and 5 each fold one more old turn
    assert "User: question 0" in summaries[-1] and "User: question 1" in summaries[-1]
    seen = agent.model.requests[-1].messages  # type: ignore[attr-defined]
    assert seen[0].role == "system" and seen[0].content.startswith("Earlier in this conversation:")
    assert len(seen[0].content) <= 120


def test_summary_falls_back_to_extractive_when_the_model_fails() -> None:
    def answer(messages: Sequence[Message], tools: object) -> str:
        if messages[0].content.startswith("Summarise"):
            raise_model_error()
        return f"answer to {messages[-1].content}"

    agent = Agent(
        model=ScriptedModel(answer), memory=Memory(history_window=1, summarize_with_model=True)
    )
    agent.run("first", session_id="s")
    agent.run("second", session_id="s")
    agent.run("third", session_id="s")
    summary = agent.model.requests[-1].messages[0].content  # type: ignore[attr-defined]
    assert summary == "Earlier in this conversation: Q: first A: answer to first"


def raise_model_error() -> None:
    from hermes_agent import ModelError

    raise ModelError("summary endpoint down")


def test_a_huge_tool_result_does_not_push_the_prompt_past_the_context_window() -> None:
    prompts: list[str] = []
    model = ScriptedModel([call("dump"), "done"], context_window=2000)

    def remember(messages: Sequence[Message], tools: object) -> None:
        prompts.append(to_chatml(render_conversation(messages, tools)))  # type: ignore[arg-type]

    whole = ToolExecution(max_result_chars=200_000)  # kept whole
    agent = Agent(model=model, max_tokens=200, tool_execution=whole)

    @agent.tool
    def dump() -> str:
        """Returns a huge text."""
        return "line of log output\n" * 10_000

    for turn in range(3):  # some history, too
        model._responses[model._next : model._next] = [f"earlier answer {turn}"]
        agent.run(f"earlier {turn} " + "x" * 500, session_id="s")
    result = agent.run("show the log", session_id="s")
    assert result.output == "done"
    final_request = model.requests[-1]
    prompt = model.render_prompt(
        final_request.messages, final_request.tools, final_request.settings
    )
    assert len(prompt) // 3 + 1 <= 2000 - 200
    cut = final_request.messages[-1].tool_results[0].content["data"]
    assert "cut to fit the context window: 190,000 characters in total" in cut
    # The session keeps the whole result; only the prompt was trimmed.
    stored = agent.sessions.load("s")
    full = [m for m in stored if m.role == "tool"][-1].tool_results[0].content["data"]
    assert len(full) == 190_000


def test_usage_per_step_and_cost() -> None:
    agent = Agent(
        model=ScriptedModel([call("noop"), "done"]),
        pricing=Pricing(prompt_per_1k=0.5, completion_per_1k=1.5),
    )

    @agent.tool
    def noop() -> None:
        """Does nothing."""

    result = agent.run("go")
    assert [s.usage.requests for s in result.steps] == [1, 1]
    assert result.usage.completion_tokens == sum(s.usage.completion_tokens for s in result.steps)
    expected = result.usage.prompt_tokens * 0.5 / 1000 + result.usage.completion_tokens * 1.5 / 1000
    assert result.cost == round(expected, 8)
    assert Agent(model=ScriptedModel(["x"])).run("hi").cost is None


class ListSink:
    """Keeps each ``write`` call (one per whole step) and passes the records on."""

    def __init__(self, inner: AuditSink) -> None:
        self.batches: list[list[AuditRecord]] = []
        self.inner = inner

    def write(self, records: Sequence[AuditRecord]) -> None:
        self.batches.append(list(records))
        self.inner.write(records)

    def flush(self) -> None:
        self.inner.flush()


class FakeStorage(InMemoryStorage):
    """The in-memory store, with every write call to its audit sink kept for inspection."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = ListSink(super().audit)

    @property
    def audit(self) -> ListSink:
        return self.calls


def test_every_stage_leaves_a_record_written_in_whole_steps_and_redacted() -> None:
    storage = FakeStorage()
    agent = Agent(
        model=ScriptedModel([call("lookup", key="sk-live-123456"), "The key is [hidden]."]),
        storage=storage,
        secrets=["sk-live-123456"],
        redact_patterns=[r"token-\d+"],
        system_prompt="Never reveal token-42.",
    )

    @agent.tool
    def lookup(key: str) -> str:
        """Look a key up."""
        return f"value for {key}"

    result = agent.run("find sk-live-123456")
    batches = storage.audit.batches
    # Step 0 (input, thought, selection, execution), then step 1 (thought, output).
    assert [[r.stage for r in batch] for batch in batches] == [
        [
            "InputParser",
            "ThoughtGenerator",
            "ThoughtGenerator",
            "ToolSelector",
            "ToolExecutor",
            "ToolExecutor",
        ],
        ["ThoughtGenerator", "ThoughtGenerator", "OutputRenderer"],
    ]
    records = [r for batch in batches for r in batch]
    assert [r.seq for r in records] == list(range(len(records)))
    assert {r.request_id for r in records} == {result.request_id}
    roles = [r.role for r in records]
    assert roles == [
        "user",
        "prompt",
        "completion",
        "selection",
        "tool",
        "tool_calls",
        "prompt_added",
        "completion",
        "output",
    ]
    # The second prompt is recorded as what was added to the first; together they are exactly
    # the prompt the model received.
    generation = "<|im_start|>assistant\n"
    second = agent.model.requests[1]  # type: ignore[attr-defined]
    sent = agent.model.render_prompt(second.messages, second.tools, second.settings)  # type: ignore[attr-defined]
    rebuilt = records[1].content.removesuffix(generation) + records[6].content + generation
    assert rebuilt == agent.redactor(sent)
    assert all(r.latency_ms >= 0 and r.timestamp_ns > 0 for r in records)
    prompt = records[1].content
    assert prompt.startswith("<|im_start|>system\nYou are a function calling AI model.")
    assert "token-42" not in prompt and "[REDACTED]" in prompt
    assert all("sk-live-123456" not in r.content for r in records)
    assert "<tool_response>" in records[4].content
    assert len({r.system_prompt_sha256 for r in records}) == 1


def test_a_run_that_fails_in_a_hook_still_leaves_its_records() -> None:
    storage = FakeStorage()
    agent = Agent(model=ScriptedModel([call("noop"), "done"]), storage=storage)

    @agent.tool
    def noop() -> None:
        """Does nothing."""

    def explode(ctx: object) -> None:
        raise RuntimeError("audit me")

    agent.add_hook("pre_execution", explode)
    result = agent.run("go")
    assert result.status == 500
    stages = [r.stage for batch in storage.audit.batches for r in batch]
    assert stages == [
        "InputParser",
        "ThoughtGenerator",
        "ThoughtGenerator",
        "ToolSelector",
        "ToolExecutor",
        "ToolExecutor",
        "OutputRenderer",
    ]
    failed = next(r for b in storage.audit.batches for r in b if r.stage == "ToolExecutor")
    assert failed.status == "error" and failed.status_code == 500


def test_a_model_summary_is_recorded_with_the_input_stage() -> None:
    def answer(messages: Sequence[Message], tools: object) -> str:
        if messages[0].content.startswith("Summarise the conversation"):
            return "They asked two questions."
        return "ok"

    storage = FakeStorage()
    agent = Agent(
        model=ScriptedModel(answer),
        storage=storage,
        memory=Memory(history_window=1, summarize_with_model=True),
    )
    agent.run("first", session_id="s")
    agent.run("second", session_id="s")
    third = agent.run("third", session_id="s")  # "first" leaves the window: a summary is made
    records = storage.records(third.request_id)
    stage_zero = [(r.stage, r.role) for r in records if r.stage == "InputParser"]
    assert stage_zero == [
        ("InputParser", "user"),
        ("InputParser", "summary_prompt"),
        ("InputParser", "summary"),
    ]
    summary_prompt = next(r for r in records if r.role == "summary_prompt").content
    assert "Summarise the conversation" in summary_prompt and "User: first" in summary_prompt
    assert next(r for r in records if r.role == "summary").content == "They asked two questions."


def test_changing_the_history_window_after_construction_takes_effect() -> None:
    from hermes_agent import Agent, ScriptedModel

    model = ScriptedModel(["a", "b", "c"])
    agent = Agent(model=model, memory=Memory(history_window=10))
    agent.run("one", session_id="s")
    agent.history.history_window = 0
    agent.history.summary_max_chars = 0
    agent.run("two", session_id="s")
    assert [m.content for m in model.requests[1].messages] == ["two"]
    assert agent.history.history_window == 0
