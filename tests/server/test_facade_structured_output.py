"""Structured output through the OpenAI-compatible facade of the default service
(``hermes-agent serve``: the embedded SmolLM2 model and the demo tools), with the real
clients against a real uvicorn: the openai SDK (``response_format`` json_schema, chat and
Responses, streamed and not), pydantic-ai (``NativeOutput``, ``ToolOutput``) and
openai-agents (``output_type``, on both of its models), alone and with tools of the client's.

What is asserted is the contract, not the 135M model's taste: the answer is an instance of
the client's type; the agent's own (demo) tools do not run unless the operator keeps them
(``service.openai_schema_agent_tools``); with the client's tools, the calls go out and the
final answer is still typed; and a run that cannot give the JSON asked for is an error (422,
``no_structured_answer``), never prose with ``finish_reason: "length"``. That last one is
played by a scripted model that only ever calls (the embedded model's grammar makes the
JSON valid by construction, so it cannot fail it on cue).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest
from pydantic import BaseModel

from hermes_agent import Agent, ScriptedModel
from hermes_agent.demo_tools import demo_tools
from hermes_agent.loading import build_agent
from hermes_agent.server import ServiceSettings, create_app
from hermes_agent.testing import tool_call
from server_harness import serve

if TYPE_CHECKING:
    from pydantic_ai.models.openai import OpenAIChatModel

# The packages are imported by the tests that use them, not at collection (a second or so).
for _package in ("llama_cpp", "agents", "pydantic_ai"):
    if importlib.util.find_spec(_package) is None:
        pytest.skip(f"could not import {_package!r}", allow_module_level=True)

pytestmark = pytest.mark.embedded
MODEL = "hermes-agent"
ASK = "A laptop costs 999.5 dollars. Give the product as JSON."
ASK_WITH_TOOL = "What is the price of a laptop? Use the price tool."


class Product(BaseModel):
    name: str
    price: float


PRICE_TOOL = {
    "type": "function",
    "function": {
        "name": "get_price",
        "description": "The price of a product in dollars.",
        "parameters": {
            "type": "object",
            "properties": {"product": {"type": "string"}},
            "required": ["product"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """What ``hermes-agent serve`` serves with no config: the embedded model and the demo
    tools (``auth: none`` on loopback instead of a key file)."""
    agent = build_agent(None, tools=demo_tools())
    try:
        with serve(create_app(agent=agent, settings=ServiceSettings(auth="none"))) as base:
            yield f"{base}/v1"
    finally:
        agent.close()


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0)


def async_client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)


def ran_server_side(extension: dict[str, Any]) -> list[str]:
    return [call["name"] for call in extension["tool_calls"]]


# -- the openai SDK -----------------------------------------------------------------------------


def test_chat_json_schema_is_typed_and_runs_no_agent_tool(url: str) -> None:
    reply = client(url).chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": ASK}], response_format=Product
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Product)
    assert ran_server_side((reply.model_extra or {})["hermes"]) == []


def test_chat_json_schema_streamed_sends_only_the_json(url: str) -> None:
    with client(url).chat.completions.stream(
        model=MODEL, messages=[{"role": "user", "content": ASK}], response_format=Product
    ) as stream:
        final = stream.get_final_completion()
    content = final.choices[0].message.content or ""
    assert Product.model_validate_json(content) == final.choices[0].message.parsed


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
def test_responses_text_format_is_typed(url: str, stream: bool) -> None:
    sdk = client(url)
    if stream:
        with sdk.responses.stream(model=MODEL, input=ASK, text_format=Product) as events:
            parsed = events.get_final_response().output_parsed
    else:
        parsed = sdk.responses.parse(model=MODEL, input=ASK, text_format=Product).output_parsed
    assert isinstance(parsed, Product)


def test_chat_json_schema_with_client_tools_calls_then_answers_typed(url: str) -> None:
    sdk = client(url)
    messages: list[Any] = [{"role": "user", "content": ASK_WITH_TOOL}]
    first = sdk.chat.completions.parse(
        model=MODEL,
        messages=messages,
        response_format=Product,
        tools=[PRICE_TOOL],  # type: ignore[list-item]
        tool_choice="required",
    )
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls" and message.content is None
    calls = message.tool_calls or []
    assert [call.function.name for call in calls] == ["get_price"]
    messages.append(message.model_dump(exclude_none=True, exclude={"parsed"}))
    messages += [{"role": "tool", "tool_call_id": call.id, "content": "999.5"} for call in calls]
    second = sdk.chat.completions.parse(
        model=MODEL,
        messages=messages,
        response_format=Product,
        tools=[PRICE_TOOL],  # type: ignore[list-item]
    )
    assert second.choices[0].finish_reason == "stop"
    assert isinstance(second.choices[0].message.parsed, Product)


def test_a_forced_tool_without_tools_is_refused_when_the_agent_tools_are_hidden(url: str) -> None:
    with pytest.raises(openai.BadRequestError, match="openai_schema_agent_tools"):
        client(url).chat.completions.parse(
            model=MODEL,
            messages=[{"role": "user", "content": ASK}],
            response_format=Product,
            tool_choice="required",
        )


# -- pydantic-ai --------------------------------------------------------------------------------


def pydantic_model(url: str) -> OpenAIChatModel:
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    return OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=url, api_key="unused"))


def test_pydantic_ai_native_output(url: str) -> None:
    import pydantic_ai
    from pydantic_ai import NativeOutput

    agent = pydantic_ai.Agent(pydantic_model(url), output_type=NativeOutput(Product))
    assert isinstance(agent.run_sync(ASK).output, Product)


def test_pydantic_ai_tool_output(url: str) -> None:
    import pydantic_ai
    from pydantic_ai import ToolOutput

    agent = pydantic_ai.Agent(pydantic_model(url), output_type=ToolOutput(Product))
    assert isinstance(agent.run_sync(ASK).output, Product)


def test_pydantic_ai_native_output_after_a_function_tool(url: str) -> None:
    import pydantic_ai
    from pydantic_ai import NativeOutput

    agent = pydantic_ai.Agent(pydantic_model(url), output_type=NativeOutput(Product))
    asked: list[str] = []

    def get_price(product: str) -> float:
        """The price of a product in dollars."""
        asked.append(product)
        return 999.5

    agent.tool_plain(get_price)
    result = agent.run_sync(ASK_WITH_TOOL)
    assert isinstance(result.output, Product)
    assert len(asked) == 1  # called once, then answered in the schema


# -- openai-agents ------------------------------------------------------------------------------


def openai_agent(url: str, kind: str, tools: list[Any]) -> Any:
    import agents

    agents.set_tracing_disabled(True)  # openai-agents would send traces to OpenAI
    model_class = (
        agents.OpenAIResponsesModel if kind == "responses" else agents.OpenAIChatCompletionsModel
    )
    model = model_class(model=MODEL, openai_client=async_client(url))
    return agents.Agent(
        name="shop", instructions="Answer in JSON.", tools=tools, model=model, output_type=Product
    )


@pytest.mark.parametrize("kind", ["responses", "chat"])
def test_openai_agents_output_type(url: str, kind: str) -> None:
    from agents import Runner

    result = asyncio.run(Runner.run(openai_agent(url, kind, []), ASK))
    assert isinstance(result.final_output, Product)


@pytest.mark.parametrize("kind", ["responses", "chat"])
def test_openai_agents_output_type_after_a_function_tool(url: str, kind: str) -> None:
    from agents import Runner, function_tool

    asked: list[str] = []

    @function_tool
    def get_price(product: str) -> float:
        """The price of a product in dollars."""
        asked.append(product)
        return 999.5

    result = asyncio.run(Runner.run(openai_agent(url, kind, [get_price]), ASK_WITH_TOOL))
    assert isinstance(result.final_output, Product)
    assert asked  # the framework ran its tool before the typed answer


# -- a run that cannot give the JSON ------------------------------------------------------------


@pytest.fixture(scope="module")
def looping_url() -> Iterator[str]:
    """An agent whose model only ever calls its tool, with the operator keeping the agent's
    tools for JSON requests: every run stops at ``max_iterations`` without an answer."""
    agent = Agent(
        model=ScriptedModel(lambda _m, _t: tool_call("calculator", expression="1+1")),
        tools=demo_tools(),
        max_iterations=2,
    )
    settings = ServiceSettings(auth="none", openai_schema_agent_tools=True)
    with serve(create_app(agent=agent, settings=settings)) as base:
        yield f"{base}/v1"


def test_a_run_without_the_json_is_a_422_not_a_length_success(looping_url: str) -> None:
    sdk = client(looping_url)
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        sdk.chat.completions.parse(
            model=MODEL, messages=[{"role": "user", "content": ASK}], response_format=Product
        )
    error = caught.value
    assert isinstance(error.body, dict) and error.body["code"] == "no_structured_answer"
    assert "max_iterations" in error.body["message"]
    assert error.response.headers["x-should-retry"] == "false"
    with pytest.raises(openai.UnprocessableEntityError):
        sdk.responses.parse(model=MODEL, input=ASK, text_format=Product)


def test_a_streamed_run_without_the_json_ends_with_an_error_frame(looping_url: str) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": ASK}],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "Product", "schema": Product.model_json_schema()},
        },
        "stream": True,
    }
    with httpx.stream("POST", f"{looping_url}/chat/completions", json=body, timeout=60) as reply:
        frames = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    decoded = [json.loads(frame) for frame in frames[:-1]]
    said = "".join(
        choice["delta"].get("content") or ""
        for chunk in decoded
        for choice in chunk.get("choices", [])
    )
    assert said == ""  # nothing of the run's account was passed off as the JSON
    assert decoded[-1]["error"]["code"] == "no_structured_answer"
    assert not any(
        choice.get("finish_reason") == "length"
        for chunk in decoded
        for choice in chunk.get("choices", [])
    )


def test_the_operator_may_keep_the_agent_tools(looping_url: str) -> None:
    """With ``openai_schema_agent_tools``, the agent's tools stay in the run (and run)."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": ASK}],
        "response_format": {"type": "json_object"},
    }
    reply = httpx.post(f"{looping_url}/chat/completions", json=body, timeout=60)
    error = reply.json()["error"]
    assert reply.status_code == 422 and error["code"] == "no_structured_answer"
    assert "calculator" in error["message"]  # what ran, in the account of the run


# -- the embedded engine's grammar -----------------------------------------------------------


def test_the_embedded_model_answers_in_the_schema_after_tool_results() -> None:
    """A structured turn that answers the user may call or answer (one grammar: a valid call
    or JSON of the schema); the turn after the results is held to the answer alone."""
    from hermes_agent.models.base import ModelSettings
    from hermes_agent.models.llamacpp import LlamaCpp
    from hermes_agent.types import Message, ToolCall, ToolResult

    model = LlamaCpp()  # nothing is loaded until it generates
    tools = [PRICE_TOOL]
    settings = ModelSettings(output_schema=Product.model_json_schema())
    asked = [Message("user", ASK_WITH_TOOL)]
    both = model._request(asked, tools, settings)
    assert both.grammar is not None and both.grammar.startswith("root ::= text | calls")
    assert both.answer_grammar is None
    called = ToolCall("get_price", {"product": "laptop"}, "call-1")
    result = ToolResult("call-1", "get_price", {"status": "success", "data": 999.5, "error": None})
    answered = [*asked, Message("assistant", "", tool_calls=[called])]
    answered.append(Message("tool", tool_results=[result]))
    after = model._request(answered, tools, settings)
    assert after.answer_grammar is not None and after.answer_grammar.startswith("root ::= text\n")
    assert "<tool_call>" not in after.answer_grammar
    plain = model._request(answered, tools, ModelSettings())  # no schema: free to call again
    assert plain.answer_grammar is None


def test_the_embedded_engine_calls_then_answers_typed() -> None:
    """Tools and an output schema in one run of the embedded engine: the call is made (the
    schema does not silence it) and the answer after its result is typed."""
    agent = Agent(max_iterations=4)
    asked: list[str] = []

    @agent.tool
    def get_price(product: str) -> float:
        """The price of a product in dollars."""
        asked.append(product)
        return 999.5

    try:
        result = agent.run(ASK_WITH_TOOL, output_type=Product)
    finally:
        agent.close()
    assert [(c.name, c.status_code) for c in result.tool_calls] == [("get_price", 200)]
    assert len(asked) == 1
    assert isinstance(result.data, Product)


def test_the_endpoint_model_asks_the_server_for_the_schema() -> None:
    """``OpenAICompatible``: hermes mode with ``grammar`` sends one grammar of a valid call or
    the schema's JSON (the JSON alone once tool results are in); a turn with no tools offered
    asks for ``response_format`` json_schema; a native turn that may call keeps its tools and
    no response format."""
    from hermes_agent.models.base import ModelSettings
    from hermes_agent.models.openai import OpenAICompatible
    from hermes_agent.types import Message, ToolCall, ToolResult

    schema = Product.model_json_schema()
    settings = ModelSettings(output_schema=schema)
    asked = [Message("user", ASK_WITH_TOOL)]

    def body(mode: str, tools: list[dict[str, Any]], **options: Any) -> dict[str, Any]:
        model = OpenAICompatible("m", base_url="http://127.0.0.1:9/v1", mode=mode, **options)  # type: ignore[arg-type]
        sent: dict[str, Any] = json.loads(model.render_prompt(asked, tools, settings))
        return sent

    grammar = body("hermes", [PRICE_TOOL], grammar=True)["grammar"]
    assert grammar.startswith("root ::= text | calls") and '\\"price\\":' in grammar
    assert body("native", [])["response_format"]["json_schema"]["schema"] == schema
    assert body("hermes", [])["response_format"]["type"] == "json_schema"
    native = body("native", [PRICE_TOOL])
    assert "response_format" not in native and native["tools"] == [PRICE_TOOL]
    # With the results in hand, hermes mode with grammar answers, as the embedded model does.
    called = ToolCall("get_price", {"product": "laptop"}, "call-1")
    result = ToolResult("call-1", "get_price", {"status": "success", "data": 999.5, "error": None})
    asked += [Message("assistant", "", tool_calls=[called]), Message("tool", tool_results=[result])]
    after = body("hermes", [PRICE_TOOL], grammar=True)["grammar"]
    assert after.startswith("root ::= text\n") and "<tool_call>" not in after


# -- the page's example -------------------------------------------------------------------------


def test_the_facade_page_s_structured_output_example_runs(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "openai-facade.md").read_text("utf-8")
    section = page.split("\n## Structured output\n", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"```python\n(.*?)```", section, re.S)
    code = block.replace("http://127.0.0.1:8000/v1", url)
    exec(compile(code, "openai-facade.md (structured output)", "exec"), {"key": "unused"})
    assert capsys.readouterr().out.splitlines() == ["Product stop"]
