"""``OpenAICompatible`` against a real OpenAI-compatible server nobody here wrote:
llama-cpp-python's own ``llama_cpp.server`` serving the bundled SmolLM2 GGUF on loopback,
started the way docs/guide.md ("Against llama.cpp's server") says: ``hermes-agent
llama-server`` with the guide's flags for each mode, and agents built from the guide's configs.

The 135M model's answers are poor; what is tested is the path: a whole tool round trip (call →
result sent back → the model's next turn) in ``hermes`` and ``native`` modes, streaming and not,
what happens when the server aborts a stream it cannot produce, and the clear refusal when
native mode meets a chat format that would ignore the tools.

The servers are started by the tests on free ports and stopped afterwards. ``hermes-agent
llama-server`` loads the model with llama.cpp's weight repacking off, as ``LlamaCpp`` does: the
repacked AMX kernels crashed with this model on some of our machines.
"""

from __future__ import annotations

import asyncio
import logging
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from pydantic import BaseModel

from hermes_agent import Agent, ResultEvent, RunResult

pytest.importorskip("llama_cpp")
pytest.importorskip("llama_cpp.server.app", reason="needs llama-cpp-python[server]")
from hermes_agent.config import parse_config
from hermes_agent.loading import build_agent
from hermes_agent.models.openai import OpenAICompatible
from server_harness import free_port

pytestmark = pytest.mark.embedded
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide.md"


def guide_block(label: str) -> str:
    """The fenced block after ``<!-- llama-server...: label -->`` in the guide."""
    text = GUIDE.read_text(encoding="utf-8")
    found = re.search(rf"<!-- {re.escape(label)} -->\n```\w+\n(.*?)```", text, re.S)
    assert found, f"docs/guide.md has no block marked {label!r}"
    return found.group(1)


def _serve(mode: str) -> Iterator[str]:
    """The guide's command for ``mode``, on a free port, with a smaller context and two
    threads so that the tests stay quick on small machines."""
    port = free_port()
    (line,) = guide_block(f"llama-server: {mode}").strip().splitlines()
    program, *documented = shlex.split(line)
    assert program == "hermes-agent"
    command = [
        sys.executable, "-m", "hermes_agent", *documented,
        "--port", str(port), "--n-ctx", "1024", "--n-threads", "2",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 90
        while True:
            if process.poll() is not None:
                error = process.stderr.read().decode(errors="replace") if process.stderr else ""
                pytest.fail(f"hermes-agent llama-server exited at start: {error[-2000:]}")
            try:
                if httpx.get(f"{base_url}/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("hermes-agent llama-server did not start within 90 s")
            time.sleep(0.3)
        yield base_url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def chatml_server() -> Iterator[str]:
    """Plain ChatML: what a Hermes-protocol model is served with (``hermes`` mode)."""
    yield from _serve("hermes")


@pytest.fixture(scope="module")
def function_calling_server() -> Iterator[str]:
    """llama-cpp-python's own tool calling (``native`` mode)."""
    yield from _serve("native")


def _guide_agent(mode: str, base_url: str) -> Agent:
    """An agent built from the guide's config for ``mode``, pointed at the test's server."""
    data = yaml.safe_load(guide_block(f"llama-server config: {mode}"))
    assert data["model"]["base_url"].startswith("http://127.0.0.1:808")
    data["model"].update(
        base_url=base_url, max_tokens=64, timeout=120, max_retries=1, temperature=0.0
    )
    data["agent"] = {"max_iterations": 2}
    agent = build_agent(parse_config(data, source="docs/guide.md"))

    @agent.tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers, e.g. a=17 and b=23."""
        return a * b

    return agent


def _agent(base_url: str, mode: str, tool_choice: str, **model_options: object) -> Agent:
    model = OpenAICompatible(
        "smollm2",
        base_url=base_url,
        mode=mode,  # type: ignore[arg-type]
        max_tokens=64,
        timeout=120,
        max_retries=1,
        **model_options,  # type: ignore[arg-type]
    )
    agent = Agent(model=model, tool_choice=tool_choice, max_iterations=2, temperature=0.0)

    # Integer parameters: the server's own grammar for them is bounded and always valid JSON
    # (its string rule is not: the tiny model writes raw control characters into strings).
    @agent.tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers, e.g. a=17 and b=23."""
        return a * b

    return agent


def _run(agent: Agent, message: str, *, stream: bool) -> RunResult:
    async def go() -> RunResult:
        if not stream:
            return await agent.arun(message)
        async for event in agent.astream(message):
            if isinstance(event, ResultEvent):
                return event.result
        raise AssertionError("the stream ended without a result")

    return asyncio.run(go())


def _assert_round_trip(result: RunResult) -> None:
    first = result.tool_calls[0]
    assert (first.name, first.status_code) == ("multiply", 200), result.tool_calls
    assert first.result == first.arguments["a"] * first.arguments["b"]
    # the result went back to the server and the model took another turn
    assert len(result.steps) == 2
    assert result.status in (200, 206), result.error


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
def test_hermes_mode_round_trip_with_the_servers_grammar(chatml_server: str, stream: bool) -> None:
    agent = _guide_agent("hermes", chatml_server)  # grammar: true, as the guide says
    agent.tool_choice = "multiply"
    result = _run(agent, "What is 17 * 23?", stream=stream)
    _assert_round_trip(result)
    assert result.steps[0].tool_choice_enforcement == "grammar"


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
def test_native_mode_round_trip(function_calling_server: str, stream: bool) -> None:
    agent = _guide_agent("native", function_calling_server)
    agent.tool_choice = "multiply"
    result = _run(agent, "What is 17 * 23?", stream=stream)
    _assert_round_trip(result)
    assert result.steps[0].tool_choice_enforcement == "server"


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
def test_native_mode_round_trip_on_aiohttp(function_calling_server: str, stream: bool) -> None:
    """The SDK's aiohttp client (``transport: aiohttp``, what the service and the workers use
    by default) against the real server, its connections closed on the loop that opened them."""
    agent = _agent(function_calling_server, "native", "multiply", transport="aiohttp")

    async def go() -> RunResult:
        try:
            if not stream:
                return await agent.arun("What is 17 * 23?")
            async for event in agent.astream("What is 17 * 23?"):
                if isinstance(event, ResultEvent):
                    return event.result
            raise AssertionError("the stream ended without a result")
        finally:
            await agent.close_connections()

    _assert_round_trip(asyncio.run(go()))


def test_an_aborted_stream_falls_back_and_a_failure_is_a_502_with_the_servers_answer(
    function_calling_server: str, caplog: pytest.LogCaptureFixture
) -> None:
    # llama-cpp-python's server answers a streamed request with tools and tool_choice
    # "required" with 200 and then closes the stream empty (it supports neither); asked again
    # without streaming it fails with HTTP 500. Neither may pass for an empty answer.
    agent = _agent(function_calling_server, "native", "required")
    with caplog.at_level(logging.WARNING, logger="hermes_agent"):
        result = _run(agent, "What is 17 * 23?", stream=True)
    assert "ended the stream without a reply (it may not stream tool calls)" in caplog.text
    assert result.status == 502 and result.loop_status == "failed"
    assert result.error is not None and "answered HTTP 500" in result.error
    assert "internal_server_error" in result.error
    assert result.output != ""


def test_native_mode_against_a_format_that_ignores_tools_fails_saying_so(
    chatml_server: str,
) -> None:
    # Pointed at the hermes-mode server (plain ChatML), native mode would get prose and never
    # a call; the server refuses the tools instead, and the run says what to start.
    agent = _guide_agent("native", chatml_server)
    result = agent.run("What is 17 * 23?", tool_choice="multiply")
    assert result.status == 502 and result.tool_calls == []
    assert result.error is not None
    assert "chat format chatml, which ignores `tools`" in result.error
    assert "--chat-format chatml-function-calling" in result.error


def test_the_server_refuses_ignored_tools_with_an_openai_error(chatml_server: str) -> None:
    request = {
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
    }
    refused = httpx.post(f"{chatml_server}/chat/completions", json=request, timeout=30)
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "tools_ignored"
    del request["tools"]
    answered = httpx.post(
        f"{chatml_server}/chat/completions", json={**request, "max_tokens": 4}, timeout=60
    )
    assert answered.status_code == 200  # everything else passes through untouched
    assert answered.json()["choices"][0]["message"]["role"] == "assistant"


def test_the_wrapper_has_the_server_load_its_model_with_repacking_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import llama_cpp
    from llama_cpp.server.model import LlamaProxy

    from hermes_agent.models.llamacpp import llama_server_loading

    seen: list[bool] = []

    def load(settings: object) -> str:
        seen.append(llama_cpp.llama_cpp.llama_model_default_params().use_extra_bufts)
        return "a model"

    monkeypatch.setattr(LlamaProxy, "load_llama_from_model_settings", staticmethod(load))
    with llama_server_loading():
        assert LlamaProxy.load_llama_from_model_settings(None) == "a model"
    assert seen == [False]
    assert LlamaProxy.load_llama_from_model_settings is load  # put back as it was
    assert llama_cpp.llama_cpp.llama_model_default_params().use_extra_bufts is True


# -- structured output ----------------------------------------------------------------------


class Product(BaseModel):
    name: str
    price: float


PRODUCT_SCHEMA = Product.model_json_schema()


def test_a_json_schema_response_format_reaches_the_servers_grammar(chatml_server: str) -> None:
    # OpenAI's spelling; llama-cpp-python's request model knows only json_object (HTTP 500
    # for json_schema), so the wrapper hands it on as json_object with the schema.
    request = {
        "messages": [{"role": "user", "content": "A lamp costs 35.5 dollars. As JSON."}],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "Product", "schema": PRODUCT_SCHEMA},
        },
        "max_tokens": 48,
        "temperature": 0.0,
    }
    reply = httpx.post(f"{chatml_server}/chat/completions", json=request, timeout=120)
    assert reply.status_code == 200, reply.text
    answer = reply.json()["choices"][0]["message"]["content"]
    assert isinstance(Product.model_validate_json(answer), Product)


@pytest.mark.parametrize("mode", ["hermes", "native"])
def test_structured_output_without_tools_is_typed_in_both_modes(
    chatml_server: str, function_calling_server: str, mode: str
) -> None:
    """No tools offered: the schema goes to the server as ``response_format`` (hermes mode
    without ``grammar``, and native mode), and the server's grammar holds the answer to it."""
    url = chatml_server if mode == "hermes" else function_calling_server
    model = OpenAICompatible(
        "smollm2",
        base_url=url,
        mode=mode,
        max_tokens=64,
        timeout=120,
        max_retries=0,  # type: ignore[arg-type]
    )
    agent = Agent(model=model, max_iterations=2, temperature=0.0)
    result = asyncio.run(agent.arun("A lamp costs 35.5 dollars. As JSON.", output_type=Product))
    assert isinstance(result.data, Product), (result.status, result.output)
    assert result.output_retries == 0


def test_structured_output_with_a_tool_calls_then_answers_typed_with_the_grammar(
    chatml_server: str,
) -> None:
    """hermes mode with ``grammar``: one grammar of a valid call or the schema's JSON, then,
    with the result in hand, the JSON: the call is made and the answer is typed."""
    model = OpenAICompatible(
        "smollm2",
        base_url=chatml_server,
        mode="hermes",
        grammar=True,
        max_tokens=128,
        timeout=600,  # the server samples under the grammar slowly on a loaded machine
        max_retries=0,
    )
    agent = Agent(model=model, max_iterations=4, temperature=0.0)
    asked: list[str] = []

    @agent.tool
    def get_price(product: str) -> float:
        """The price of a product in dollars."""
        asked.append(product)
        return 999.5

    result = asyncio.run(
        agent.arun("What is the price of a laptop? Use the price tool.", output_type=Product)
    )
    made = {(c.name, c.status_code) for c in result.tool_calls}  # one turn may call twice
    assert made == {("get_price", 200)}, (result.status, result.error, result.output)
    assert isinstance(result.data, Product), (result.status, result.output)
