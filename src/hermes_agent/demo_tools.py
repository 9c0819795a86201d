"""The built-in demo tools the CLI offers: a safe calculator, the date and time, unit conversion.

The calculator walks the expression's syntax tree (``ast``) and evaluates only numbers and
arithmetic operators — never ``eval`` — with bounds on exponents and sizes so that a model (or a
user) cannot make it run forever.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from hermes_agent.tools.registry import Tool

__all__ = ["calculator", "convert_units", "current_datetime", "demo_tools"]

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sqrt": math.sqrt,
    "abs": abs,
    "round": round,
    "log": math.log,
    "log10": math.log10,
    "exp": math.exp,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "floor": math.floor,
    "ceil": math.ceil,
}
_CONSTANTS = {"pi": math.pi, "e": math.e}
_MAX_EXPONENT = 1000
_MAX_MAGNITUDE = 10**100
_MAX_EXPRESSION_CHARS = 500


def calculator(expression: str) -> int | float:
    """Evaluate an arithmetic expression, e.g. "17 * 23" or "sqrt(2) / 3".

    Args:
        expression: Arithmetic with numbers, + - * / // % **, parentheses, pi, e and the
            functions sqrt, abs, round, log, log10, exp, sin, cos, tan, floor, ceil.
    """
    if len(expression) > _MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {_MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip().replace("^", "**"), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from exc
    value = _evaluate(tree.body)
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value  # type: ignore[no-any-return]


def _evaluate(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.Name) and node.id in _CONSTANTS:
        return _CONSTANTS[node.id]
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise ValueError(f"exponent {right} is too large (limit {_MAX_EXPONENT})")
        result = _BINARY[type(node.op)](left, right)
        if isinstance(result, int) and abs(result) > _MAX_MAGNITUDE:
            raise ValueError("result is too large")
        return result
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCTIONS
        and not node.keywords
    ):
        return _FUNCTIONS[node.func.id](*(_evaluate(arg) for arg in node.args))
    raise ValueError(f"unsupported element in expression: {ast.dump(node)[:60]}")


def current_datetime(timezone: str = "UTC") -> str:
    """The current date and time in a timezone, in ISO 8601 format.

    Args:
        timezone: An IANA timezone name such as "UTC", "Europe/Paris" or "Asia/Tokyo".
    """
    try:
        zone = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(
            f"unknown timezone {timezone!r}; use an IANA name like 'Europe/Paris'"
        ) from exc
    return datetime.now(zone).isoformat(timespec="seconds")


# Each unit: (dimension, factor to the dimension's base unit). Temperature is affine and handled
# on its own.
_UNITS: dict[str, tuple[str, float]] = {
    "mm": ("length", 0.001),
    "cm": ("length", 0.01),
    "m": ("length", 1.0),
    "km": ("length", 1000.0),
    "in": ("length", 0.0254),
    "ft": ("length", 0.3048),
    "yd": ("length", 0.9144),
    "mi": ("length", 1609.344),
    "mg": ("mass", 1e-6),
    "g": ("mass", 0.001),
    "kg": ("mass", 1.0),
    "t": ("mass", 1000.0),
    "oz": ("mass", 0.028349523125),
    "lb": ("mass", 0.45359237),
    "s": ("time", 1.0),
    "min": ("time", 60.0),
    "h": ("time", 3600.0),
    "day": ("time", 86400.0),
    "ml": ("volume", 0.001),
    "l": ("volume", 1.0),
    "gal": ("volume", 3.785411784),
}
_TEMPERATURES = {"c", "f", "k"}


def convert_units(value: float, from_unit: str, to_unit: str) -> dict[str, Any]:
    """Convert a value between units of length, mass, time, volume or temperature.

    Args:
        value: The number to convert.
        from_unit: The unit of value, e.g. "km", "lb", "h", "l" or "c" (Celsius).
        to_unit: The unit to convert to, of the same kind, e.g. "mi", "kg", "min", "gal", "f".
    """
    source, target = from_unit.strip().lower(), to_unit.strip().lower()
    if source in _TEMPERATURES and target in _TEMPERATURES:
        kelvin = {"c": value + 273.15, "f": (value - 32) * 5 / 9 + 273.15, "k": value}[source]
        result = {"c": kelvin - 273.15, "f": (kelvin - 273.15) * 9 / 5 + 32, "k": kelvin}[target]
    else:
        known = ", ".join([*_UNITS, *sorted(_TEMPERATURES)])
        for unit in (source, target):
            if unit not in _UNITS:
                raise ValueError(f"unknown unit {unit!r}; known units: {known}")
        (kind_from, factor_from), (kind_to, factor_to) = _UNITS[source], _UNITS[target]
        if kind_from != kind_to:
            raise ValueError(f"cannot convert {kind_from} ({source}) to {kind_to} ({target})")
        result = value * factor_from / factor_to
    return {"value": round(result, 6), "unit": target, "from": f"{value:g} {source}"}


def demo_tools() -> list[Tool]:
    """Fresh ``Tool`` objects for the three demo tools."""
    return [
        Tool.from_function(calculator, toolset="demo"),
        Tool.from_function(current_datetime, toolset="demo"),
        Tool.from_function(convert_units, toolset="demo"),
    ]
