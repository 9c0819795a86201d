"""Tools for the example regression suite (examples/eval_cases.yaml)."""

from __future__ import annotations

from typing import Any, Literal

from hermes_agent import tool


@tool
def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> dict[str, Any]:
    """Get the current weather for a city.

    Args:
        city: City name, e.g. Paris.
        unit: Temperature unit.
    """
    temperature = 23 if unit == "celsius" else 73
    return {"city": city, "temperature": temperature, "unit": unit}


@tool
def convert_currency(amount: float, from_currency: str, to_currency: str) -> dict[str, Any]:
    """Convert an amount of money between two currencies.

    Args:
        amount: How much money.
        from_currency: ISO code of the currency to convert from, e.g. USD.
        to_currency: ISO code of the currency to convert to, e.g. EUR.
    """
    return {"amount": round(amount * 0.92, 2), "currency": to_currency}
