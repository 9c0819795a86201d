"""Defining the same tools again is cheap because what was derived from a function or a schema is
kept; these tests check that what is kept never leaks between tools or goes stale."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hermes_agent import Agent, ScriptedModel, Tool
from hermes_agent.errors import ToolDefinitionError

SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "limit": {"type": "integer", "minimum": 1}},
    "required": ["path"],
    "additionalProperties": False,
}


def forecast(city: str, days: int = 1) -> str:
    """Forecast for a city.

    Args:
        city: The city name.
        days: How many days ahead.
    """
    return f"{city}: sunny for {days} days"


def listing(**arguments: Any) -> Any:
    return arguments


def test_a_function_defined_twice_gives_equal_but_separate_schemas() -> None:
    first, second = Tool.from_function(forecast), Tool.from_function(forecast)
    assert first.parameters == second.parameters
    assert first.parameters["properties"]["city"]["description"] == "The city name."
    assert first.description == second.description == "Forecast for a city."
    first.parameters["properties"]["city"]["description"] = "changed by its owner"
    assert second.parameters["properties"]["city"]["description"] == "The city name."
    assert Tool.from_function(forecast).parameters["properties"]["city"]["description"] == (
        "The city name."
    )


def test_a_function_changed_after_a_definition_is_read_again() -> None:
    def probe(a: int) -> int:
        """First words."""
        return a

    assert Tool.from_function(probe).description == "First words."
    probe.__doc__ = """Second words.

    Args:
        a: Now described.
    """
    tool = Tool.from_function(probe)
    assert tool.description == "Second words."
    assert tool.parameters["properties"]["a"]["description"] == "Now described."
    probe.__annotations__["a"] = str
    assert Tool.from_function(probe).parameters["properties"]["a"]["type"] == "string"
    probe.__defaults__ = (5,)
    assert Tool.from_function(probe).parameters["required"] == []


def test_tools_sharing_a_schema_validate_alike_and_independently() -> None:
    parameters = json.loads(json.dumps(SCHEMA))
    one = Tool(name="ls_one", description="List.", parameters=parameters, function=listing)
    two = Tool(name="ls_two", description="List.", parameters=dict(SCHEMA), function=listing)
    for tool in (one, two):
        assert tool.validate({"path": "/tmp"}) == ({"path": "/tmp"}, [])
        _, errors = tool.validate({"path": "/tmp", "limit": 0})
        assert errors and "limit" in errors[0]
    # The owner of one schema changes it in place afterwards: the other tool is unaffected.
    parameters["properties"]["path"] = {"type": "integer"}
    assert two.validate({"path": "/tmp"}) == ({"path": "/tmp"}, [])
    # configure() is how a tool's definition changes; it reads the schema again.
    one.configure(timeout=1.0)
    assert one.validate({"path": "/tmp"})[1]


def test_an_invalid_schema_is_refused_every_time() -> None:
    bad = {"type": "object", "properties": {"x": {"type": "no-such-type"}}}
    for _ in range(2):
        with pytest.raises(ToolDefinitionError, match="invalid parameters schema"):
            Tool(name="bad", description="", parameters=bad, function=listing)


def test_a_schema_json_cannot_carry_still_works() -> None:
    odd = {
        "type": "object",
        "properties": {"x": {"type": "integer", "default": object()}},
        "additionalProperties": False,
    }
    tool = Tool(name="odd", description="", parameters=odd, function=listing)
    assert tool.validate({"x": 1})[1] == []
    assert tool.validate({"x": "one"})[1]


def test_bound_methods_are_read_each_time() -> None:
    class Counter:
        def add(self, a: int, b: int) -> int:
            """Add two integers."""
            return a + b

    counter = Counter()
    for _ in range(2):  # a new bound-method object at each access
        tool = Tool.from_function(counter.add)
        assert tool.parameters["required"] == ["a", "b"]
        assert tool.description == "Add two integers."


def test_agents_built_per_request_from_the_same_function_run() -> None:
    call = '<tool_call>\n{"name": "forecast", "arguments": {"city": "Oslo"}}\n</tool_call>'
    for days in (1, 2):
        agent = Agent(model=ScriptedModel([call, "Done."]), tools=[forecast])
        result = agent.run("Weather in Oslo?")
        assert result.status == 200, result.error
        assert [c.result for c in result.tool_calls] == [f"Oslo: sunny for {days} days"]
        forecast.__defaults__ = (days + 1,)  # changed between requests: read again
    assert Tool.from_function(forecast).parameters["properties"]["days"]["default"] == 3
    forecast.__defaults__ = (1,)


def test_each_distinct_schema_is_checked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from hermes_agent.tools import registry
    from hermes_agent.tools.validation import make_validator as original

    checked: list[Any] = []

    def counting(schema: dict[str, Any]) -> Any:
        checked.append(schema)
        return original(schema)

    monkeypatch.setattr(registry, "make_validator", counting)
    fresh = {**SCHEMA, "description": f"unique to {__name__}.{id(checked)}"}
    tools = [
        Tool(name=f"mcp_{i}", description="", parameters=dict(fresh), function=listing)
        for i in range(5)
    ]
    assert len(checked) == 1
    other = {**fresh, "required": []}
    Tool(name="mcp_other", description="", parameters=other, function=listing)
    assert len(checked) == 2
    assert all(t.validate({"path": "x"})[1] == [] for t in tools)


def test_a_function_is_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from hermes_agent.tools import schema

    built: list[Any] = []
    original = schema._arguments_model

    def counting(fn: Any) -> Any:
        built.append(fn)
        return original(fn)

    monkeypatch.setattr(schema, "_arguments_model", counting)

    def fresh(query: str, limit: int = 3) -> list[str]:
        """Search."""
        return []

    for _ in range(4):
        Tool.from_function(fresh)
        Agent(model=ScriptedModel(["ok"]), tools=[fresh])
    assert built == [fresh]
