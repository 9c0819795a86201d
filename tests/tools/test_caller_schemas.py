"""A JSON Schema from outside — a caller's output schema, ``response_format``, Responses
``text.format`` or client tool parameters, an MCP server's tool schema — is compiled, not
walked: a ``$ref`` points at a subschema of the same document or the schema is refused, nothing
is ever fetched or read for it, every pattern a caller sends runs on RE2 (linear time), and each
check of a value runs off the event loop within a step budget.

Attacks as a key holder would try them: the catastrophic pattern hidden under a member that is
no keyword and reached by ``"$ref": "#/x"``, through every door that takes a schema; a ``$ref``
to a loopback listener started here (requests that reach it are counted) and to a ``file://``
path (opens are counted by an audit hook); an MCP server (a real subprocess) whose tool schema
refers to the listener; and, over a real uvicorn, how long another user waits while a hostile
schema is checked (before: 11-36 s)."""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import jsonschema._keywords
import jsonschema._utils
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_agent import Agent, ScriptedModel
from hermes_agent.config import parse_config
from hermes_agent.errors import HermesAgentError, ToolDefinitionError
from hermes_agent.loading import build_agent
from hermes_agent.pipeline.structured import output_spec
from hermes_agent.pipeline.tool_selector import typed_arguments
from hermes_agent.runs.caller_schemas import compile_problem
from hermes_agent.runs.keys import MemoryKeyStore
from hermes_agent.server import ServiceSettings, create_app
from hermes_agent.testing import tool_call
from hermes_agent.tools.registry import Tool
from hermes_agent.tools.validation import (
    MAX_CHECK_STEPS,
    MAX_PATTERNS,
    CheckTooCostly,
    caller_argument_errors,
    caller_schema,
    make_fast_check,
)
from hermes_agent.types import Message
from openai_server import running_server, text
from server_harness import serve, wait_for
from test_server_openai_tools import hermes_call
from worker_harness import queued_service

HOSTILE = "^(a+)+$"
"""Backtracks exponentially in Python's ``re``: each ``a`` more doubles the time."""
TEXT = "a" * 40 + "!"
"""Minutes of Python's ``re`` against ``HOSTILE`` (26 characters took 11-36 s); microseconds
of RE2's."""
MEMBER_REF = {
    "type": "object",
    "properties": {"s": {"$ref": "#/x"}},
    "x": {"type": "string", "pattern": HOSTILE},
}
"""The attack: the pattern under ``x``, which is no keyword, reached by a reference."""
DEFS_REF = {
    "type": "object",
    "properties": {"s": {"$ref": "#/$defs/s"}},
    "required": ["s"],
    "$defs": {"s": {"type": "string", "pattern": HOSTILE}},
}
"""The same pattern where a reference may point: accepted, and run on RE2."""


def _ring() -> dict[str, Any]:
    """Refers to itself twice at every level: a value ``n`` deep costs 2**n checks."""
    twice = {"allOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/a"}]}
    return {"$defs": {"a": {"type": "object", "properties": {"p": twice}}}, "$ref": "#/$defs/a"}


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"p": value}
    return value


# -- what gets fetched or read: a listener and an audit hook ----------------------------------


class Listener:
    """An HTTP server on loopback that serves a schema and counts the requests that reach it."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        seen = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append(self.path)
                body = json.dumps({"type": "string", "pattern": HOSTILE}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/schema.json"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    running = Listener()
    yield running
    running.close()


_WATCHED: list[str] = []
_SEEN: list[tuple[str, str]] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    # Process-wide and permanent (audit hooks cannot be removed): it only notes events that
    # name a watched path or URL while a test watches.
    if not _WATCHED or event not in ("open", "urllib.Request"):
        return
    named = str(args[0]) if args else ""
    if any(watched in named for watched in _WATCHED):
        _SEEN.append((event, named))


sys.addaudithook(_audit)


@contextmanager
def watching(*names: str) -> Iterator[list[tuple[str, str]]]:
    """The file opens and URL requests (Python's audit events) naming any of ``names``."""
    _SEEN.clear()
    _WATCHED[:] = names
    try:
        yield _SEEN
    finally:
        _WATCHED.clear()


def _schema_file(tmp_path: Path) -> Path:
    path = tmp_path / "secret.json"
    path.write_text(json.dumps({"type": "string", "description": "server-side secret"}))
    return path


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_the_measures_can_see_a_fetch_and_a_read(listener: Listener, tmp_path: Path) -> None:
    """The listener and the audit hook count what they should (else the zeros below say
    nothing): the stock jsonschema validator fetches a remote ``$ref`` and reads a file one."""
    from jsonschema import Draft202012Validator

    path = _schema_file(tmp_path)
    with watching(listener.url, str(path)) as seen:
        Draft202012Validator({"$ref": listener.url}).is_valid("x")
        Draft202012Validator({"$ref": path.as_uri()}).is_valid("x")
    assert listener.requests == ["/schema.json"]
    assert ("urllib.Request", listener.url) in seen
    assert any(event == "open" and str(path) in named for event, named in seen)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_no_ref_is_fetched_or_read_for_any_schema(listener: Listener, tmp_path: Path) -> None:
    """A ``$ref`` naming a URL or a ``file://`` path is refused — by the gate's compile, by an
    output schema, by a tool's schema (a tool author's or an MCP server's) and by the fast
    check; a ``$ref`` that an ``$id`` makes remote is looked up in the schema only. 0 requests
    reach the listener, 0 opens of the file."""
    path = _schema_file(tmp_path)
    for ref in (listener.url, path.as_uri(), "schema.json"):
        schema = {"type": "object", "properties": {"s": {"$ref": ref}}}
        with watching(listener.url, str(path)) as seen:
            problem = compile_problem(schema)
            assert problem is not None and "names another document" in problem, problem
            with pytest.raises(HermesAgentError, match="names another document"):
                output_spec(schema)
            with pytest.raises(ToolDefinitionError, match="names another document"):
                Tool(name="t", description="", parameters=schema, function=lambda **_: None)
            assert make_fast_check(schema) is None
            assert caller_argument_errors(schema, {"s": "x"})
        assert seen == [] and listener.requests == []
    scoped = {
        "type": "object",
        "properties": {"s": {"$id": listener.url, "$ref": "#/$defs/x"}},
        "$defs": {"x": {"type": "string"}},
    }
    with watching(listener.url) as seen:
        assert compile_problem(scoped) is not None  # an $id below the top: refused
        author = Tool(name="t", description="", parameters=scoped, function=lambda **_: None)
        _, errors = author.validate({"s": "x"})
        assert errors and "never fetched" in errors[0], errors
    assert seen == [] and listener.requests == []


SERVER = Path(__file__).resolve().parents[1] / "harness" / "mcp_misbehaving_server.py"


def test_an_mcp_servers_remote_ref_is_never_fetched(listener: Listener, tmp_path: Path) -> None:
    """An MCP server (a real subprocess) lists a tool whose schema refers to the listener:
    the agent builds without that tool (left out, with a warning), keeps the server's others,
    and 0 requests reach the listener."""

    def config(**server: Any) -> Any:
        return parse_config(
            {
                "model": {"provider": "scripted"},
                "storage": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
                "mcp_servers": {
                    "bad": {
                        "command": sys.executable,
                        "args": [str(SERVER)],
                        "env": {"MISBEHAVE_SCHEMA_REF": listener.url},
                        **server,
                    }
                },
            }
        )

    agent = build_agent(config(), model=ScriptedModel(["hi"]))
    try:
        assert "huge" in agent.registry.names() and "referenced" not in agent.registry.names()
    finally:
        agent.close()
    assert listener.requests == []


def _mcp_config(tmp_path: Path, pattern: str, **server: Any) -> Any:
    """An agent's config with the misbehaving MCP server, its tool ``patterned`` taking an
    ``s`` that must match ``pattern``."""
    return parse_config(
        {
            "model": {"provider": "scripted"},
            "storage": {"url": f"sqlite:///{tmp_path / 'state.db'}"},
            "mcp_servers": {
                "bad": {
                    "command": sys.executable,
                    "args": [str(SERVER)],
                    "env": {"MISBEHAVE_SCHEMA_PATTERN": pattern},
                    **server,
                }
            },
        }
    )


def test_an_mcp_servers_catastrophic_pattern_runs_on_re2(tmp_path: Path) -> None:
    """An MCP server (a real subprocess) declares ``^(a+)+$`` and the model writes 40 ``a``
    and a ``!``: the call is refused to the model at once, a matching value passes, and 40
    checks of up to 59 ``a`` take milliseconds (before: Python's ``re``, 0.98 s at 24 ``a``,
    four times as long for every two more)."""
    model = ScriptedModel([tool_call("patterned", s=TEXT), "refused"])
    agent = build_agent(_mcp_config(tmp_path, HOSTILE), model=model)
    try:
        tool = agent.registry.get("patterned")
        assert tool is not None and tool.outside_schema
        started = time.perf_counter()
        refused = agent.run("go")
        took = time.perf_counter() - started
        (record,) = refused.tool_calls
        assert record.status_code == 400 and "does not match" in str(record.error), record
        assert tool.validate({"s": "aaa"}) == ({"s": "aaa"}, [])
        started = time.perf_counter()
        for length in range(20, 60):
            _, errors = tool.validate({"s": "a" * length + "!"})
            assert errors and "does not match" in errors[0], errors
        checks = time.perf_counter() - started
    finally:
        agent.close()
    print(f"MCP pattern: run with the hostile call {took:.2f} s; 40 checks {checks:.4f} s")
    assert checks < 0.5, checks


def test_an_mcp_servers_pattern_re2_cannot_run_refuses_the_tool(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A lookahead or a backreference in an MCP server's schema: the agent builds without that
    tool, with a warning that names it, the reason and how to silence it; the server's other
    tools are kept."""
    caplog.set_level(logging.WARNING, logger="hermes_agent.tools.mcp")
    for pattern in ("(?=a)a", "(a)\\1"):
        caplog.clear()
        agent = build_agent(_mcp_config(tmp_path, pattern), model=ScriptedModel(["hi"]))
        try:
            assert "huge" in agent.registry.names() and "patterned" not in agent.registry.names()
        finally:
            agent.close()
        warned = " ".join(r.getMessage() for r in caplog.records)
        assert re.search(r"'patterned'.*linear-time engine.*exclude_tools: \[patterned\]", warned)


# -- references point at subschemas ------------------------------------------------------------


def test_a_ref_into_a_member_that_is_no_keyword_is_refused() -> None:
    """The attack's schema is refused, whatever the member holds; a reference to a definition,
    a property, an item, the root is compiled."""
    refused = {
        "member": MEMBER_REF,
        "harmless member": {"properties": {"s": {"$ref": "#/x"}}, "x": {"type": "string"}},
        "a name table": {"properties": {"s": {"$ref": "#/properties"}}},
        "inside const": {"const": {"pattern": HOSTILE}, "$ref": "#/const"},
        "an anchor": {"$defs": {"s": {"$anchor": "s"}}, "$ref": "#s"},
        "nowhere": {"$ref": "#/$defs/missing"},
        "dynamic": {"$dynamicRef": "#meta"},
    }
    for name, schema in refused.items():
        problem = compile_problem(schema)
        assert problem is not None, name
        assert problem.startswith("output_schema cannot be used:"), problem
    for schema in (
        DEFS_REF,
        {"properties": {"a": {"type": "integer"}, "b": {"$ref": "#/properties/a"}}},
        {
            "type": "array",
            "prefixItems": [{"type": "string"}],
            "items": {"$ref": "#/prefixItems/0"},
        },
        {"properties": {"next": {"$ref": "#"}}},
        {"$defs": {"a b/c": {"type": "string"}}, "$ref": "#/$defs/a%20b~1c"},
        {"$schema": "http://json-schema.org/draft-07/schema#", "$id": "urn:x", "type": "object"},
    ):
        assert compile_problem(schema) is None, schema


def test_patterns_re2_cannot_run_are_refused_with_the_reason() -> None:
    for pattern in (r"^(a)\1$", r"^(?=a)a$", r"(?<!b)a", r"a{1001}"):
        schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}}
        problem = compile_problem(schema, "client tool 'probe''s schema")
        assert problem is not None and "linear-time engine" in problem, problem
        named = {"type": "object", "patternProperties": {pattern: {}}}
        assert "linear-time engine" in str(compile_problem(named))
    mixed = {"patternProperties": {"^a": {}}, "unevaluatedProperties": False}
    assert "unevaluatedProperties" in str(compile_problem(mixed))
    nested_draft = {"properties": {"s": {"$schema": "http://json-schema.org/draft-07/schema#"}}}
    assert "$schema is accepted at the top" in str(compile_problem(nested_draft))


# -- patterns on RE2, everywhere a validator applies them ----------------------------------------


def _leaf() -> st.SearchStrategy[tuple[dict[str, Any], Any]]:
    return st.sampled_from(
        [
            ({"type": "string", "pattern": HOSTILE}, TEXT),
            ({"type": "object", "patternProperties": {HOSTILE: {}}, "additionalProperties": False},
             {TEXT: 1}),
            ({"type": "object", "propertyNames": {"pattern": HOSTILE}}, {TEXT: 1}),
            ({"type": "object", "patternProperties": {HOSTILE: {"type": "integer"}},
              "additionalProperties": {"type": "integer"}}, {TEXT: "x"}),
            ({"type": "object", "patternProperties": {HOSTILE: {}},
              "unevaluatedProperties": False}, {TEXT: 1}),
        ]
    )  # fmt: skip


@st.composite
def hostile_schemas(draw: st.DrawFn) -> tuple[dict[str, Any], Any, bool]:
    """(schema, value, refers to a member that is no keyword): ``HOSTILE`` placed somewhere,
    and a value that reaches it and does not match."""
    schema, value = draw(_leaf())
    root: dict[str, Any] = {}
    member = False
    for depth in range(draw(st.integers(0, 4))):
        how = draw(
            st.sampled_from(["property", "items", "anyOf", "allOf", "then", "defs", "member"])
        )
        if how == "property":
            schema, value = {"type": "object", "properties": {"p": schema}}, {"p": value}
        elif how == "items":
            schema, value = {"type": "array", "items": schema}, [value]
        elif how == "anyOf":
            schema = {"anyOf": [{"type": "null"}, schema]}
        elif how == "allOf":
            schema = {"allOf": [{}, schema]}
        elif how == "then":
            schema = {"if": {}, "then": schema}
        elif how == "defs":
            root.setdefault("$defs", {})[f"d{depth}"] = schema
            schema = {"$ref": f"#/$defs/d{depth}"}
        else:
            root[f"x{depth}"] = schema
            schema, member = {"$ref": f"#/x{depth}"}, True
    return {**root, **schema}, value, member


class _NoPythonRe:
    """Stands in for ``re`` in jsonschema's keyword modules: any use is a failure."""

    def __init__(self) -> None:
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        def used(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            raise AssertionError(f"Python's re.{name} ran a caller's pattern")

        return used


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(hostile_schemas())
def test_every_caller_pattern_runs_on_re2_or_the_schema_is_refused(
    monkeypatch: pytest.MonkeyPatch, case: tuple[dict[str, Any], Any, bool]
) -> None:
    """Wherever the hostile pattern sits and however it is reached, the schema is refused (a
    reference to a member that is no keyword; ``unevaluatedProperties`` beside
    ``patternProperties``) or compiled; then checking the value finds it invalid, in
    milliseconds, without Python's ``re`` running once."""
    schema, value, member = case
    problem = compile_problem(schema)
    unevaluated = "unevaluatedProperties" in json.dumps(schema)
    if member or unevaluated:
        assert problem is not None
        return
    assert problem is None, problem
    compiled = caller_schema(schema)
    stand_in = _NoPythonRe()
    with monkeypatch.context() as patch:
        patch.setattr(jsonschema._keywords, "re", stand_in)
        patch.setattr(jsonschema._utils, "re", stand_in)
        started = time.perf_counter()
        errors = compiled.errors(value)
        took = time.perf_counter() - started
    assert stand_in.calls == 0
    assert errors, schema  # the pattern was applied, and the value does not match it
    assert took < 0.5, took


def test_a_caller_schema_matches_as_json_schema_says() -> None:
    """RE2 answers as a regex should: search (not full match) semantics, unicode, anchors."""
    compiled = caller_schema(
        {
            "type": "object",
            "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-\\d+$"}},
            "patternProperties": {"^x-": {"type": "integer"}},
            "additionalProperties": False,
        }
    )
    assert compiled.errors({"code": "ABC-12", "x-n": 3}) == []
    assert compiled.errors({"code": "héllo ABC-1"})  # anchored: no match
    assert [e.validator for e in compiled.errors({"other": 1})] == ["additionalProperties"]
    assert caller_schema({"pattern": "é+"}).errors("xéé") == []


# -- a budget for every check ------------------------------------------------------------------


def test_a_ring_of_references_stops_at_the_step_budget() -> None:
    """The ring passes the size budgets (it is small, and its cycle is counted once) but a
    value 40 deep would cost 2**40 checks: the check stops at ``MAX_CHECK_STEPS``."""
    assert compile_problem(_ring()) is None
    started = time.perf_counter()
    with pytest.raises(CheckTooCostly, match=str(MAX_CHECK_STEPS)):
        caller_schema(_ring()).errors(_nested(40))
    took = time.perf_counter() - started
    assert took < 5, took
    errors = caller_argument_errors(_ring(), _nested(40))
    assert len(errors) == 1 and "took too long" in errors[0]
    spec = output_spec(_ring())
    value, problems = spec.check(json.dumps(_nested(40)))
    assert value is None and "took too long" in problems[0]
    assert caller_schema(_ring()).errors(_nested(3)) == []  # a sensible value: checked


def test_typing_a_text_call_against_a_ring_of_unions_is_bounded() -> None:
    """A Qwen XML call's text values are typed by the schema; unions of references to unions
    would multiply at each level (41**8 visits here): the typing stops at its budget."""
    union = {"anyOf": [*[{"$ref": "#/$defs/a"}] * 40, {"type": "integer"}]}
    schema = {"type": "object", "properties": {"n": {"$ref": "#/$defs/a"}}, "$defs": {"a": union}}
    started = time.perf_counter()
    typed, problems = typed_arguments({"n": "3"}, schema)
    assert time.perf_counter() - started < 0.5
    assert typed == {"n": "3"} and problems == []  # no type could be told: left as text


def test_unique_items_costs_linear_time() -> None:
    """jsonschema compares every pair of objects; 20,000 of them would take minutes."""
    compiled = caller_schema({"type": "array", "uniqueItems": True})
    items = [{"n": n} for n in range(20_000)]
    started = time.perf_counter()
    assert compiled.errors(items) == []
    assert compiled.errors([*items, {"n": 7}])
    assert time.perf_counter() - started < 1
    assert compiled.errors([1, 1.0]) and compiled.errors([[1, {"a": 2}], [1.0, {"a": 2}]])
    assert compiled.errors([True, 1]) == [] and compiled.errors([0, False, None]) == []


# -- the doors, over a real uvicorn ------------------------------------------------------------


def _script(messages: Sequence[Message], _tools: Sequence[dict[str, Any]]) -> str:
    """``call NAME ARGS`` → that call (then ``done`` once a result is in); ``answer TEXT`` →
    TEXT; a re-ask after an invalid answer → a valid one."""
    if messages[-1].role == "tool":
        return "done"
    said = str(next(m for m in reversed(messages) if m.role == "user").content)
    if said.startswith("call "):
        _, name, arguments = said.split(" ", 2)
        return tool_call(name, **json.loads(arguments))
    if said.startswith("answer "):
        return said.removeprefix("answer ")
    return '{"s": "aaa"}'


class Door:
    def __init__(self, url: str, keys: MemoryKeyStore, model: ScriptedModel) -> None:
        self.url, self.model = url, model
        alice, bob = keys.create("alice"), keys.create("bob")
        self.alice = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {alice}"})
        self.bob = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {bob}"})

    def chat(self, message: str, **extra: Any) -> httpx.Response:
        body = {"model": "hermes-agent", "messages": [{"role": "user", "content": message}]}
        return self.alice.post("/v1/chat/completions", json={**body, **extra}, timeout=120)


@pytest.fixture(scope="module")
def door() -> Iterator[Door]:
    keys, model = MemoryKeyStore(), ScriptedModel(_script)
    with serve(create_app(agent=Agent(model=model), settings=ServiceSettings(), keys=keys)) as url:
        yield Door(url, keys, model)


def _tool(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "probe", "parameters": schema}}


def _every_door(door: Door, schema: dict[str, Any]) -> list[httpx.Response]:
    """The schema sent through each door that takes one."""
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    client = {"tools": [{"name": "probe", "parameters": schema}]}
    return [
        door.alice.post("/v1/runs", json={"message": "hi", "output_schema": schema}),
        door.chat("hi", response_format=fmt),
        door.alice.post(
            "/v1/responses",
            json={
                "model": "hermes-agent",
                "input": "hi",
                "text": {"format": {**fmt["json_schema"], "type": "json_schema"}},
            },
        ),
        door.chat("hi", tools=[_tool(schema)]),
        door.alice.post(
            "/v1/responses",
            json={
                "model": "hermes-agent",
                "input": "hi",
                "tools": [{"type": "function", "name": "probe", "parameters": schema}],
            },
        ),
        door.alice.post("/v1/runs", json={"message": "hi", "client": client}),
    ]


def test_every_door_refuses_the_member_reference_and_fetches_nothing(
    door: Door, listener: Listener, tmp_path: Path
) -> None:
    """The attack's schema through an output schema, a chat ``response_format``, a Responses
    ``text.format``, a client tool (chat, Responses, /v1/runs): 422 naming the reference, each
    door the same; a URL and a ``file://`` reference: refused, 0 requests, 0 opens."""
    for reply in _every_door(door, MEMBER_REF):
        assert reply.status_code == 422, reply.text
        assert "does not point at a subschema" in reply.text, reply.text
    path = _schema_file(tmp_path)
    for ref in (listener.url, path.as_uri()):
        remote = {"type": "object", "properties": {"s": {"$ref": ref}}}
        with watching(listener.url, str(path)) as seen:
            for reply in _every_door(door, remote):
                assert reply.status_code == 422, reply.text  # the gate's word, every door
                assert "names another document" in reply.text, reply.text
        assert seen == [] and listener.requests == []


@contextmanager
def others_wait(door: Door) -> Iterator[list[float]]:
    """Bob asks for the model list over and over while the block runs; yields how long each
    of his requests took (seconds)."""
    waits: list[float] = []
    stop = threading.Event()

    def ask() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            assert door.bob.get("/v1/models", timeout=120).status_code == 200
            waits.append(time.perf_counter() - started)

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    try:
        yield waits
    finally:
        stop.set()
        thread.join(timeout=120)


def test_a_hostile_client_tool_schema_holds_no_one_else(door: Door) -> None:
    """The pattern where references may point (accepted) with the model's 41 characters, and
    the ring with a value 40 deep: each call is refused to the model (400) and the run goes on;
    meanwhile another user's requests are answered as usual (before: frozen 11-36 s)."""
    hostile = [
        (DEFS_REF, {"s": TEXT}, "does not match"),
        (_ring(), _nested(40), "took too long"),
    ]
    for schema, arguments, why in hostile:
        with others_wait(door) as waits:
            started = time.perf_counter()
            reply = door.chat(f"call probe {json.dumps(arguments)}", tools=[_tool(schema)])
            took = time.perf_counter() - started
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"] == "done", reply.text
        result = door.model.requests[-1].messages[-1]  # what the model read of its call
        assert result.role == "tool" and why in str(result.tool_results[0].error), result
        longest = max(waits, default=0.0)
        print(f"client tool {why!r}: run {took:.2f} s; another user waited at most {longest:.3f} s")
        assert len(waits) >= 1 and longest < 1.0, waits


def test_a_hostile_output_schema_holds_no_one_else(door: Door) -> None:
    """The accepted pattern as an output schema (POST /v1/runs and chat ``response_format``),
    the model answering the 41 characters: the answer is found invalid at once, asked again,
    and another user's requests are answered meanwhile."""
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": DEFS_REF}}
    with others_wait(door) as waits:
        started = time.perf_counter()
        reply = door.chat(f"answer {json.dumps({'s': TEXT})}", response_format=fmt)
        took = time.perf_counter() - started
    assert reply.status_code == 200, reply.text
    assert json.loads(reply.json()["choices"][0]["message"]["content"]) == {"s": "aaa"}
    longest = max(waits, default=0.0)
    print(f"output schema: run {took:.2f} s; another user waited at most {longest:.3f} s")
    assert longest < 1.0, waits
    ran = door.alice.post(
        "/v1/runs",
        json={"message": f"answer {json.dumps({'s': TEXT})}", "output_schema": DEFS_REF},
    )
    assert ran.status_code in (200, 202), ran.text


def test_a_working_client_tool_schema_still_hands_its_call_back(door: Door) -> None:
    """A valid call against a schema with a reference and a pattern is handed back as before."""
    reply = door.chat(f"call probe {json.dumps({'s': 'aaa'})}", tools=[_tool(DEFS_REF)])
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    (call,) = choice["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"s": "aaa"}


# -- queue mode: a real worker process validates through the same pipeline -----------------------


@pytest.mark.timeout(240)
def test_a_queued_hostile_client_tool_holds_no_one_elses_run(tmp_path: Path) -> None:
    """With ``execution: queue`` (a real ``hermes-agent worker``, PostgreSQL, Redis), the ring
    with a value 40 deep as a client tool's arguments: the worker refuses the call within the
    step budget, and another user's run queued beside it takes about as long as alone (before:
    10.4 s instead of 1.1 s)."""
    with (
        running_server() as endpoint,
        queued_service(
            tmp_path, endpoint.base_url, users=("alice", "bob"), model_mode="hermes"
        ) as service,
    ):
        url, alice, bob = service.url, service.keys["alice"], service.keys["bob"]

        def chat(key: str, message: str, **extra: Any) -> tuple[httpx.Response, float]:
            body = {"model": "hermes-agent", "messages": [{"role": "user", "content": message}]}
            started = time.perf_counter()
            reply = httpx.post(
                f"{url}/v1/chat/completions",
                json={**body, **extra},
                headers={"Authorization": f"Bearer {key}"},
                timeout=120,
            )
            return reply, time.perf_counter() - started

        alone, _ = chat(bob, "hi")  # the worker's first run warms it up
        alone, baseline = chat(bob, "hi")
        assert alone.status_code == 200, alone.text

        endpoint.push(text(hermes_call("probe", **_nested(40))))  # then "ok" for every turn
        hostile: list[tuple[httpx.Response, float]] = []
        thread = threading.Thread(
            target=lambda: hostile.append(chat(alice, "go", tools=[_tool(_ring())]))
        )
        asked = len(endpoint.requests)
        thread.start()
        # Once the worker has asked the model, it holds the hostile call: the check starts now.
        wait_for(lambda: len(endpoint.requests) > asked, 60, "the worker asking the model")
        beside, beside_took = chat(bob, "hi")
        thread.join(timeout=120)
        ((reply, hostile_took),) = hostile
        assert reply.status_code == 200 and beside.status_code == 200, (reply.text, beside.text)
        refused = [m for r in endpoint.requests[asked:] for m in r["messages"] if "took too long"
                   in json.dumps(m)]  # fmt: skip
        assert refused, "the model never heard that the check ran out of budget"
        print(
            f"queue: hostile run {hostile_took:.2f} s; another user's run {beside_took:.2f} s "
            f"beside it, {baseline:.2f} s alone"
        )
        assert beside_took < baseline + 1.5, (beside_took, baseline)


def _costly(n: int) -> dict[str, Any]:
    """A schema as costly to compile as the budgets allow: ~5,000 values, ``MAX_PATTERNS``
    patterns each of which RE2 needs milliseconds to compile (distinct per ``n``, so no cache
    helps)."""
    properties: dict[str, Any] = {
        f"p{i}": {"type": "string", "pattern": f"(\\w+\\s*){{1,1000}}{n}x{i}"}
        for i in range(MAX_PATTERNS)
    }
    properties.update({f"q{i}": {"type": "string"} for i in range(1_600)})
    return {"type": "object", "properties": properties}


def test_too_many_patterns_are_refused_and_a_costly_schema_holds_no_one_else(door: Door) -> None:
    """A schema with more than ``MAX_PATTERNS`` patterns is refused; one at the limit is
    compiled as it arrives (up to a few hundred ms), in a worker thread: another user's
    requests are answered meanwhile."""
    over = _costly(0)
    over["properties"]["extra"] = {"type": "string", "pattern": "^a$"}
    refused = door.alice.post("/v1/runs", json={"message": "hi", "output_schema": over})
    assert refused.status_code == 422 and f"more than {MAX_PATTERNS} patterns" in refused.text
    started = time.perf_counter()
    assert compile_problem(_costly(1)) is None
    alone = time.perf_counter() - started
    with others_wait(door) as waits:
        for n in range(2, 6):
            schema = _costly(n)
            body = {"message": "hi", "output_schema": schema, "client": {"tools": [
                {"name": "probe", "parameters": schema}]}}  # fmt: skip
            reply = door.alice.post("/v1/runs", json=body, timeout=120)
            assert reply.status_code in (200, 202), reply.text
    longest = max(waits, default=0.0)
    print(f"compiling a costly schema: {alone:.2f} s; another user waited at most {longest:.3f} s")
    assert longest < max(0.25, alone / 2), (longest, alone)


# -- the facade reads a client tool's shape; the gate compiles it, off the loop ------------------


def test_a_costly_client_tool_schema_through_the_facade_holds_no_one_else(door: Door) -> None:
    """A client tool's schema as costly as the budgets allow, through /v1/chat/completions and
    /v1/responses (distinct each time, so no cache helps): the facade only reads the
    declaration, the gate compiles it in a worker thread, and another user's requests are
    answered meanwhile (before: the facade compiled it on the event loop, ~0.5 s each)."""
    started = time.perf_counter()
    assert compile_problem(_costly(100), formats=True) is None
    alone = time.perf_counter() - started
    with others_wait(door) as waits:
        for n in range(101, 104):
            schema = _costly(n)
            chat = door.chat("hi", tools=[_tool(schema)])
            assert chat.status_code == 200, chat.text
            tool = {"type": "function", "name": "probe", "parameters": _costly(n + 100)}
            body = {"model": "hermes-agent", "input": "hi", "tools": [tool]}
            responses = door.alice.post("/v1/responses", json=body, timeout=120)
            assert responses.status_code == 200, responses.text
    longest = max(waits, default=0.0)
    print(f"facade client tool: compiling {alone:.2f} s; another user waited {longest:.3f} s")
    # Compiled on the event loop, each of the six schemas would hold every other request for
    # about ``alone``; from a worker thread another request waits only for its GIL turns.
    assert len(waits) >= 1 and longest < max(0.25, alone * 0.9), (longest, alone)


def test_a_client_tool_schema_is_judged_by_the_gate_through_every_door(door: Door) -> None:
    """What is wrong with a caller's schema is said once, by the gate, with the same status
    through every door (422): a remote reference, a pattern RE2 cannot run, a schema over the
    budgets, one the metaschema refuses — as a client tool's parameters or an output schema.
    The facade's own 400 is for a declaration's shape."""
    too_deep: dict[str, Any] = {"type": "string"}
    for _ in range(40):
        too_deep = {"type": "object", "properties": {"p": too_deep}}
    wrong = {
        "names another document": {"type": "object", "properties": {"s": {"$ref": "https://x/s"}}},
        "linear-time engine": {"type": "object", "properties": {"s": {"pattern": "(a)\\1"}}},
        "nests more than": too_deep,
        "not a valid JSON Schema": {"type": "object", "properties": {"s": {"type": 5}}},
    }
    for why, schema in wrong.items():
        for reply in _every_door(door, schema):
            assert reply.status_code == 422, (why, reply.request.url, reply.text)
            assert why in reply.text, (why, reply.text)
    shape = door.chat("hi", tools=[{"type": "function", "function": {"name": "no spaces"}}])
    assert shape.status_code == 400 and "invalid tool name" in shape.text, shape.text
