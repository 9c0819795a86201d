"""Tools: schemas from signatures and explicit parameters, validation messages, coercion."""

from __future__ import annotations

from enum import Enum
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from hermes_agent import Agent, ScriptedModel, Tool, ToolDefinitionError, tool
from hermes_agent.tools.registry import ToolRegistry


def get_weather(
    city: str, unit: Literal["celsius", "fahrenheit"] = "celsius", days: int = 1
) -> dict:
    """Get the weather forecast for a city.

    Args:
        city: City name, e.g. Beijing.
        unit: Temperature unit.
        days: How many days to forecast.
    """
    return {"city": city, "unit": unit, "days": days}


def test_schema_from_type_hints_and_docstring_is_strict() -> None:
    weather = Tool.from_function(get_weather)
    assert weather.name == "get_weather"
    assert weather.description == "Get the weather forecast for a city."
    assert weather.parameters == {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "City name, e.g. Beijing."},
            "unit": {
                "enum": ["celsius", "fahrenheit"],
                "type": "string",
                "default": "celsius",
                "description": "Temperature unit.",
            },
            "days": {"type": "integer", "default": 1, "description": "How many days to forecast."},
        },
        "required": ["city"],
        "additionalProperties": False,
    }


class Color(Enum):
    RED = "red"
    BLUE = "blue"


class Address(BaseModel):
    street: str
    zip_code: str | None = None


def paint(color: Color, address: Address, coats: list[int] | None = None) -> str:
    """Paint a house."""
    return f"{color} {address} {coats}"


def test_nested_models_and_enums_are_inlined_without_refs() -> None:
    schema = Tool.from_function(paint).parameters
    assert "$defs" not in str(schema) and "$ref" not in str(schema)
    assert schema["properties"]["color"]["enum"] == ["red", "blue"]
    address = schema["properties"]["address"]
    assert address["properties"]["street"] == {"type": "string"}
    assert address["required"] == ["street"]
    assert schema["required"] == ["color", "address"]


def test_the_schema_of_a_model_and_the_value_the_function_gets_agree() -> None:
    painted = Tool.from_function(paint)
    arguments = {"color": "blue", "address": {"street": "Main St 1"}, "coats": [2]}
    assert painted.validate(arguments) == (arguments, [])
    converted, problems = painted.convert(arguments)
    assert problems == []
    assert converted == {"color": Color.BLUE, "address": Address(street="Main St 1"), "coats": [2]}
    assert arguments["address"] == {"street": "Main St 1"}  # the JSON itself is left as it was


class Opaque:
    """A type pydantic cannot build a schema or a validator for."""


def test_a_hand_written_schema_still_gets_models_converted_and_opaque_types_passed_as_json() -> (
    None
):
    def ship(address: Address, extra: Opaque) -> str:
        return "shipped"

    shipping = Tool.from_function(
        ship,
        description="Ship a parcel",
        parameters={"address": {"type": "object"}, "extra": {"type": "object"}},
    )
    converted, problems = shipping.convert({"address": {"street": "a"}, "extra": {"k": 1}})
    assert problems == []
    assert converted == {"address": Address(street="a"), "extra": {"k": 1}}
    converted, problems = shipping.convert({"address": {"zip_code": "1"}, "extra": {}})
    assert problems == ["'address.street': Field required"]


def test_shorthand_parameters_mapping_required_unless_default() -> None:
    agent = Agent(model=ScriptedModel([]))

    @agent.register_tool(
        name="get_weather",
        description="Get the current weather for a city",
        parameters={
            "city": {"type": "string", "description": "City name, e.g. Beijing"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
        },
    )
    def weather(city: str, unit: str = "celsius") -> dict:
        return {"city": city}

    registered = agent.registry.get("get_weather")
    assert registered is not None
    assert registered.description == "Get the current weather for a city"
    assert registered.parameters["required"] == ["city"]
    assert registered.parameters["additionalProperties"] is False
    # The decorator hands back the function itself, still callable.
    assert weather("Paris") == {"city": "Paris"}


def test_full_json_schema_parameters_are_accepted() -> None:
    schema = {
        "type": "object",
        "properties": {"q": {"type": "string"}},
        "required": ["q"],
    }
    search = Tool.from_function(lambda q: q, name="search", description="d", parameters=schema)
    assert search.parameters["required"] == ["q"]
    assert search.parameters["additionalProperties"] is False


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({}, ["missing required argument 'city'"]),
        ({"city": "Paris", "extra": 1}, ["unknown argument 'extra' (allowed: city, days, unit)"]),
        ({"city": "Paris", "unit": "kelvin"}, ["'unit' must be one of: celsius, fahrenheit"]),
        ({"city": 3}, ["'city' must be a string, got 3"]),
        ({"city": "Paris", "days": "many"}, ["'days' must be an integer, got \"many\""]),
    ],
    ids=["missing", "unknown", "enum", "type", "uncoercible"],
)
def test_validation_errors_say_what_to_fix(arguments: dict, expected: list[str]) -> None:
    _, errors = Tool.from_function(get_weather).validate(arguments)
    assert errors == expected


def test_obvious_coercion_only_where_type_hints_allow() -> None:
    weather = Tool.from_function(get_weather)
    arguments, errors = weather.validate({"city": "Paris", "days": "5"})
    assert errors == [] and arguments == {"city": "Paris", "days": 5}

    untyped = Tool.from_function(
        lambda days: days,
        name="untyped",
        description="",
        parameters={"days": {"type": "integer"}},
    )
    _, errors = untyped.validate({"days": "5"})
    assert errors == ["'days' must be an integer, got \"5\""]


def test_bad_tool_definitions_are_clear_errors() -> None:
    with pytest.raises(ToolDefinitionError, match="invalid tool name"):
        Tool.from_function(get_weather, name="bad name!")
    with pytest.raises(ToolDefinitionError, match="must map to a JSON Schema dict"):
        Tool.from_function(get_weather, parameters={"city": "string"})
    with pytest.raises(ToolDefinitionError, match="invalid parameters schema"):
        Tool.from_function(
            get_weather, parameters={"type": "object", "properties": {"a": {"type": "nope"}}}
        )
    registry = ToolRegistry()
    registry.add(Tool.from_function(get_weather))
    with pytest.raises(ToolDefinitionError, match="already registered"):
        registry.add(Tool.from_function(get_weather))


def test_module_level_tool_decorator_and_toolsets() -> None:
    @tool(toolset="finance")
    def quote(symbol: str) -> float:
        """Latest price of a stock."""
        return 1.0

    assert isinstance(quote, Tool)
    assert quote("X") == 1.0
    agent = Agent(model=ScriptedModel([]), tools=[quote, get_weather])
    assert agent.registry.toolsets() == {"finance": ["quote"], "default": ["get_weather"]}
    assert [t.name for t in agent.registry.visible(["finance"])] == ["quote"]


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["city", "unit", "days", "extra"]),
        st.one_of(
            st.integers(),
            st.floats(allow_nan=False),
            st.text(max_size=5),
            st.booleans(),
            st.none(),
            st.sampled_from(["celsius", "fahrenheit"]),
            st.lists(st.integers(), max_size=2),
        ),
    )
)
def test_fast_check_agrees_with_jsonschema(arguments: dict) -> None:
    from hermes_agent.tools.validation import argument_errors

    weather = Tool.from_function(get_weather)
    assert weather._fast_check is not None
    try:
        weather._fast_check(arguments)
        fast_ok = True
    except Exception:
        fast_ok = False
    assert fast_ok == (argument_errors(weather._validator, arguments) == [])
