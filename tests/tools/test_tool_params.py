"""Structured tool parameters: a pydantic model or a dataclass annotation gets an instance.

The schema comes from the class; the JSON the model wrote is checked against it first (400 with
the schema's errors), then pydantic builds the objects (400 with a validator's message), in
every execution mode — in the worker process for subprocess tools.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import os
from enum import Enum
from typing import Annotated, Any, Literal, NewType, TypedDict

import pytest
from pydantic import BaseModel, ConfigDict, Field, field_validator

from hermes_agent import Agent, ScriptedModel, Tool, tool
from hermes_agent.pipeline.context import RunContext
from hermes_agent.testing import tool_call as call
from hermes_agent.tools import schema
from hermes_agent.tools.schema import needs_conversion


class Point(BaseModel):
    x: int
    y: int = 0

    @field_validator("x")
    @classmethod
    def not_negative(cls, value: int) -> int:
        if value < 0:
            raise ValueError("x must not be negative")
        return value


@dataclasses.dataclass
class Size:
    width: float
    height: float


class Shape(BaseModel):
    """A pydantic model holding a dataclass."""

    origin: Point
    size: Size


@dataclasses.dataclass
class Scene:
    """A dataclass holding pydantic models."""

    shapes: list[Shape]
    label: str = ""


class Color(Enum):
    RED = "red"
    BLUE = "blue"


def describe(value: Any) -> Any:
    """What a tool received, as JSON a test can compare (types by name)."""
    if isinstance(value, BaseModel) or dataclasses.is_dataclass(value):
        fields = value.model_dump() if isinstance(value, BaseModel) else vars(value)
        return {"type": type(value).__name__, **{k: describe(getattr(value, k)) for k in fields}}
    if isinstance(value, list):
        return [describe(item) for item in value]
    if isinstance(value, dict):
        return {key: describe(item) for key, item in value.items()}
    return value


def run_one(tool_: Tool, **arguments: object) -> Any:
    agent = Agent(model=ScriptedModel([call(tool_.name, **arguments), "done"]), tools=[tool_])
    try:
        return agent.run("go").tool_calls[0]
    finally:
        agent.close()


def scene_of(scene: Scene) -> dict[str, Any]:
    """The scene as received, and the process it was received in."""
    return {"scene": describe(scene), "pid": os.getpid()}


SCENE = {
    "shapes": [
        {"origin": {"x": 1, "y": 2}, "size": {"width": 3, "height": 4}},
        {"origin": {"x": 5}, "size": {"width": 1.5, "height": 2}},
    ],
    "label": "two",
}
SCENE_RECEIVED = {
    "type": "Scene",
    "label": "two",
    "shapes": [
        {
            "type": "Shape",
            "origin": {"type": "Point", "x": 1, "y": 2},
            "size": {"type": "Size", "width": 3, "height": 4},
        },
        {
            "type": "Shape",
            "origin": {"type": "Point", "x": 5, "y": 0},
            "size": {"type": "Size", "width": 1.5, "height": 2},
        },
    ],
}


@pytest.mark.parametrize("mode", ["in_process", "inline", "subprocess"])
def test_a_dataclass_of_models_of_dataclasses_arrives_as_instances_in_every_mode(
    mode: str,
) -> None:
    record = run_one(Tool.from_function(scene_of, execution_mode=mode), scene=SCENE)
    assert record.status_code == 200, record.error
    assert record.result["scene"] == SCENE_RECEIVED
    assert (record.result["pid"] != os.getpid()) == (mode == "subprocess")
    assert record.arguments == {"scene": SCENE}  # the record keeps the JSON the model wrote


def test_an_async_tool_gets_instances_too() -> None:
    async def shift(point: Point, by: int) -> dict[str, Any]:
        """Shift a point."""
        await asyncio.sleep(0)  # an await: the tool is truly async
        return describe(point.model_copy(update={"x": point.x + by}))

    record = run_one(Tool.from_function(shift), point={"x": 1, "y": 2}, by=3)
    assert record.result == {"type": "Point", "x": 4, "y": 2}


def test_lists_optionals_and_dicts_of_models() -> None:
    seen: dict[str, Any] = {}

    @tool
    def gather(
        points: list[Point],
        named: dict[str, Point],
        maybe: Point | None = None,
        sizes: tuple[Size, ...] = (),
    ) -> str:
        """Gather points."""
        seen.update(points=points, named=named, maybe=maybe, sizes=sizes)
        return "ok"

    record = run_one(
        gather,
        points=[{"x": 1}, {"x": 2, "y": 3}],
        named={"a": {"x": 7}},
        maybe=None,
        sizes=[{"width": 1, "height": 2}],
    )
    assert record.status_code == 200, record.error
    assert seen["points"] == [Point(x=1), Point(x=2, y=3)]
    assert seen["named"] == {"a": Point(x=7)}
    assert seen["maybe"] is None
    assert seen["sizes"] == (Size(1, 2),)

    run_one(gather, points=[], named={}, maybe={"x": 9})
    assert seen["maybe"] == Point(x=9)


def test_json_only_types_become_what_the_annotation_says() -> None:
    seen: dict[str, Any] = {}

    @tool
    def book(when: dt.datetime, color: Color, corner: tuple[int, int], tags: set[str]) -> str:
        """Book a slot."""
        seen.update(when=when, color=color, corner=corner, tags=tags)
        return "booked"

    record = run_one(
        book, when="2025-03-01T09:30:00", color="blue", corner=[1, 2], tags=["a", "a", "b"]
    )
    assert record.status_code == 200, record.error
    assert seen == {
        "when": dt.datetime(2025, 3, 1, 9, 30),
        "color": Color.BLUE,
        "corner": (1, 2),
        "tags": {"a", "b"},
    }


class Slot(BaseModel):
    model_config = ConfigDict(strict=True)
    start: dt.date
    span: tuple[int, int]


def test_a_strict_model_accepts_what_its_json_form_allows() -> None:
    def take(slot: Slot) -> str:
        """Take a slot."""
        return f"{slot.start.isoformat()} {slot.span}"

    record = run_one(Tool.from_function(take), slot={"start": "2025-01-02", "span": [1, 2]})
    assert (record.status_code, record.result) == (200, "2025-01-02 (1, 2)")


# -- what is checked, and when --------------------------------------------------------------


def test_schema_errors_come_first_and_name_the_nested_argument() -> None:
    ran: list[Point] = []

    @tool
    def plot(point: Point) -> str:
        """Plot a point."""
        ran.append(point)
        return "plotted"

    record = run_one(plot, point={"y": "high"})
    assert ran == []
    assert record.status_code == 400
    assert record.error == (
        "invalid arguments: missing required argument 'point.x'; 'point.y' must be an integer, "
        'got "high". Call the tool again with fixed arguments.'
    )


@pytest.mark.parametrize("mode", ["in_process", "subprocess"])
def test_a_validator_refusing_a_value_is_a_400_with_its_message(mode: str) -> None:
    ran: list[Any] = []

    def plot(points: list[Point]) -> str:
        """Plot points."""
        ran.append(points)
        return "plotted"

    agent = Agent(
        model=ScriptedModel(
            [
                call("plot", points=[{"x": 1}, {"x": -4}]),
                call("plot", points=[{"x": 1}, {"x": 4}]),
                "done",
            ]
        ),
        tools=[Tool.from_function(plot, execution_mode=mode, rate_limit=1)],
    )
    result = agent.run("plot")
    agent.close()
    refused, plotted = result.tool_calls
    assert refused.status_code == 400
    assert refused.error == (
        "invalid arguments: 'points.1.x': Value error, x must not be negative. "
        "Call the tool again with fixed arguments."
    )
    assert refused.result is None
    # The refused call never ran, so it did not use up the rate limit of 1 call per minute.
    assert (plotted.status_code, plotted.result) == (200, "plotted")
    if mode == "in_process":
        assert ran == [[Point(x=1), Point(x=4)]]


def test_arguments_a_hook_changed_are_converted_as_changed() -> None:
    seen: list[Point] = []

    @tool
    def plot(point: Point) -> str:
        """Plot a point."""
        seen.append(point)
        return "plotted"

    def move(ctx: RunContext) -> None:
        for plan in ctx.planned:
            plan.arguments = {"point": {"x": 42}}

    agent = Agent(model=ScriptedModel([call("plot", point={"x": 1}), "done"]), tools=[plot])
    agent.add_hook("pre_execution", move)
    assert agent.run("go").tool_calls[0].status_code == 200
    assert seen == [Point(x=42)]


def test_a_decorated_tool_called_directly_is_the_plain_function() -> None:
    @tool
    def norm(point: Point) -> int:
        """Manhattan norm."""
        return point.x + point.y

    assert norm(Point(x=2, y=3)) == 5


# -- cost ------------------------------------------------------------------------------------


def test_adapters_are_built_on_the_first_call_once_and_only_where_needed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[Any] = []
    real = schema.TypeAdapter

    def counting(annotation: Any) -> Any:
        built.append(annotation)
        return real(annotation)

    monkeypatch.setattr(schema, "TypeAdapter", counting)

    def place(point: Point, label: str, tags: list[str], when: dt.date | None = None) -> str:
        """Place a point."""
        return label

    placed = Tool.from_function(place)
    assert built == []  # defining a tool builds nothing
    arguments = {"point": {"x": 1}, "label": "a", "tags": ["t"]}
    converted, problems = placed.convert(arguments)
    assert problems == [] and converted["point"] == Point(x=1)
    assert converted["tags"] is arguments["tags"]  # plain JSON is passed through untouched
    assert built == [Point, dt.date | None]
    placed.convert(arguments)
    assert len(built) == 2  # built once per tool


def test_a_plain_json_tool_pays_nothing() -> None:
    def add(a: int, b: float, opts: dict[str, list[int]], mode: Literal["x", "y"] = "x") -> float:
        """Add."""
        return a + b

    arguments = {"a": 1, "b": 2, "opts": {"k": [1]}}
    converted, problems = Tool.from_function(add).convert(arguments)
    assert converted is arguments and problems == []
    assert Tool.from_function(add).json_function() is add


class Plain(TypedDict):
    name: str
    sizes: list[int]


class WithModel(TypedDict):
    point: Point


UserId = NewType("UserId", str)


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        (str, False),
        (int, False),
        (float, False),
        (bool, False),
        (Any, False),
        (dict, False),
        (list[int], False),
        (dict[str, list[str | None]], False),
        (int | None, False),
        (Literal["a", "b"], False),
        (Annotated[int, Field(gt=0)], False),
        (Annotated[list[str], {"unhashable": "metadata"}], False),
        (Plain, False),
        (UserId, False),
        (Point, True),
        (Size, True),
        (list[Point], True),
        (Point | None, True),
        (dict[str, Size], True),
        (Annotated[Point, Field(description="p")], True),
        (WithModel, True),
        (tuple[int, int], True),
        (set[str], True),
        (dt.datetime, True),
        (Color, True),
        (Literal[Color.RED], True),
    ],
)
def test_needs_conversion(annotation: Any, expected: bool) -> None:
    assert needs_conversion(annotation) is expected
