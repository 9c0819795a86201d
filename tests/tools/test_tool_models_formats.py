"""Tools declared the way the Hermes function-calling examples write them: a pydantic model as
``parameters=``, a function whose one parameter ``schema`` is the model, and JSON Schema
formats (date-time, date, email, uri) checked in the arguments."""

from __future__ import annotations

import datetime as dt
import warnings
from typing import Any

import pytest
from pydantic import BaseModel, Field

from hermes_agent import Agent, ScriptedModel, tool
from hermes_agent.errors import ToolDefinitionError
from hermes_agent.tools.validation import is_date, is_date_time, is_email, is_uri


class StockRequest(BaseModel):
    symbol: str = Field(..., description="Stock symbol, e.g. 'TSLA'")
    include_history: bool = Field(default=False, description="Include historical data")


class WeatherRequest(BaseModel):
    city: str
    unit: str = "celsius"


def _call(name: str, arguments: str) -> ScriptedModel:
    return ScriptedModel(
        [f'<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>', "done"]
    )


def test_a_function_taking_schema_gets_the_models_fields_flat_and_an_instance() -> None:
    seen: list[StockRequest] = []

    def get_stock_fundamentals(schema: StockRequest) -> dict[str, Any]:
        """Get fundamental data for a stock symbol."""
        seen.append(schema)
        return {"symbol": schema.symbol}

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # pydantic's "shadows an attribute" warning is gone too
        made = tool(get_stock_fundamentals)
    assert made.parameters == {
        "type": "object",
        "properties": {
            "symbol": {"description": "Stock symbol, e.g. 'TSLA'", "type": "string"},
            "include_history": {
                "default": False,
                "description": "Include historical data",
                "type": "boolean",
            },
        },
        "required": ["symbol"],
        "additionalProperties": False,
    }
    agent = Agent(_call("get_stock_fundamentals", '{"symbol": "TSLA"}'), tools=[made])
    result = agent.run("TSLA fundamentals")
    assert result.tool_calls[0].status_code == 200, result.tool_calls[0].error
    assert seen == [StockRequest(symbol="TSLA", include_history=False)]


def test_a_schema_parameter_that_is_not_a_model_stays_a_parameter() -> None:
    def lookup(schema: str) -> str:
        """Look a schema name up."""
        return schema

    assert list(tool(lookup).parameters["properties"]) == ["schema"]


def test_register_tool_takes_a_pydantic_model_as_parameters() -> None:
    agent = Agent(_call("get_weather", '{"city": "北京", "unit": "fahrenheit"}'))

    @agent.register_tool(name="get_weather", description="Weather now", parameters=WeatherRequest)
    def get_weather(city: str, unit: str = "celsius") -> str:
        return f"{city}/{unit}"

    spec = agent.tools[0].parameters
    assert spec["required"] == ["city"] and spec["additionalProperties"] is False
    result = agent.run("北京天气")
    assert result.tool_calls[0].result == "北京/fahrenheit"


def test_a_function_taking_the_given_model_gets_an_instance_and_extras_are_refused() -> None:
    agent = Agent(_call("weather", '{"city": "上海", "invented": 1}'))
    got: list[WeatherRequest] = []

    @agent.register_tool(name="weather", description="Weather", parameters=WeatherRequest)
    def weather(request: WeatherRequest) -> str:
        got.append(request)
        return request.city

    result = agent.run("上海天气")
    call = result.tool_calls[0]
    assert call.status_code == 400 and "unknown argument 'invented'" in (call.error or "")
    assert got == []  # the model ignores extra fields; the tool's strict schema does not
    made = agent.tools[0]
    arguments, problems = made.validate({"city": "上海"})
    assert problems == []
    assert made.convert(arguments) == ({"request": WeatherRequest(city="上海")}, [])


def test_parameters_of_another_kind_is_a_clear_error() -> None:
    agent = Agent(ScriptedModel(["ok"]))
    with pytest.raises(ToolDefinitionError, match="JSON Schema dict or a pydantic model"):
        agent.register_tool(name="bad", parameters=["city"])(lambda city: city)  # type: ignore[arg-type]


FORMATS = {
    "when": {"type": "string", "format": "date-time"},
    "day": {"type": "string", "format": "date"},
    "mail": {"type": "string", "format": "email"},
    "link": {"type": "string", "format": "uri"},
}


def _book(when: str, day: str, mail: str, link: str) -> str:
    return "booked"


def test_formats_are_checked_in_the_arguments_and_named_in_the_errors() -> None:
    booked = tool(_book, name="book", parameters=FORMATS)
    good = {
        "when": "2024-06-15T15:20:00+08:00",
        "day": "2024-06-15",
        "mail": "li.ming@example.com",
        "link": "https://example.com/flights?d=PVG",
    }
    assert booked.validate(good) == (good, [])
    _, errors = booked.validate(
        {"when": "tomorrow 3pm", "day": "2024-02-30", "mail": "li.ming", "link": "not a uri"}
    )
    assert len(errors) == 4
    assert any(e.startswith("'when' must be a date and time in ISO 8601") for e in errors)
    assert any(e.startswith("'day' must be a date") for e in errors)
    assert any(e.startswith("'mail' must be an email address") for e in errors)
    assert any(e.startswith("'link' must be an absolute URI") for e in errors)


def test_a_bad_format_reaches_the_model_as_a_400() -> None:
    booked = tool(_book, name="book", parameters=FORMATS)
    arguments = (
        '{"when": "15/06/2024", "day": "2024-06-15", "mail": "a@b.cn", "link": "https://a.cn"}'
    )
    result = Agent(_call("book", arguments), tools=[booked]).run("book it")
    assert result.tool_calls[0].status_code == 400
    assert "'when' must be a date and time" in (result.tool_calls[0].error or "")


@pytest.mark.parametrize(
    ("check", "value", "ok"),
    [
        (is_date_time, "2024-06-15T15:20:00Z", True),
        (is_date_time, "2024-06-15 15:20", True),  # naive, as Python's datetime takes it
        (is_date_time, "2024-06-15T15:20:00.123456-05:00", True),
        (is_date_time, "2024-06-15", False),
        (is_date_time, "2024-06-15T25:00:00", False),
        (is_date, "2024-02-29", True),
        (is_date, "2023-02-29", False),
        (is_date, "20240615", False),
        (is_email, "用户@例子.中国", True),
        (is_email, "a@b", False),
        (is_email, "a b@c.cn", False),
        (is_uri, "mailto:a@b.cn", True),
        (is_uri, "/relative/path", False),
    ],
)
def test_each_format_check(check: Any, value: str, ok: bool) -> None:
    assert check(value) is ok


def test_a_datetime_parameter_still_takes_a_naive_time() -> None:
    got: list[dt.datetime] = []

    @tool
    def remind(at: dt.datetime) -> str:
        """Remind me."""
        got.append(at)
        return "ok"

    assert remind.parameters["properties"]["at"]["format"] == "date-time"
    Agent(_call("remind", '{"at": "2025-03-01T09:30:00"}'), tools=[remind]).run("remind")
    assert got == [dt.datetime(2025, 3, 1, 9, 30)]
