"""Every bound a tool declares holds, and no NaN or infinite number reaches a tool.

A bound can be declared many ways: a pydantic ``Field`` as the default or inside ``Annotated``,
``annotated_types`` metadata, ``conint``/``confloat``, a pydantic model's fields, a JSON Schema
given by hand, an MCP server's ``inputSchema``. Each is tried here with values in range, out of
range, NaN, +Inf and -Inf, through the real checks (the tool's validator, its conversion, and
``Agent.run`` with a scripted model: the tool is provably not called), and through every way a
model writes arguments: JSON (whose Python reader takes ``NaN``, ``Infinity`` and ``1e999``),
a Python-style dict, Qwen XML, and native OpenAI ``tool_calls`` over real HTTP; then through the
service (a client's tool, in process and queued) and a real MCP server.

A non-finite number is refused where the call is read, so no call, record or JSON reply holds
one; the tool's validator refuses one that arrives any other way.
"""

from __future__ import annotations

import datetime as dt
import enum
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
from annotated_types import Ge, Interval, Le, Len, MultipleOf
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import AfterValidator, BaseModel, Field, confloat, conint, conlist, constr

from hermes_agent import Agent, OpenAICompatible, ScriptedModel, Tool
from hermes_agent.protocol.parser import StreamParser, parse_completion
from hermes_agent.testing import tool_call
from hermes_agent.tools.mcp.schemas import normalise
from openai_server import call, running_server, text, tool_calls

LOW, HIGH = 0, 100
NAN, INF = float("nan"), float("inf")

received: list[Any] = []
"""What the tools below were called with: a refused call leaves nothing here."""


def _took(value: Any) -> str:
    received.append(value)
    return "ok"


class Order(BaseModel):
    amount: float = Field(ge=LOW, le=HIGH)


def field_default(amount: float = Field(50, ge=LOW, le=HIGH)) -> str:
    """Pay an amount."""
    return _took(amount)


def annotated_field(amount: Annotated[float, Field(ge=LOW, le=HIGH)]) -> str:
    """Pay an amount."""
    return _took(amount)


def annotated_types_ge_le(amount: Annotated[float, Ge(LOW), Le(HIGH)]) -> str:
    """Pay an amount."""
    return _took(amount)


def annotated_interval(amount: Annotated[float, Interval(ge=LOW, le=HIGH)]) -> str:
    """Pay an amount."""
    return _took(amount)


def con_float(amount: confloat(ge=LOW, le=HIGH)) -> str:  # type: ignore[valid-type]
    """Pay an amount."""
    return _took(amount)


def con_int(amount: conint(ge=LOW, le=HIGH)) -> str:  # type: ignore[valid-type]
    """Pay a whole amount."""
    return _took(amount)


def model_argument(order: Order) -> str:
    """Pay an order."""
    return _took(order.amount)


def schema_argument(schema: Order) -> str:
    """Pay an order (the whole model as the arguments)."""
    return _took(schema.amount)


def plain(amount: float) -> str:
    """Pay an amount (the bounds come from the schema given with it)."""
    return _took(amount)


BOUNDED = {"type": "number", "minimum": LOW, "maximum": HIGH}
MCP_INPUT_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "title": "payArguments",
    "properties": {"amount": {**BOUNDED, "title": "Amount"}},
    "required": ["amount"],
}


@dataclass(frozen=True)
class Form:
    """One way to declare ``LOW <= amount <= HIGH``."""

    name: str
    tool: Tool
    nested: bool = False  # the amount sits in an ``order`` object
    integer: bool = False

    def arguments(self, value: float) -> dict[str, Any]:
        return {"order": {"amount": value}} if self.nested else {"amount": value}

    def sent(self, value: float) -> float:
        """The value as this form's model would write it (a whole number for an integer)."""
        return int(value) if self.integer and math.isfinite(value) else value


FORMS = [
    Form("Field default", Tool.from_function(field_default, name="pay")),
    Form("Annotated Field", Tool.from_function(annotated_field, name="pay")),
    Form("Annotated Ge/Le", Tool.from_function(annotated_types_ge_le, name="pay")),
    Form("Annotated Interval", Tool.from_function(annotated_interval, name="pay")),
    Form("confloat", Tool.from_function(con_float, name="pay")),
    Form("conint", Tool.from_function(con_int, name="pay"), integer=True),
    Form("model parameter", Tool.from_function(model_argument, name="pay"), nested=True),
    Form("schema: Model", Tool.from_function(schema_argument, name="pay")),
    Form("parameters=Model", Tool.from_function(plain, name="pay", parameters=Order)),
    Form(
        "JSON Schema",
        Tool.from_function(
            plain,
            name="pay",
            parameters={"type": "object", "properties": {"amount": BOUNDED}},
        ),
    ),
    Form(
        "JSON Schema shorthand",
        Tool.from_function(plain, name="pay", parameters={"amount": BOUNDED}),
    ),
    Form(
        "MCP inputSchema",
        Tool(
            name="pay",
            description="Pay an amount.",
            parameters=normalise(MCP_INPUT_SCHEMA)[0],
            function=plain,
        ),
    ),
    # A schema given by hand that forgets the hint's bound: pydantic still checks the hint.
    Form(
        "Annotated under a looser schema",
        Tool.from_function(annotated_field, name="pay", parameters={"amount": {"type": "number"}}),
    ),
]
FORM_IDS = [form.name for form in FORMS]


def in_range(value: float) -> bool:
    return math.isfinite(value) and LOW <= value <= HIGH


def through_the_checks(tool: Tool, arguments: dict[str, Any]) -> list[str]:
    """What the pipeline does with a call (validate, convert, call): the problems, or none
    and the tool ran."""
    checked, problems = tool.validate(arguments)
    if problems:
        return problems
    converted, problems = tool.convert(checked)
    if problems:
        return problems
    tool.function(**converted)
    return []


VALUES = st.one_of(
    st.floats(min_value=LOW, max_value=HIGH),
    st.floats(min_value=HIGH, exclude_min=True, allow_infinity=False),
    st.floats(max_value=LOW, exclude_max=True, allow_infinity=False),
    st.sampled_from([NAN, INF, -INF, HIGH + 1, LOW - 1, 1e9, -1e9]),
)


@settings(max_examples=400, deadline=None)
@given(form=st.sampled_from(FORMS), value=VALUES)
def test_for_any_declared_bound_and_any_value_the_bound_holds(form: Form, value: float) -> None:
    value = form.sent(value)
    received.clear()
    problems = through_the_checks(form.tool, form.arguments(value))
    if in_range(value):
        assert problems == []
        assert received == [value]
    else:
        assert problems, f"{form.name}: {value!r} was accepted"
        assert received == []


# (The last form's schema was given by hand without the bound.)
@pytest.mark.parametrize("form", FORMS[:-1], ids=FORM_IDS[:-1])
def test_every_form_puts_its_bound_in_the_schema_the_model_sees(form: Form) -> None:
    properties = form.tool.parameters["properties"]
    amount = properties["order"]["properties"]["amount"] if form.nested else properties["amount"]
    assert (amount["minimum"], amount["maximum"]) == (LOW, HIGH)
    assert amount["type"] == ("integer" if form.integer else "number")


def test_the_schema_keeps_its_shape() -> None:
    assert Tool.from_function(annotated_field).parameters == {
        "type": "object",
        "properties": {"amount": {"type": "number", "minimum": LOW, "maximum": HIGH}},
        "required": ["amount"],
        "additionalProperties": False,
    }
    assert Tool.from_function(field_default).parameters["properties"]["amount"] == {
        "type": "number",
        "minimum": LOW,
        "maximum": HIGH,
        "default": 50,
    }


CASES = {
    "in range": 42.5,
    "out of range": 5000.0,
    "below": -1e9,
    "NaN": NAN,
    "+Inf": INF,
    "-Inf": -INF,
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("form", FORMS, ids=FORM_IDS)
def test_a_refused_call_never_runs_and_the_model_reads_why(form: Form, case: str) -> None:
    value = form.sent(CASES[case])
    model = ScriptedModel([tool_call("pay", **form.arguments(value)), "done"])
    agent = Agent(model=model, tools=[form.tool])
    received.clear()
    [record] = agent.run("pay").tool_calls
    if case == "in range":
        assert (record.status_code, received) == (200, [value])
        return
    assert (record.status_code, received) == (400, [])
    [result] = model.requests[1].messages[-1].tool_results
    fed_back = result.content["error"]
    assert result.status_code == 400
    if math.isfinite(value):
        assert "amount" in fed_back
    else:  # refused where the call is read: no call, record or reply holds it
        assert "is not a finite number" in fed_back
        json.dumps(record.arguments, allow_nan=False)


# --- every way a model writes arguments -----------------------------------------------------

PAY = Tool.from_function(annotated_field, name="pay")


def _json(literal: str) -> str:
    return '<tool_call>\n{"name": "pay", "arguments": {"amount": ' + literal + "}}\n</tool_call>"


def _python(literal: str) -> str:
    return "<tool_call>\n{'name': 'pay', 'arguments': {'amount': " + literal + ",}}\n</tool_call>"


def _xml(literal: str) -> str:
    return (
        "<tool_call>\n<function=pay>\n<parameter=amount>\n"
        + literal
        + "\n</parameter>\n</function>\n</tool_call>"
    )


# (how the value is written, whether the call may run)
WRITTEN = [
    ("42.5", True),
    ("5000", False),
    ("-1e9", False),
    ("NaN", False),
    ("Infinity", False),
    ("-Infinity", False),
    ("1e999", False),  # Python's readers make this +Inf
    ("-1e999", False),
]


@pytest.mark.parametrize(("literal", "runs"), WRITTEN)
@pytest.mark.parametrize("written", [_json, _python, _xml], ids=["JSON", "Python dict", "XML"])
def test_every_text_format_is_held_to_the_bound(
    written: Callable[[str], str], literal: str, runs: bool
) -> None:
    model = ScriptedModel([written(literal), "done"])
    received.clear()
    [record] = Agent(model=model, tools=[PAY]).run("pay").tool_calls
    if runs:
        assert (record.status_code, received) == (200, [42.5])
    else:
        assert record.status_code == 400, (literal, record)
        assert received == []


def test_native_openai_tool_calls_are_held_to_the_bound() -> None:
    with running_server() as server:
        model = OpenAICompatible(
            "scripted-model", base_url=server.base_url, mode="native", max_retries=0
        )
        agent = Agent(model=model, tools=[PAY])
        for literal, runs in WRITTEN:
            server.push(tool_calls(call("pay", '{"amount": ' + literal + "}")), text("done"))
            received.clear()
            [record] = agent.run("pay").tool_calls
            assert record.status_code == (200 if runs else 400), (literal, record)
            assert received == ([42.5] if runs else [])
        # What went back to the model says why (the last call held -1e999).
        tool_turn = server.requests[-1]["messages"][-1]
        assert tool_turn["role"] == "tool"
        assert "-1e999 is not a finite number" in tool_turn["content"]


# --- where a call is read: no call ever holds NaN or Infinity --------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


def _finite_throughout(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_finite_throughout(item) for item in value)
    if isinstance(value, dict):
        return all(_finite_throughout(item) for item in value.values())
    return True


@settings(max_examples=300, deadline=None)
@given(
    arguments=st.dictionaries(st.text(max_size=5), JSON_VALUES, max_size=3), size=st.integers(1, 9)
)
def test_a_call_is_read_only_when_all_its_numbers_are_finite(
    arguments: dict[str, Any], size: int
) -> None:
    """Python's ``json.dumps`` writes NaN and Infinity as a model might; whole or streamed in
    chunks of any size, such a call is a parse error, and any other call is read as written."""
    written = tool_call("pay", **arguments)
    parser = StreamParser()
    for start in range(0, len(written), size):
        parser.feed(written[start : start + size])
    for completion in (parse_completion(written), parser.close()):
        if _finite_throughout(arguments):
            assert [c.arguments for c in completion.tool_calls] == [arguments]
        else:
            assert completion.tool_calls == []
            [error] = completion.errors
            assert "is not a finite number" in error.message


def test_the_services_replies_stay_json_when_a_model_writes_nan() -> None:
    """A real uvicorn: the run's JSON reply and its event stream parse with a strict JSON
    reader (JSON has no NaN), and the tool never ran."""
    import httpx

    from hermes_agent.server import ServiceSettings, create_app
    from server_harness import serve

    def strict(text: str) -> Any:
        return json.loads(text, parse_constant=lambda word: pytest.fail(f"{word} in the reply"))

    script = [_json("NaN"), "done", _python("-1e999"), "done"]
    agent = Agent(model=ScriptedModel(script), tools=[PAY])
    received.clear()
    with serve(create_app(agent=agent, settings=ServiceSettings(auth="none"))) as url:
        client = httpx.Client(base_url=url, timeout=30)
        reply = client.post("/v1/runs", json={"message": "pay"})
        assert reply.status_code == 200, reply.text
        [record] = strict(reply.text)["tool_calls"]
        assert record["status_code"] == 400 and "not a finite number" in record["error"]
        with client.stream("POST", "/v1/runs", json={"message": "pay", "stream": True}) as events:
            data = [line[6:] for line in events.iter_lines() if line.startswith("data: ")]
        assert data and all(strict(line) is not None for line in data)
    assert received == []


# --- non-finite anywhere, with or without a bound ---------------------------------------------


def unbounded(x: float, points: list[float] | None = None) -> str:
    """Take numbers without bounds."""
    return _took((x, points))


UNBOUNDED = Tool.from_function(unbounded)


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({"x": NAN}, "'x' must be a finite number, got NaN"),
        ({"x": INF}, "'x' must be a finite number, got Infinity"),
        ({"x": 1.0, "points": [2.0, -INF]}, "'points.1' must be a finite number, got -Infinity"),
        ({"x": "nan"}, "'x' must be a number"),  # lax coercion would make it a float NaN
        ({"x": "-inf"}, "'x' must be a number"),
    ],
)
def test_no_nan_or_infinity_passes_even_without_a_bound(
    arguments: dict[str, Any], problem: str
) -> None:
    _, problems = UNBOUNDED.validate(arguments)
    assert problems and problems[0].startswith(problem), problems
    assert UNBOUNDED.validate({"x": "2.5"}) == ({"x": 2.5}, [])  # coercion still works


def test_a_nan_nested_deeper_than_the_decoders_allow_is_found() -> None:
    """Arguments a ``pre_execution`` hook changed are checked by the same ``validate``, and a
    hook is not held to the decoders' nesting limit: the walk has its own stack."""
    nested: Any = [NAN]
    for _ in range(5000):
        nested = [nested]
    assert UNBOUNDED.validate({"x": 1.0, "points": nested})[1]


# --- the other constraints pydantic knows arrive too ------------------------------------------


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


def _positive(value: float) -> float:
    if value <= 0:
        raise ValueError("must be positive")
    return value


OTHER = [
    ("str max_length", Annotated[str, Field(max_length=3)], "abc", "abcd"),
    ("constr pattern", constr(pattern=r"^[a-z]+$"), "abc", "ABC"),
    ("str Len", Annotated[str, Len(2, 4)], "ab", "a"),
    ("list min/max_length", Annotated[list[int], Field(min_length=1, max_length=2)], [1], []),
    ("conlist", conlist(int, max_length=2), [1, 2], [1, 2, 3]),
    ("MultipleOf", Annotated[int, MultipleOf(5)], 10, 7),
    ("float gt/lt", Annotated[float, Field(gt=0, lt=1)], 0.5, 1),
    ("list item Ge", list[Annotated[int, Ge(0)]], [0, 1], [1, -1]),
    ("dict value Le", dict[str, Annotated[int, Le(3)]], {"a": 3}, {"a": 4}),
    ("Literal", Literal["a", "b"], "a", "c"),
    ("Enum", Colour, "red", "green"),
    ("date ge", Annotated[dt.date, Field(ge=dt.date(2020, 1, 1))], "2021-05-01", "2019-12-31"),
    ("AfterValidator", Annotated[float, AfterValidator(_positive)], 1.5, -1.5),
]


@pytest.mark.parametrize(("form", "annotation", "good", "bad"), OTHER, ids=[o[0] for o in OTHER])
def test_every_constraint_form_pydantic_knows_is_enforced(
    form: str, annotation: Any, good: Any, bad: Any
) -> None:
    def take(value: Any) -> str:
        return _took(value)

    take.__annotations__ = {"value": annotation, "return": str}
    made = Tool.from_function(take)
    received.clear()
    assert through_the_checks(made, {"value": good}) == []
    assert len(received) == 1
    assert through_the_checks(made, {"value": bad}), (form, bad)
    assert len(received) == 1


# --- a Field(...) default is a default -------------------------------------------------------


def tip(
    amount: float = Field(10, ge=LOW, le=HIGH),
    tags: list[str] = Field(default_factory=list),  # noqa: B008 (the form under test)
) -> str:
    """Tip an amount."""
    return _took((amount, tags))


def test_a_field_default_is_what_the_tool_gets_when_the_argument_is_left_out() -> None:
    made = Tool.from_function(tip)
    assert made.parameters["required"] == []
    received.clear()
    agent = Agent(model=ScriptedModel([tool_call("tip"), "done"]), tools=[made])
    [record] = agent.run("tip").tool_calls
    assert record.status_code == 200
    assert received == [(10, [])]
    # the function a subprocess worker runs fills it in the same way
    assert made.json_function()(amount=20) == "ok"
    assert received[-1] == (20, [])


def test_a_required_field_stays_required_in_a_shorthand_schema() -> None:
    def need(amount: float = Field(ge=LOW)) -> str:
        return _took(amount)

    made = Tool.from_function(need, parameters={"amount": {"type": "number"}})
    assert made.parameters["required"] == ["amount"]


# --- a real MCP server -------------------------------------------------------------------------


def test_an_mcp_servers_declared_bound_holds_before_the_server_is_called(tmp_path: Path) -> None:
    """The fixture MCP server (the official SDK over stdio) declares
    ``forecast(city, days: int = Field(1, ge=1, le=7))``."""
    pytest.importorskip("mcp")
    from test_mcp_client import FixtureServer, make_agent

    server = FixtureServer("stdio", tmp_path)
    script = [
        tool_call("forecast", city="Oslo", days=0).replace('"days": 0', f'"days": {literal}')
        for literal in ("99", "0", "NaN", "Infinity", "-Infinity", "1e999", "3")
    ]
    agent = make_agent(server, tmp_path, model=[*_between(script, "next"), "done"])
    try:
        codes = []
        for _ in range(len(script)):
            codes.extend(record.status_code for record in agent.run("go").tool_calls)
    finally:
        agent.close()
    assert codes == [400, 400, 400, 400, 400, 400, 200]
    assert [arguments for _, _, arguments in server.calls] == [{"city": "Oslo", "days": 3}]


def _between(items: list[str], answer: str) -> list[str]:
    """Each call followed by a plain answer that ends its run."""
    return [part for item in items for part in (item, answer)]


def test_json_reads_these_literals_as_non_finite() -> None:
    """Why the walk is needed: Python's JSON reader is this lenient."""
    assert math.isnan(json.loads("NaN")) and json.loads("1e999") == INF


# --- a client's tool, through the service's OpenAI facade ------------------------------------


def test_a_client_tools_bound_holds_before_the_call_is_handed_to_the_client() -> None:
    """A real uvicorn service, the official SDK as the client, a Hermes-mode endpoint behind:
    the calls with NaN and +Inf go back to the model as invalid, and only the call in range
    reaches the client."""
    import openai

    from hermes_agent.runs.keys import MemoryKeyStore
    from hermes_agent.server import ServiceSettings, create_app
    from server_harness import serve

    keys = MemoryKeyStore()
    with running_server() as endpoint:
        agent = Agent(model=OpenAICompatible("hermes-3", base_url=endpoint.base_url))
        app = create_app(agent=agent, settings=ServiceSettings(), keys=keys)
        with serve(app) as url:
            # Two invalid turns: within the bound of re-asks (three turns in all).
            endpoint.push(text(_json("NaN")), text(_json("Infinity")))
            endpoint.push(text(_json("42.5")))
            client = openai.OpenAI(
                base_url=f"{url}/v1", api_key=keys.create("alice"), max_retries=0
            )
            answer = client.chat.completions.create(
                model="hermes-agent",
                messages=[{"role": "user", "content": "pay"}],
                tools=[PAY_DECLARATION],  # type: ignore[list-item]
            )
        handed = answer.choices[0].message.tool_calls or []
        assert [json.loads(c.function.arguments) for c in handed] == [{"amount": 42.5}]  # type: ignore[union-attr]
        told = [r["messages"][-1]["content"] for r in endpoint.requests[1:3]]
        assert "NaN is not a finite number" in told[0]
        assert "Infinity is not a finite number" in told[1]


PAY_DECLARATION = {
    "type": "function",
    "function": {
        "name": "pay",
        "description": "Pay an amount",
        "parameters": {"type": "object", "properties": {"amount": BOUNDED}},
    },
}


@pytest.mark.timeout(240)
def test_the_queued_engine_holds_the_bound_too(tmp_path: Path) -> None:
    """The same client tool with ``execution: queue``: a real ``hermes-agent worker`` runs the
    run, and the NaN and -Inf calls never reach the client either."""
    import openai

    from worker_harness import queued_service

    with (
        running_server() as endpoint,
        queued_service(tmp_path, endpoint.base_url, concurrency=1, model_mode="hermes") as service,
    ):
        client = openai.OpenAI(
            base_url=f"{service.url}/v1", api_key=service.keys["alice"], max_retries=0, timeout=60
        )

        endpoint.push(text(_json("NaN")), text(_json("-Infinity")), text(_json("42.5")))
        answer = client.chat.completions.create(
            model="hermes-agent",
            messages=[{"role": "user", "content": "pay"}],
            tools=[PAY_DECLARATION],  # type: ignore[list-item]
        )
    handed = answer.choices[0].message.tool_calls or []
    assert [json.loads(c.function.arguments) for c in handed] == [{"amount": 42.5}]  # type: ignore[union-attr]
    told = [r["messages"][-1]["content"] for r in endpoint.requests[1:3]]
    assert "NaN is not a finite number" in told[0]
    assert "-Infinity is not a finite number" in told[1]
