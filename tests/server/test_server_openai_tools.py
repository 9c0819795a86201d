"""The facade as a protocol adapter, with the official ``openai`` SDK over a real uvicorn: client
tools (plain and streamed, stateless and in a kept session, invalid calls asked again within the
bound, beside the agent's own tools where the operator says so), ``response_format``, the
Responses API (text, item lists, streaming, ``previous_response_id`` per user, clear refusals)
and the 404 that names the endpoints. Behind the facade: a scripted Hermes-mode endpoint
(``openai_server``) that records the prompts, or the embedded model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from hermes_agent import Agent, OpenAICompatible
from hermes_agent.runs.keys import MemoryKeyStore
from hermes_agent.server import ServiceSettings, create_app
from hermes_agent.server.openai.runs import plan_tools
from hermes_agent.server.openai.wire import OpenAIError
from openai_server import ScriptedServer, hermes_call, running_server, text
from server_harness import serve

MODEL = "hermes-agent"
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather in a city", "parameters": CITY},
}
RESPONSES_WEATHER = {"type": "function", "name": "get_weather", "parameters": CITY}


def user(content: str) -> dict[str, str]:
    return {"role": "user", "content": content}


class Service:
    def __init__(self, url: str, endpoint: ScriptedServer, keys: MemoryKeyStore) -> None:
        self.url, self.endpoint, self.keys = url, endpoint, keys
        self.alice, self.bob = keys.create("alice"), keys.create("bob")

    def sdk(self, key: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key or self.alice, max_retries=0)

    def sent(self, index: int = -1) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = self.endpoint.requests[index]["messages"]
        return messages


def hermes_agent(endpoint: ScriptedServer) -> Agent:
    agent = Agent(model=OpenAICompatible("hermes-3", base_url=endpoint.base_url, mode="hermes"))

    @agent.tool
    def lookup(key: str) -> str:
        """A tool of the agent's own."""
        return f"value of {key}"

    return agent


@pytest.fixture(scope="module")
def service() -> Iterator[Service]:
    keys = MemoryKeyStore()
    with running_server() as endpoint:
        app = create_app(agent=hermes_agent(endpoint), settings=ServiceSettings(), keys=keys)
        with serve(app) as url:
            yield Service(url, endpoint, keys)


@pytest.fixture(autouse=True)
def fresh(request: pytest.FixtureRequest) -> None:
    if "service" in request.fixturenames:
        request.getfixturevalue("service").endpoint.reset()


# -- chat completions: client tools -----------------------------------------------------------


def test_client_tools_are_handed_back_and_the_run_goes_on_from_their_results(
    service: Service,
) -> None:
    client = service.sdk()
    service.endpoint.push(text("Let me look." + hermes_call("get_weather", city="Paris")))
    messages: list[Any] = [user("Weather in Paris?")]
    reply = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me look."
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert reply.hermes["tool_calls"] == []  # type: ignore[attr-defined]  (nothing ran here)
    system = service.sent(0)[0]["content"]
    assert "<tools>" in system and '"name": "get_weather"' in system
    assert '"name": "lookup"' not in system  # alone: only the client's tools

    service.endpoint.push(text("It is 21 C in Paris."))
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "21 C"},
    ]
    answer = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER])
    assert answer.choices[0].message.content == "It is 21 C in Paris."
    assert answer.choices[0].finish_reason == "stop"
    sent = service.sent()
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool"]
    assert '"data": "21 C"' in sent[-1]["content"] and call.id == sent[-1]["tool_call_id"]


def test_a_kept_session_continues_from_the_tool_results(service: Service) -> None:
    client = service.sdk()
    headers = {"X-Hermes-Session-Id": "trip"}
    service.endpoint.push(text(hermes_call("get_weather", city="Oslo")), text("Cold in Oslo."))
    first = client.chat.completions.create(
        model=MODEL, messages=[user("Oslo?")], tools=[WEATHER], extra_headers=headers
    )
    call = (first.choices[0].message.tool_calls or [])[0]
    tail = [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "-5 C"},
    ]
    answer = client.chat.completions.create(
        model=MODEL,
        messages=[user("ignored: the session holds the history"), *tail],
        tools=[WEATHER],
        extra_headers=headers,
    )
    assert answer.choices[0].message.content == "Cold in Oslo."
    assert [m["role"] for m in service.sent()] == ["system", "user", "assistant", "tool"]
    assert service.sent()[1]["content"] == "Oslo?"


def test_streamed_tool_calls_arrive_as_deltas_once_checked(service: Service) -> None:
    service.endpoint.push(
        text(hermes_call("get_weather", city=5)),  # invalid: asked again, never streamed
        text(hermes_call("get_weather", city="Rome") + hermes_call("get_weather", city="Bern")),
    )
    chunks = list(
        service.sdk().chat.completions.create(
            model=MODEL, messages=[user("Rome and Bern?")], tools=[WEATHER], stream=True
        )
    )
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert [(d.index, d.function.name) for d in deltas if d.function] == [
        (0, "get_weather"),
        (1, "get_weather"),
    ]
    assert [json.loads(d.function.arguments or "") for d in deltas if d.function] == [
        {"city": "Rome"},
        {"city": "Bern"},
    ]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    retry = service.sent(1)[-1]
    assert retry["role"] == "tool" and "'city' must be a string" in retry["content"]


def test_invalid_calls_are_asked_again_within_the_bound(service: Service) -> None:
    service.endpoint.push(*[text(hermes_call("get_weather", town="x")) for _ in range(3)])
    with pytest.raises(openai.APIStatusError) as caught:
        service.sdk().chat.completions.create(
            model=MODEL, messages=[user("Weather?")], tools=[WEATHER]
        )
    assert caught.value.status_code == 502
    assert "no usable tool call in 3 turns" in caught.value.message
    assert len(service.endpoint.requests) == 3  # max_retries (2) re-asks, then it stops


def test_response_format_is_the_runs_output_schema(service: Service) -> None:
    client = service.sdk()
    service.endpoint.push(text("not json"), text('{"city": "Lima"}'))
    schema = {"name": "place", "schema": CITY}
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[user("Where?")],
        response_format={"type": "json_schema", "json_schema": schema},
    )
    assert json.loads(reply.choices[0].message.content or "") == {"city": "Lima"}
    assert "<schema>" in service.sent(0)[0]["content"]
    service.endpoint.push(text("[1, 2]"), text('{"ok": true}'))
    anything = client.chat.completions.create(
        model=MODEL, messages=[user("JSON")], response_format={"type": "json_object"}
    )
    assert json.loads(anything.choices[0].message.content or "") == {"ok": True}
    service.endpoint.push(*[text("nope") for _ in range(3)])
    with pytest.raises(openai.UnprocessableEntityError):
        client.chat.completions.create(
            model=MODEL, messages=[user("JSON")], response_format={"type": "json_object"}
        )


def test_the_operator_setting_decides_on_the_agents_own_tools() -> None:
    keys = MemoryKeyStore()
    with running_server() as endpoint:
        settings = ServiceSettings(auth="keys", openai_client_tools="with_agent_tools")
        app = create_app(agent=hermes_agent(endpoint), settings=settings, keys=keys)
        with serve(app) as url:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key=keys.create("a"), max_retries=0)
            endpoint.push(
                # one turn calls both: the client's call waits, the agent's own runs
                text(hermes_call("lookup", key="k") + hermes_call("get_weather", city="Kyiv")),
                text(hermes_call("get_weather", city="Kyiv")),
            )
            reply = client.chat.completions.create(
                model=MODEL, messages=[user("Kyiv?")], tools=[WEATHER]
            )
            assert reply.choices[0].finish_reason == "tool_calls"
            assert reply.hermes["tool_calls"][0]["result"] == "value of k"  # type: ignore[attr-defined]
            system = endpoint.requests[0]["messages"][0]["content"]
            assert '"name": "lookup"' in system and '"name": "get_weather"' in system
            refused = endpoint.requests[1]["messages"][-1]["content"]
            assert "the agent's own tools were called in the same turn" in refused
            clash = {"type": "function", "function": {"name": "lookup", "parameters": {}}}
            # The run layer's refusal, the same from every door (422).
            with pytest.raises(openai.UnprocessableEntityError, match="names of the agent's own"):
                client.chat.completions.create(model=MODEL, messages=[user("x")], tools=[clash])
    off = ServiceSettings(openai_client_tools="off")
    with pytest.raises(OpenAIError, match="openai_client_tools: off"):
        plan_tools(off, [object()], None, False, "tools")  # type: ignore[list-item]


# -- the Responses API ----------------------------------------------------------------------------


def test_responses_text_items_tools_and_chaining(service: Service) -> None:
    client = service.sdk()
    service.endpoint.push(text("Hi Ada."))
    first = client.responses.create(model=MODEL, input="I am Ada.")
    assert first.output_text == "Hi Ada." and first.status == "completed"
    assert first.usage is not None and first.usage.total_tokens == 18

    service.endpoint.push(text(hermes_call("get_weather", city="Nice")))
    asked = client.responses.create(
        model=MODEL,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]}],
        previous_response_id=first.id,
        tools=[RESPONSES_WEATHER],  # type: ignore[list-item]
    )
    (call,) = asked.output
    assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Nice"}

    service.endpoint.push(text("Sunny in Nice, Ada."))
    done = client.responses.create(
        model=MODEL,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        previous_response_id=asked.id,
        tools=[RESPONSES_WEATHER],  # type: ignore[list-item]
    )
    assert done.output_text == "Sunny in Nice, Ada."
    roles = [m["role"] for m in service.sent()]
    assert roles == ["system", "user", "assistant", "user", "assistant", "tool"]
    # A fork from the first response sees only that one.
    service.endpoint.push(text("forked"))
    client.responses.create(model=MODEL, input="Again?", previous_response_id=first.id)
    assert [m["role"] for m in service.sent()] == ["system", "user", "assistant", "user"]
    # Responses are kept per user: Bob cannot chain from Alice's.
    with pytest.raises(openai.NotFoundError, match="no response"):
        service.sdk(service.bob).responses.create(
            model=MODEL, input="x", previous_response_id=first.id
        )


def test_responses_stream_events(service: Service) -> None:
    service.endpoint.push(text("Bonjour!"))
    events = list(service.sdk().responses.create(model=MODEL, input="Salut", stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Bonjour!"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].response.output_text == "Bonjour!"  # type: ignore[union-attr]

    service.endpoint.push(text(hermes_call("get_weather", city="Bonn")))
    events = list(
        service.sdk().responses.create(
            model=MODEL,
            input="Bonn?",
            tools=[RESPONSES_WEATHER],
            stream=True,  # type: ignore[list-item]
        )
    )
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and json.loads(done[0].arguments) == {"city": "Bonn"}
    final = events[-1].response  # type: ignore[union-attr]
    assert [o.type for o in final.output] == ["function_call"]


@pytest.mark.parametrize(
    ("options", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0]"),
        ({"background": True}, "background"),
        ({"include": ["reasoning.encrypted_content"]}, "include"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
            "input[0].content[0]",
        ),
        ({"input": [{"type": "file_search_call"}]}, "input[0]"),
        ({"previous_response_id": "resp_nope"}, "previous_response_id"),
        ({"text": {"format": {"type": "yaml"}}}, "text.format"),
        ({"frobnicate": 1}, "frobnicate"),
    ],
)
def test_responses_refuse_what_they_do_not_serve(
    service: Service, options: dict[str, Any], param: str
) -> None:
    body = {"model": MODEL, "input": "hi", **options}
    reply = httpx.post(
        f"{service.url}/v1/responses",
        json=body,
        headers={"Authorization": f"Bearer {service.alice}"},
    )
    assert reply.status_code in (400, 404)
    error = reply.json()["error"]
    assert error["param"] == param and len(error["message"]) > 15
    assert service.endpoint.requests == []  # nothing reached the model


def test_an_unknown_path_names_the_endpoints(service: Service) -> None:
    reply = httpx.post(f"{service.url}/v1/embeddings", json={"input": "x"})
    assert reply.status_code == 404
    message = reply.json()["error"]["message"]
    for endpoint in ("POST /v1/chat/completions", "POST /v1/responses", "GET /v1/models"):
        assert endpoint in message
    wrong = httpx.get(f"{service.url}/v1/chat/completions")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"


@pytest.mark.embedded
def test_client_tools_with_the_embedded_model() -> None:
    pytest.importorskip("llama_cpp")
    add = {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
    with serve(create_app(settings=ServiceSettings(auth="none"))) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=300)
        reply = client.chat.completions.create(
            model=MODEL, messages=[user("Compute 2 + 2.")], tools=[add], tool_choice="required"
        )
    (call,) = reply.choices[0].message.tool_calls or []
    arguments = json.loads(call.function.arguments)
    assert call.function.name == "add" and set(arguments) == {"a", "b"}
    assert all(isinstance(v, int) for v in arguments.values())  # valid by construction


def test_a_run_the_facade_stopped_following_is_never_an_empty_finished_answer() -> None:
    """When the facade stops waiting on a run that neither ended nor waits for an approval
    (a queued run while the instance shuts down), the answer is a 503 naming the run."""
    from hermes_agent.runs.backend import RunView
    from hermes_agent.server.openai.runs import ending_error

    running = RunView(request_id="r1", session_id="s", status="running", source="queue")
    error = ending_error(running)
    assert error is not None and error.status_code == 503 and "GET /v1/runs/r1" in error.message
    waiting = RunView(
        request_id="r2", session_id="s", status="waiting_approval", source="queue",
        pending_approvals=[{"approval_id": "a"}],
    )  # fmt: skip
    assert ending_error(waiting) is None
    done = RunView(
        request_id="r3", session_id="s", status="completed", source="queue",
        result={"output": "hi", "loop_status": "completed", "status": 200},
    )  # fmt: skip
    assert ending_error(done) is None
