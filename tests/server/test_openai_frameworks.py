"""Other frameworks on the OpenAI-compatible facade, end to end: openai-agents (its default
Responses model and its chat-completions model, with a ``function_tool``, streaming and
response chaining) and pydantic-ai (plain, streaming, a function tool, tool output, native and
prompted structured output), each the real package against a real uvicorn serving the facade.

Behind the facade the agent's model is an OpenAI-compatible endpoint in Hermes mode: a scripted
server of the tests' own (``openai_server``) that answers with the Hermes text a model would
write (``<tool_call>...</tool_call>``, JSON) and records each prompt it was sent. So every test
shows the whole adapter: the client's tools rendered in the Hermes ``<tools>`` block, the
completion parsed by the project's parser and checked against the client's schema, the calls
handed back to the framework (which runs them), and its results fed back as
``<tool_response>``."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import openai
import pytest
from pydantic import BaseModel

from hermes_agent import Agent, OpenAICompatible
from hermes_agent.server import ServiceSettings, create_app
from openai_server import ScriptedServer, hermes_call, running_server, text
from server_harness import serve

if TYPE_CHECKING:
    from pydantic_ai.models.openai import OpenAIChatModel

# Both frameworks are imported by the tests that use them, not at collection (a second or so).
for _package in ("agents", "pydantic_ai"):
    if importlib.util.find_spec(_package) is None:
        pytest.skip(f"could not import {_package!r}", allow_module_level=True)

MODEL = "hermes-agent"


class Weather(BaseModel):
    city: str
    temperature: int


class Facade:
    """The facade over a scripted Hermes-mode endpoint: ``url`` (the facade's ``/v1``) and
    ``model`` (the endpoint: ``push`` what the model writes, read ``requests``)."""

    def __init__(self, url: str, model: ScriptedServer) -> None:
        self.url = f"{url}/v1"
        self.model = model

    def system(self, index: int = 0) -> str:
        """The system prompt of the endpoint's ``index``-th request."""
        messages = self.model.requests[index]["messages"]
        assert messages[0]["role"] == "system"
        return str(messages[0]["content"])

    def last_tool_response(self) -> dict[str, Any]:
        """The last ``<tool_response>`` the endpoint was sent, decoded."""
        message = self.model.requests[-1]["messages"][-1]
        assert message["role"] == "tool"
        body = message["content"].split("<tool_response>\n", 1)[1].split("\n</tool_response>")[0]
        decoded: dict[str, Any] = json.loads(body)
        return decoded


@pytest.fixture(scope="module")
def facade() -> Iterator[Facade]:
    from agents import set_tracing_disabled

    set_tracing_disabled(True)  # openai-agents would send traces to OpenAI
    with running_server() as endpoint:
        model = OpenAICompatible("hermes-3", base_url=endpoint.base_url, mode="hermes")
        agent = Agent(model=model)

        @agent.tool
        def server_secret(key: str) -> str:
            """A tool of the agent's own (hidden when the client brings its tools)."""
            return "never shown"

        with serve(create_app(agent=agent, settings=ServiceSettings(auth="none"))) as url:
            yield Facade(url, endpoint)


@pytest.fixture(autouse=True)
def fresh(facade: Facade) -> None:
    facade.model.reset()


# -- openai-agents ------------------------------------------------------------------------------

weather_calls: list[str] = []


def get_weather(city: str) -> str:
    """The current weather in a city."""
    weather_calls.append(city)
    return f"21 C and sunny in {city}"


def openai_agent(facade: Facade, kind: str) -> Any:
    """An openai-agents agent with the ``get_weather`` function tool, on the facade."""
    import agents

    client = openai.AsyncOpenAI(base_url=facade.url, api_key="unused", max_retries=0)
    model_class = (
        agents.OpenAIResponsesModel if kind == "responses" else agents.OpenAIChatCompletionsModel
    )
    model = model_class(model=MODEL, openai_client=client)
    tool = agents.function_tool(get_weather)
    return agents.Agent(name="weather", instructions="Answer briefly.", tools=[tool], model=model)


@pytest.mark.parametrize("kind", ["responses", "chat"])
def test_openai_agents_runs_its_function_tool_through_the_facade(facade: Facade, kind: str) -> None:
    from agents import Runner

    weather_calls.clear()
    facade.model.push(
        text(hermes_call("get_weather", city="Paris")), text("It is 21 C and sunny in Paris.")
    )
    result = asyncio.run(Runner.run(openai_agent(facade, kind), "Weather in Paris?"))
    assert result.final_output == "It is 21 C and sunny in Paris."
    assert weather_calls == ["Paris"]  # the framework ran its own tool, once
    first = facade.system(0)
    assert '"name": "get_weather"' in first and "server_secret" not in first
    assert facade.last_tool_response() == {
        "name": "get_weather",
        "content": {"status": "success", "data": "21 C and sunny in Paris", "error": None},
    }


def test_openai_agents_streams_from_the_responses_api(facade: Facade) -> None:
    from agents import Runner

    weather_calls.clear()
    facade.model.push(text(hermes_call("get_weather", city="Oslo")), text("Oslo: 21 C and sunny."))

    async def streamed() -> tuple[Any, list[str]]:
        run = Runner.run_streamed(openai_agent(facade, "responses"), "Weather in Oslo?")
        kinds = [
            event.data.type
            async for event in run.stream_events()
            if event.type == "raw_response_event"
        ]
        return run.final_output, kinds

    output, kinds = asyncio.run(streamed())
    assert output == "Oslo: 21 C and sunny." and weather_calls == ["Oslo"]
    assert kinds.count("response.created") == 2 and kinds.count("response.completed") == 2
    assert "response.function_call_arguments.done" in kinds
    assert "response.output_text.delta" in kinds


def test_openai_agents_chains_responses_by_id(facade: Facade) -> None:
    from agents import Runner

    facade.model.push(text("Noted: your name is Ada."), text("Your name is Ada."))
    agent = openai_agent(facade, "responses")

    async def chained() -> tuple[Any, Any]:
        first = await Runner.run(agent, "My name is Ada.", auto_previous_response_id=True)
        second = await Runner.run(
            agent, "What is my name?", previous_response_id=first.last_response_id
        )
        return first, second

    first, second = asyncio.run(chained())
    assert first.last_response_id and first.last_response_id.startswith("resp_")
    assert second.final_output == "Your name is Ada."
    sent = facade.model.requests[-1]["messages"]  # the first turn came from the stored response
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
    assert (
        sent[1]["content"] == "My name is Ada." and sent[2]["content"] == "Noted: your name is Ada."
    )


# -- pydantic-ai -----------------------------------------------------------------------------------


def pydantic_model(facade: Facade) -> OpenAIChatModel:
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    provider = OpenAIProvider(base_url=facade.url, api_key="unused")
    return OpenAIChatModel(MODEL, provider=provider)


def test_pydantic_ai_plain_and_streaming(facade: Facade) -> None:
    import pydantic_ai

    agent = pydantic_ai.Agent(pydantic_model(facade))
    facade.model.push(text("Hello from the agent!"), text("Streamed hello."))
    assert agent.run_sync("Hello").output == "Hello from the agent!"

    async def streamed() -> list[str]:
        async with agent.run_stream("Hello again") as run:
            return [piece async for piece in run.stream_text(delta=True, debounce_by=None)]

    pieces = asyncio.run(streamed())
    assert "".join(pieces) == "Streamed hello." and len(pieces) > 1


def test_pydantic_ai_tool_output_after_a_function_tool(facade: Facade) -> None:
    import pydantic_ai

    agent = pydantic_ai.Agent(pydantic_model(facade), output_type=Weather)
    seen: list[str] = []

    @agent.tool_plain
    def temperature(city: str) -> int:
        """The temperature in a city, in C."""
        seen.append(city)
        return 21

    facade.model.push(
        text(hermes_call("temperature", city="Rome")),
        text(hermes_call("final_result", city="Rome", temperature=21)),
    )
    result = agent.run_sync("How warm is Rome?")
    assert result.output == Weather(city="Rome", temperature=21) and seen == ["Rome"]
    tools = facade.system(0)
    assert '"name": "temperature"' in tools and '"name": "final_result"' in tools
    assert facade.last_tool_response()["content"]["data"] == "21"


def test_pydantic_ai_tool_output_call_that_fails_the_schema_is_asked_again(
    facade: Facade,
) -> None:
    import pydantic_ai

    agent = pydantic_ai.Agent(pydantic_model(facade), output_type=Weather)
    facade.model.push(
        text(hermes_call("final_result", city="Rome", temperature="warm")),
        text(hermes_call("final_result", city="Rome", temperature=22)),
    )
    assert agent.run_sync("How warm is Rome?").output == Weather(city="Rome", temperature=22)
    assert len(facade.model.requests) == 2  # the facade asked again; the client saw one call
    retry = facade.last_tool_response()["content"]
    assert retry["status"] == "error" and "temperature" in retry["error"]


@pytest.mark.parametrize("mode", ["native", "prompted"])
def test_pydantic_ai_structured_output(facade: Facade, mode: str) -> None:
    import pydantic_ai
    from pydantic_ai import NativeOutput, PromptedOutput

    output_type = NativeOutput(Weather) if mode == "native" else PromptedOutput(Weather)
    agent = pydantic_ai.Agent(pydantic_model(facade), output_type=output_type)
    facade.model.push(
        text('{"city": "Lima"}'),  # fails the schema: the runtime asks again, with the errors
        text('{"city": "Lima", "temperature": 19}'),
    )
    assert agent.run_sync("Weather in Lima as JSON").output == Weather(city="Lima", temperature=19)
    assert "<schema>" in facade.system(0)  # the runtime's JSON mode
    retry = facade.model.requests[1]["messages"][-1]
    assert retry["role"] == "user" and "temperature" in retry["content"]
    if mode == "native":
        assert '"temperature"' in facade.system(0)  # the client's schema itself


# -- the service docs ---------------------------------------------------------------------------

DOCS = Path(__file__).resolve().parents[2] / "docs" / "openai-facade.md"


def test_the_service_docs_client_tool_examples_run(
    facade: Facade, capsys: pytest.CaptureFixture[str]
) -> None:
    page = DOCS.read_text(encoding="utf-8")
    section = page.split("## Client tools, structured output and the Responses API", 1)[1]
    blocks = re.findall(r"```python\n(.*?)```", section.split("\n## ", 1)[0], re.S)
    assert len(blocks) == 3
    facade.model.push(
        text(hermes_call("get_weather", city="Paris")),
        text("It is 21 C and sunny in Paris."),
        text(hermes_call("get_weather", city="Paris")),
        text("Paris: 21 C, sunny."),
        text('{"city": "Paris", "temperature": 21}'),
    )
    base = facade.url.removesuffix("/v1")
    for number, block in enumerate(blocks, start=1):
        code = block.replace("http://127.0.0.1:8000", base)
        exec(compile(code, f"openai-facade.md (client tools block {number})", "exec"), {"key": "k"})
    assert capsys.readouterr().out.splitlines() == [
        'tool_calls get_weather {"city": "Paris"}',
        "It is 21 C and sunny in Paris.",
        "Paris: 21 C, sunny.",
        "city='Paris' temperature=21",
    ]
    ran = facade.model.requests[3]["messages"][-1]  # what openai-agents' tool returned
    assert ran["role"] == "tool" and "21 C, sunny in Paris" in ran["content"]
