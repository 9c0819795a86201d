"""The seams the service layers build on: the model registry, declared model capabilities,
typed events, the hook context, and the config vocabulary kept in one place (the import
layering is import-linter's: tests/test_architecture.py)."""

from __future__ import annotations

import dataclasses
import doctest
import importlib
import pkgutil
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, Literal

import pytest

import hermes_agent
from hermes_agent import (
    Agent,
    Completion,
    ConfigError,
    HookContext,
    Memory,
    Message,
    ModelBase,
    ModelConfig,
    ModelProfile,
    ModelResponse,
    ModelSettings,
    ScriptedModel,
    Status,
    StreamChunk,
    register_model,
)
from hermes_agent.config import ToolConfig, parse_config
from hermes_agent.evals.report import CaseResult, record_run
from hermes_agent.events import (
    EVENT_KINDS,
    EVENT_TYPES,
    InputEvent,
    OutputEvent,
    ResultEvent,
    ScratchPadDeltaEvent,
    SelectionEvent,
    TextDeltaEvent,
    ThoughtEvent,
    ToolCallDeltaEvent,
    ToolCallParsedEvent,
    ToolCallStartedEvent,
    ToolResultsEvent,
)
from hermes_agent.models.registry import build_model, model_backends
from hermes_agent.pipeline.status import REFUSED
from hermes_agent.storage import InMemoryStorage
from hermes_agent.testing import tool_call as call
from hermes_agent.tools.registry import SETTINGS
from hermes_agent.types import RunResult, Step, ToolCallRecord

SRC = Path(hermes_agent.__file__).parent


# -- the model seam: declared profile, a registry, per-provider config ---------------------------


class EchoConfig(ModelConfig):
    provider: Literal["echo"] = "echo"
    prefix: str = ""


class EchoModel(ModelBase):
    """A new backend: it repeats the user's last message."""

    def __init__(self, prefix: str) -> None:
        self.name = "echo"
        self.prefix = prefix

    async def complete(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]], settings: ModelSettings
    ) -> ModelResponse:
        text = self.prefix + messages[-1].content
        return ModelResponse(Completion(content=text), text, model_name=self.name)

    async def stream(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]], settings: ModelSettings
    ) -> AsyncIterator[StreamChunk]:
        yield StreamChunk(self.prefix + messages[-1].content)


def test_a_new_model_backend_is_one_class_and_one_registration(tmp_path: Path) -> None:
    register_model("echo", EchoConfig, lambda c: EchoModel(c.prefix), replace=True)
    assert "echo" in model_backends()
    config = tmp_path / "echo.yaml"
    config.write_text("model:\n  provider: echo\n  prefix: '> '\n", encoding="utf-8")
    agent = Agent.from_config(config)
    assert isinstance(agent.model, EchoModel)
    assert agent.run("hello").output == "> hello"
    # its profile came from ModelBase: no context window declared, ChatML prompt, estimates
    assert agent.model.profile == ModelProfile()
    assert agent.model.count_tokens("abcdef") == 3
    assert "<|im_start|>user\nhi<|im_end|>" in agent.model.render_prompt(
        [Message("user", "hi")], [], ModelSettings()
    )

    config.write_text("model:\n  provider: echo\n  model_path: x.gguf\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"model\.model_path: unknown key.*prefix"):
        Agent.from_config(config)


def test_a_provider_rejects_keys_of_another_provider() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"model": {"provider": "openai", "model_name": "m", "model_path": "x"}})
    assert "model.model_path: unknown key" in str(caught.value)
    with pytest.raises(ConfigError, match=r"model\.provider: unknown provider 'nope'"):
        parse_config({"model": {"provider": "nope"}})
    config = parse_config({"model": {"provider": "scripted", "responses": ["hi"]}})
    assert build_model(config.model).name == "scripted"


def test_a_registered_name_is_not_replaced_silently() -> None:
    with pytest.raises(hermes_agent.HermesAgentError, match="already registered"):
        register_model("openai", EchoConfig, lambda c: EchoModel(""))


def test_models_declare_their_profile() -> None:
    scripted = ScriptedModel(["x"], context_window=512)
    assert scripted.profile == ModelProfile(context_window=512, provider="scripted")
    openai_model = pytest.importorskip("hermes_agent.models.openai").OpenAICompatible(
        "m", base_url="http://127.0.0.1:9/v1", context_window=8192, max_tokens=100
    )
    assert openai_model.profile == ModelProfile(
        8192, 100, can_summarize=True, provider="openai", server_url="http://127.0.0.1:9/v1/"
    )
    for name in ("context_window", "count_tokens", "render_prompt", "can_summarize"):
        source = (SRC / "pipeline" / "context_window.py").read_text(encoding="utf-8")
        assert f'getattr(ctx.model, "{name}"' not in source


def test_the_summary_call_is_made_inside_the_input_stage_and_fits_the_window() -> None:
    prompts: list[str] = []

    def answer(messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> str:
        if messages[0].content.startswith("Summarise"):
            prompts.append(messages[-1].content)
            return "they talked about numbers"
        return "ok"

    class Summarising(ScriptedModel):
        @property
        def profile(self) -> ModelProfile:
            return ModelProfile(context_window=400, can_summarize=True)

    model = Summarising(answer)
    store = InMemoryStorage()
    memory = Memory(history_window=1, summary_max_chars=120)
    agent = Agent(model=model, memory=memory, storage=store)
    seen: list[tuple[str, int]] = []
    agent.add_hook("pre_input", lambda ctx: seen.append(("pre", len(prompts))))
    agent.add_hook("post_input", lambda ctx: seen.append(("post", len(prompts))))
    for i in range(6):
        result = agent.run(f"question {i} " + "x" * 300, session_id="s")
    assert prompts, "the model was asked for a summary"
    # the hooks surround the summary call: it happened inside the input stage
    assert ("pre", len(prompts) - 1) in seen and ("post", len(prompts)) in seen
    # the transcript was cut to fit the 400-token window: the oldest turns went first
    assert all(model.count_tokens(p) < 400 for p in prompts)
    assert "question 3" in prompts[-1] and "question 0" not in prompts[-1]
    # and its usage counts in the run
    assert result.usage.requests == 2
    # it is in the audit trail, in the input stage's records, like any other model call
    records = store.records(result.request_id)
    roles = [(r.stage, r.role) for r in records]
    assert ("InputParser", "summary_prompt") in roles and ("InputParser", "summary") in roles
    summary = next(r for r in records if r.role == "summary")
    assert summary.content == "they talked about numbers"


# -- typed events ------------------------------------------------------------------------------


def test_every_event_kind_is_emitted_with_its_fields() -> None:
    import asyncio

    model = ScriptedModel(
        [
            "<think>add them</think><scratch_pad>plan</scratch_pad>" + call("add", a=2, b=3),
            "The answer is 5.",
        ],
        chunk_size=3,
    )
    agent = Agent(model=model, tools=[])

    @agent.tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    async def collect() -> list[Any]:
        return [event async for event in agent.astream("2 + 3?")]

    events = asyncio.run(collect())
    kinds = {event.kind for event in events}
    assert kinds == set(EVENT_KINDS)
    first = {type(event): event for event in reversed(events)}
    assert first[InputEvent].status == 200 and first[InputEvent].request_id
    assert "".join(e.text for e in events if isinstance(e, ScratchPadDeltaEvent)) == "plan"
    assert first[ToolCallStartedEvent].index == 0
    deltas = "".join(e.delta for e in events if isinstance(e, ToolCallDeltaEvent))
    assert '"add"' in deltas
    parsed = first[ToolCallParsedEvent]
    assert (parsed.name, parsed.arguments, parsed.error) == ("add", {"a": 2, "b": 3}, None)
    thought = first[ThoughtEvent]
    assert (thought.status, thought.step, thought.tool_calls) == (200, 0, ["add"])
    selection = first[SelectionEvent]
    assert selection.planned[0].name == "add" and selection.planned[0].arguments == {"a": 2, "b": 3}
    assert selection.rejected == []
    results = first[ToolResultsEvent]
    assert results.results[0].name == "add" and results.results[0].status == 200
    text = "".join(e.text for e in events if isinstance(e, TextDeltaEvent))
    assert text == "The answer is 5."
    output = next(e for e in events if isinstance(e, OutputEvent))
    assert (output.status, output.output, output.error) == (200, "The answer is 5.", None)
    final = events[-1]
    assert isinstance(final, ResultEvent) and final.result.output == "The answer is 5."
    # the wire shape: kind plus attributes, JSON-safe
    import json

    wire = json.loads(json.dumps(selection.to_dict()))
    assert wire["kind"] == "selection" and wire["planned"][0]["name"] == "add"
    assert json.loads(json.dumps(final.to_dict()))["result"]["status"] == 200
    # the dict view older code used still works
    assert parsed.data["name"] == "add"


def test_every_event_kind_is_documented_once() -> None:
    guide = (SRC.parents[1] / "docs" / "guide.md").read_text(encoding="utf-8")
    for event_type in EVENT_TYPES:
        row = f"| `{event_type.kind}` | `{event_type.__name__}` |"
        assert guide.count(row) == 1, row
    assert len(EVENT_TYPES) == len(set(EVENT_KINDS)) == 12


# -- the hook context --------------------------------------------------------------------------


def test_a_hook_vetoes_a_call_with_only_the_hook_context() -> None:
    model = ScriptedModel([call("delete_all", table="users"), "I did not delete anything."])
    agent = Agent(model=model)
    ran: list[str] = []

    @agent.tool
    def delete_all(table: str) -> str:
        """Delete every row of a table."""
        ran.append(table)
        return "deleted"

    def guard(ctx: HookContext) -> None:
        assert isinstance(ctx, HookContext) and ctx.point == "pre_execution"
        for plan in ctx.planned:
            if plan.tool.name == "delete_all":
                ctx.veto(plan, "destructive calls are not allowed here")

    agent.add_hook("pre_execution", guard)
    result = agent.run("wipe users")
    assert ran == []
    assert result.tool_calls[0].status_code == Status.DENIED
    assert "destructive calls are not allowed here" in (result.tool_calls[0].error or "")


def test_the_hook_context_exposes_no_run_internals() -> None:
    public = {name for name in dir(HookContext) if not name.startswith("_")}
    assert public == {
        "answered_by", "call_id", "completion", "error", "finish", "history", "hook_name",
        "inject_variable", "input_params", "last_results", "messages", "model", "note",
        "output", "planned", "point", "request_id", "response", "results", "rewrite_result",
        "session_id", "status", "step", "steps", "timestamp", "tool_calls", "tool_name",
        "tools", "usage", "user_message", "variables", "veto",
    }  # fmt: skip
    seen: list[Any] = []
    agent = Agent(model=ScriptedModel(["hi"]))
    agent.add_hook("post_input", lambda ctx: seen.append(ctx.messages))
    agent.run("hello")
    assert isinstance(seen[0], tuple)  # a read-only view: appending to it changes nothing


# -- one vocabulary ------------------------------------------------------------------------------


def test_a_rate_limited_call_counts_as_refused_in_evaluations() -> None:
    assert Status.RATE_LIMITED in REFUSED
    record = ToolCallRecord("search", {"q": "x"}, None, 429, "rate-limited")
    run = RunResult("", 200, "r", "s", steps=[Step(0, call("search", q="x"), [record])])
    case = CaseResult("c", "simple", correct=False)
    record_run(case, run)
    assert case.calls == [] and case.refused[0]["status"] == 429
    assert case.invalid is False  # refused for its rate, not for its arguments


def test_the_config_tool_fields_are_the_tool_settings() -> None:
    assert set(ToolConfig.model_fields) == set(SETTINGS)


def test_config_model_sections_are_dataclass_free_pydantic_models() -> None:
    # a guard for the dataclass/pydantic split: what is parsed from outside is pydantic
    assert not dataclasses.is_dataclass(ModelConfig)


def test_doctests_in_the_package_pass() -> None:
    failures = 0
    attempted = 0
    for info in pkgutil.walk_packages(hermes_agent.__path__, "hermes_agent."):
        if info.name.startswith("hermes_agent.cli") or info.name.endswith("__main__"):
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional extra that is not installed
            continue
        outcome = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        failures += outcome.failed
        attempted += outcome.attempted
    assert attempted > 5
    assert failures == 0


def test_an_object_that_is_not_a_model_is_refused_with_what_it_lacks() -> None:
    class Duck:
        name = "duck"

        async def complete(self, *args: Any) -> None: ...

        async def stream(self, *args: Any) -> None: ...

    with pytest.raises(hermes_agent.HermesAgentError, match="lacks profile, render_prompt"):
        Agent(model=Duck())  # type: ignore[arg-type]


def test_as_plain_gives_what_dataclasses_asdict_gives_and_copies_as_deeply() -> None:
    """``types.as_plain`` stands in for ``dataclasses.asdict`` on every result and event the
    service sends: the same dicts, lists, tuples, named tuples and deep copies."""
    import collections

    from pydantic import BaseModel

    from hermes_agent.types import Usage, as_plain

    class Point(BaseModel):
        x: int

    pair = collections.namedtuple("pair", "left right")
    mutable = {"nested": [1, {"deep": ["x"]}], 3: (1, 2.5, None), "pair": pair([1], "r")}
    call_record = ToolCallRecord("t", {"a": [1, 2]}, mutable, metadata={"point": Point(x=1)})
    result = RunResult(
        output="out",
        status=200,
        request_id="r",
        session_id="s",
        tool_calls=[call_record],
        usage=Usage(prompt_tokens=3, completion_tokens=4, requests=1),
        steps=[Step(index=0, completion_text="c", tool_calls=[call_record], notes=["n"])],
        rendered=b"bytes",
        variables={"v": frozenset({1})},
    )
    plain = as_plain(result)
    assert plain == dataclasses.asdict(result)
    assert type(plain["tool_calls"][0]["result"][3]) is tuple
    assert type(plain["tool_calls"][0]["result"]["pair"]) is pair
    # A deep copy, as asdict's: changing it leaves the run's result as it was.
    plain["tool_calls"][0]["result"]["nested"][1]["deep"].append("y")
    plain["tool_calls"][0]["metadata"]["point"].x = 2
    assert mutable["nested"][1] == {"deep": ["x"]} and call_record.metadata["point"].x == 1
    assert as_plain(collections.defaultdict(list, {"k": [1]})) == {"k": [1]}
    assert as_plain("text") == "text" and as_plain(Usage) is Usage  # a class stays a class

    class Unhashable(type):  # a metaclass that makes its classes unhashable
        __hash__ = None  # type: ignore[assignment]

    @dataclasses.dataclass
    class Odd(metaclass=Unhashable):
        items: list[Any]

    odd = Odd([{"a": 1}])
    assert as_plain(odd) == dataclasses.asdict(odd) == {"items": [{"a": 1}]}
