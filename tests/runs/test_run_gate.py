"""The run layer's gate, attacked through the front doors as a user with one ordinary key (or
none) would, each over a real uvicorn on loopback with the scripted agent:

- a request's ``toolsets`` or ``tool_choice`` that would *widen* what the operator's agent
  exposes is refused (422) over REST, SSE, the WebSocket and the OpenAI facade, and the hidden
  tool never runs;
- a run cancelled just before its answer still spends its model turns' tokens, so cancelling
  cannot dodge ``tokens_per_day``;
- a message over ``max_message_chars`` gets the same 413 and message from every door.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from hermes_agent import Agent, ScriptedModel
from hermes_agent.events import SelectionEvent, ThoughtEvent, ToolResultsEvent
from hermes_agent.runs import (
    ApprovalRequiredEvent,
    Gate,
    GateLimits,
    Principal,
    RunRejected,
    RunRequest,
    RunStoppedEvent,
    StoredResultEvent,
    UnknownEvent,
    is_end,
    read_event,
    tokens_used,
)
from hermes_agent.runs.keys import MemoryKeyStore
from hermes_agent.runs.quotas import MemoryQuotaStore, Quotas
from hermes_agent.runs.settings import QuotaSettings
from hermes_agent.server import ServiceSettings, create_app
from hermes_agent.tools.registry import Tool
from hermes_agent.types import Message
from server_harness import call, serve, sse_events, wait_for

WIPED: list[str] = []


def wipe_everything() -> str:
    """Wipe every account (the operator's admin tool)."""
    WIPED.append("wiped")
    return "wiped"


CHARGED: list[int] = []


def charge(cents: int) -> str:
    """Charge the customer (a side effect: not idempotent)."""
    CHARGED.append(cents)
    return f"charged {cents}"


def lookup(term: str) -> str:
    """Look a term up."""
    return f"found {term}"


def _script(messages: Sequence[Message], _tools: Sequence[dict[str, Any]]) -> str:
    user = str(next(m.content for m in reversed(messages) if m.role == "user"))
    last_user = max(i for i, m in enumerate(messages) if m.role == "user")
    done = sum(1 for m in messages[last_user:] if m.role == "tool")
    if user.startswith("charge") and done == 0:
        return call("charge", cents=500)
    if user.startswith("wipe") and done == 0:
        return call("wipe_everything")
    if user.startswith("look") and done < 3:
        return call("lookup", term=f"t{done}")
    return f"answer after {done} calls"


def _agent(tmp_path: Path) -> Agent:
    # The operator exposes only the default toolset; the admin tool is registered but hidden.
    agent = Agent(
        model=ScriptedModel(_script, chunk_size=8),
        storage=f"sqlite:///{tmp_path / 'state.db'}",
        toolsets=["default"],
    )
    agent.add_tool(Tool.from_function(wipe_everything, toolset="admin"))
    agent.add_tool(Tool.from_function(lookup, timeout=5))
    agent.add_tool(Tool.from_function(charge))
    return agent


def _app(tmp_path: Path, **settings: Any) -> Any:
    values: dict[str, Any] = {"auth": "none"}
    values.update(settings)
    return create_app(agent=_agent(tmp_path), settings=ServiceSettings(**values))


def test_toolsets_and_tool_choice_only_narrow_over_every_door(tmp_path: Path) -> None:
    WIPED.clear()
    with serve(_app(tmp_path)) as base:
        client = httpx.Client(base_url=base, timeout=30)
        # REST, plain and streaming: a toolset the operator did not offer is refused up front.
        for stream in (False, True):
            body = {"message": "wipe", "toolsets": ["admin"], "stream": stream}
            refused = client.post("/v1/runs", json=body)
            assert refused.status_code == 422, refused.text
            assert "'admin': not offered by this service" in refused.json()["detail"]
            assert "it offers default" in refused.json()["detail"]
        # Naming the hidden tool as tool_choice is the same refusal's sibling.
        named = client.post("/v1/runs", json={"message": "wipe", "tool_choice": "wipe_everything"})
        assert named.status_code == 422 and "not a tool this run may use" in named.text
        # Without toolsets the hidden tool is simply not there: the model's call is a 404.
        plain = client.post("/v1/runs", json={"message": "wipe"})
        assert plain.status_code == 200, plain.text
        assert [c["status_code"] for c in plain.json()["tool_calls"]] == [404]
        # Narrowing is allowed.
        narrowed = client.post("/v1/runs", json={"message": "look", "toolsets": ["default"]})
        assert narrowed.status_code == 200 and narrowed.json()["output"] == "answer after 3 calls"

        # The WebSocket: the same refusal, as an error frame.
        ws_url = base.replace("http://", "ws://") + "/v1/ws"
        with connect(ws_url) as ws:
            ws.send(json.dumps({"type": "run", "message": "wipe", "toolsets": ["admin", "x"]}))
            frame = json.loads(ws.recv(timeout=10))
            assert frame["type"] == "error" and frame["status"] == 422, frame
            assert "'admin', 'x': not offered" in frame["detail"]

        # The OpenAI facade: tool_choice naming the hidden tool.
        facade = client.post(
            "/v1/chat/completions",
            json={
                "model": "hermes-agent",
                "messages": [{"role": "user", "content": "wipe"}],
                "tool_choice": {"type": "function", "function": {"name": "wipe_everything"}},
            },
        )
        assert facade.status_code == 422, facade.text
        assert "not a tool this run may use" in facade.json()["error"]["message"]
    assert WIPED == []


def test_cancelling_before_the_answer_still_spends_the_turns_tokens(tmp_path: Path) -> None:
    quota = 60
    app = _app(tmp_path, quotas=QuotaSettings(tokens_per_day=quota))
    agent = app.state.manager.agent
    stalled: list[str] = []

    async def slow_lookup(term: str) -> str:
        """Look a term up, slowly."""
        import asyncio

        stalled.append(term)
        await asyncio.sleep(30)  # a tool that stalls: the run is cancelled meanwhile
        return term

    agent.add_tool(Tool.from_function(slow_lookup, name="lookup", timeout=60), replace=True)
    with serve(app) as base:
        client = httpx.Client(base_url=base, timeout=30)
        spent = attempts = 0
        while True:
            with client.stream("POST", "/v1/runs", json={"message": "look", "stream": True}) as r:
                if r.status_code == 429:
                    assert "tokens_per_day" in r.read().decode()
                    break
                assert r.status_code == 200
                frames = sse_events(r.iter_lines())
                rid = next(f for f in frames if f.get("event") == "input")["data"]["request_id"]
                spent += next(f for f in frames if f.get("event") == "thought")["data"]["tokens"]
            attempts += 1
            # Cancel it while its tool runs: its answer never comes.
            wait_for(lambda: bool(stalled))
            cancelled = client.post(f"/v1/runs/{rid}/cancel").json()
            assert cancelled["status"] == "cancelled", cancelled
            stalled.clear()
            assert attempts < 50, "the quota never counted the cancelled runs' turns"
        usage = app.state.manager.quotas.usage("local")
        assert usage.tokens >= quota and usage.tokens == spent, (usage, spent)
        assert attempts >= 1 and spent > 0


def test_an_oversized_message_gets_the_same_refusal_from_every_door(tmp_path: Path) -> None:
    app = _app(tmp_path, max_message_chars=50)
    with serve(app) as base:
        client = httpx.Client(base_url=base, timeout=30)
        long = "x" * 80
        rest = client.post("/v1/runs", json={"message": long})
        assert rest.status_code == 413
        expected = rest.json()["detail"]
        assert "80 characters long" in expected and "max_message_chars" in expected
        with connect(base.replace("http://", "ws://") + "/v1/ws") as ws:
            ws.send(json.dumps({"type": "run", "message": long}))
            frame = json.loads(ws.recv(timeout=10))
        assert (frame["status"], frame["detail"]) == (413, expected)
        facade = client.post(
            "/v1/chat/completions",
            json={"model": "hermes-agent", "messages": [{"role": "user", "content": long}]},
        )
        assert facade.status_code == 413 and facade.json()["error"]["message"] == expected


def test_a_replay_is_a_counted_recorded_run_that_repeats_no_side_effect(tmp_path: Path) -> None:
    CHARGED.clear()
    app = _app(tmp_path, quotas=QuotaSettings(runs_per_day=3))
    with serve(app) as base:
        client = httpx.Client(base_url=base, timeout=30)
        rid = client.post("/v1/runs", json={"message": "charge"}).json()["request_id"]
        assert CHARGED == [500]
        # By default the replay does not run a tool that is not declared idempotent.
        safe = client.post(f"/v1/runs/{rid}/replay")
        assert safe.status_code == 200, safe.text
        report = safe.json()
        assert report["skipped_calls"] == ["charge"] and report["executed_tools"] is False
        assert "not run in this replay" in report["steps"][0]["actual_results"]
        assert report["matched"] is False  # the trail says it did not run
        assert report["actual_output"] == "answer after 1 calls"
        assert CHARGED == [500]
        # The replay left a trail of its own, the caller's, readable like any run.
        kept = client.get(f"/v1/runs/{report['replay_request_id']}").json()
        assert kept["session_id"] == f"replay-{rid}" and kept["status"] == "completed", kept
        # Asked explicitly, it runs today's tool.
        loud = client.post(f"/v1/runs/{rid}/replay", params={"execute_tools": "true"}).json()
        assert loud["skipped_calls"] == [] and loud["executed_tools"] is True
        assert CHARGED == [500, 500]
        # Three runs a day: the first run and two replays. The next replay is refused.
        spent = client.post(f"/v1/runs/{rid}/replay", params={"execute_tools": "true"})
        assert spent.status_code == 429 and "runs_per_day" in spent.json()["detail"]
        assert CHARGED == [500, 500]


# -- the gate on its own --------------------------------------------------------------------


def test_the_gate_counts_turns_of_runs_that_never_answered() -> None:
    events = [
        ThoughtEvent(status=200, step=0, tokens=30).to_dict(),
        ToolResultsEvent(status=200).to_dict(),
        ThoughtEvent(status=200, step=1, tokens=12).to_dict(),
        RunStoppedEvent(status="cancelled", error="cancelled").to_dict(),
        {"kind": "from_a_newer_version", "tokens": 1000},  # read past, never counted
    ]
    assert tokens_used(events) == 42
    answered = [*events[:3], {"kind": "result", "result": {"usage": {"total_tokens": 50}}}]
    assert tokens_used(answered) == 50


def test_the_gate_refuses_in_order_and_says_what_to_do(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    quotas = Quotas(QuotaSettings(runs_per_day=1), MemoryQuotaStore())
    gate = Gate(GateLimits(max_message_chars=10, max_runs_in_flight_per_user=2), quotas)
    alice = Principal("alice")
    try:
        gate.check(alice, RunRequest(message="hi", toolsets=["default"]), agent, 255)
        for request, code, words in (
            (RunRequest(message="x" * 11), 413, "max_message_chars"),
            (RunRequest(message="hi", toolsets=["admin"]), 422, "not offered"),
            (RunRequest(message="hi", tool_choice="wipe_everything"), 422, "may use"),
            (RunRequest(message="hi", toolsets=[], tool_choice="lookup"), 422, "may use"),
        ):
            try:
                gate.check(alice, request, agent, 255)
            except RunRejected as exc:
                assert exc.status_code == code and words in exc.message, exc.message
            else:
                raise AssertionError(f"{request} was let in")
        try:
            gate.check_room(total=3, mine=2)
        except RunRejected as exc:
            assert exc.status_code == 429 and "per user" in exc.message
        else:
            raise AssertionError("the per-user limit let a run in")
    finally:
        agent.close()


def test_keys_of_two_users_see_nothing_of_each_other(tmp_path: Path) -> None:
    keys = MemoryKeyStore()
    alice, bob = keys.create("alice"), keys.create("bob")
    app = create_app(agent=_agent(tmp_path), settings=ServiceSettings(auth="keys"), keys=keys)
    with serve(app) as base:
        a = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {alice}"}, timeout=30)
        b = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {bob}"}, timeout=30)
        done = a.post("/v1/runs", json={"message": "hello", "session_id": "diary"}).json()
        rid = done["request_id"]
        wait_for(lambda: a.get(f"/v1/runs/{rid}").status_code == 200)
        assert b.get(f"/v1/runs/{rid}").status_code == 404
        assert b.post(f"/v1/runs/{rid}/cancel").status_code == 404
        assert b.post(f"/v1/runs/{rid}/replay").status_code == 404
        # Bob's "diary" is his own: alice's conversation is not in it.
        mine = b.post("/v1/runs", json={"message": "hello", "session_id": "diary"}).json()
        assert mine["session_id"] == "diary" and mine["request_id"] != rid


# -- how big: an output schema that would expand without bound ------------------------------


def _doubling_schema(levels: int) -> dict[str, Any]:
    """Each definition refers to the next twice: about 1.4 KB at 15 levels, 2**levels nodes
    once inlined."""
    defs: dict[str, Any] = {
        f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 2} for i in range(levels)
    }
    defs[f"d{levels}"] = {"type": "string"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


def _ring_schema(size: int) -> dict[str, Any]:
    """Every definition refers to every other: each simple path is inlined."""
    defs = {
        f"r{i}": {"anyOf": [{"$ref": f"#/$defs/r{j}"} for j in range(size) if j != i]}
        for i in range(size)
    }
    return {"$ref": "#/$defs/r0", "$defs": defs}


def _nested(depth: int) -> dict[str, Any]:
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return {"type": "string", "default": value}


def test_an_output_schema_that_would_explode_is_refused_before_it_is_expanded(
    tmp_path: Path,
) -> None:
    with serve(_app(tmp_path)) as base:
        client = httpx.Client(base_url=base, timeout=30)
        for schema, words in (
            (_doubling_schema(18), "expands to more than"),
            (_doubling_schema(40), "expands to more than"),
            (_nested(500), "nests more than"),
            (_ring_schema(12), "expands to more than"),
        ):
            started = time.perf_counter()
            reply = client.post("/v1/runs", json={"message": "hello", "output_schema": schema})
            took = time.perf_counter() - started
            assert reply.status_code == 422, reply.text
            assert words in reply.json()["detail"]
            assert took < 5, f"refusing took {took:.1f} s"
        # A schema with $defs used once each is fine.
        fine = {"type": "object", "properties": {"n": {"$ref": "#/$defs/n"}}, "required": ["n"],
                "$defs": {"n": {"type": "integer"}}}  # fmt: skip
        # Admitted: it runs (and, its scripted answer not being JSON, ends 422 on its own).
        ran = client.post("/v1/runs", json={"message": "hello", "output_schema": fine}).json()
        assert ran["request_id"] and ran["status"] == 422 and "did not match" in ran["output"]
        assert client.get("/healthz").status_code == 200


def test_the_library_refuses_the_same_schemas() -> None:
    from hermes_agent.errors import HermesAgentError
    from hermes_agent.pipeline.structured import inline_refs, output_spec

    for schema in (_doubling_schema(30), _nested(200), _ring_schema(12)):
        started = time.perf_counter()
        try:
            output_spec(schema)
        except HermesAgentError as exc:
            assert "output_schema" in str(exc)
        else:
            raise AssertionError("an exploding schema was accepted")
        assert time.perf_counter() - started < 5
    # The expansion's own guard, for a schema that reaches it without the check.
    try:
        inline_refs(_ring_schema(12))
    except HermesAgentError as exc:
        assert "expands to more than" in str(exc)
    else:
        raise AssertionError("inlining a ring of definitions did not stop")


def test_a_replay_holds_a_slot_while_it_runs(tmp_path: Path) -> None:
    import threading

    looked: list[str] = []

    def slow_lookup(term: str) -> str:
        """Look a term up, slowly."""
        looked.append(term)
        time.sleep(1.5)  # slow work on purpose: the replay holds its slot meanwhile
        return term

    app = _app(tmp_path, max_runs_in_flight_per_user=1)
    agent = app.state.manager.agent
    agent.add_tool(Tool.from_function(slow_lookup, name="lookup", idempotent=True), replace=True)
    with serve(app) as base:
        client = httpx.Client(base_url=base, timeout=60)
        rid = client.post("/v1/runs", json={"message": "look"}).json()["request_id"]
        replies: list[int] = []
        before = len(looked)
        replaying = threading.Thread(
            target=lambda: replies.append(client.post(f"/v1/runs/{rid}/replay").status_code)
        )
        replaying.start()
        wait_for(lambda: len(looked) > before, what="the replay's first slow call")
        busy = client.post("/v1/runs", json={"message": "hello"})
        assert busy.status_code == 429 and "in flight" in busy.json()["detail"]
        second = client.post(f"/v1/runs/{rid}/replay")
        assert second.status_code == 429
        replaying.join(30)
        assert replies == [200]
        assert client.post("/v1/runs", json={"message": "hello"}).status_code == 200


def test_without_keys_no_other_site_can_drive_the_service(tmp_path: Path) -> None:
    """auth: none on loopback: a web page on another site cannot open a WebSocket (cross-site
    WebSocket hijacking) or call the API, and a foreign Host (DNS rebinding) is refused."""
    from websockets.exceptions import InvalidStatus

    with serve(_app(tmp_path)) as base:
        client = httpx.Client(base_url=base, timeout=30)
        assert client.post("/v1/runs", json={"message": "hello"}).status_code == 200
        rebound = client.get("/v1/runs", headers={"Host": "evil.example"})
        assert rebound.status_code == 421 and "Host header" in rebound.json()["detail"]
        page = client.post(
            "/v1/runs", json={"message": "hello"}, headers={"Origin": "http://evil.example"}
        )
        assert page.status_code == 403 and "evil.example" in page.json()["detail"]
        ws_url = base.replace("http://", "ws://") + "/v1/ws"
        try:
            with connect(ws_url, origin="http://evil.example"):  # type: ignore[arg-type]
                raise AssertionError("a foreign origin's WebSocket was accepted")
        except InvalidStatus as exc:
            assert exc.response.status_code == 403
        # The console's own pages (same origin) and clients that send no Origin still work.
        with connect(ws_url, origin=base) as ws:  # type: ignore[arg-type]
            ws.send(json.dumps({"type": "run", "message": "hello"}))
            assert json.loads(ws.recv(timeout=10))["type"] == "started"
        same = client.get("/v1/runs", headers={"Origin": base})
        assert same.status_code == 200


def test_a_websocket_frame_nested_past_the_parser_is_invalid_json(tmp_path: Path) -> None:
    with (
        serve(_app(tmp_path)) as base,
        connect(base.replace("http://", "ws://") + "/v1/ws") as ws,
    ):
        ws.send("[" * 60_000)  # under max_body_bytes, past the parser's recursion limit
        frame = json.loads(ws.recv(timeout=10))
        assert (frame["type"], frame["status"]) == ("error", 400), frame
        ws.send(json.dumps({"type": "run", "message": "hello"}))  # the socket goes on
        assert json.loads(ws.recv(timeout=10))["type"] == "started"


def test_a_channel_inbound_nested_past_the_parser_is_a_400(tmp_path: Path) -> None:
    from hermes_agent.channels import signed_headers
    from test_channels import Receiver
    from test_channels_inbound import INBOUND_SECRET, channels

    with Receiver() as receiver:
        app = _app(tmp_path, channels=channels(receiver.url), max_body_bytes=200_000)
        with serve(app) as base:
            body = ("[" * 60_000 + "]" * 60_000).encode()
            headers = {"Content-Type": "application/json", **signed_headers(INBOUND_SECRET, body)}
            reply = httpx.post(
                f"{base}/v1/channels/relay/inbound", content=body, headers=headers, timeout=30
            )
            assert reply.status_code == 400, reply.text
            assert "not valid JSON" in reply.json()["detail"]


def test_a_runs_events_read_back_as_their_types() -> None:
    """What the run layer dispatches on: each wire dict read back as its event type, nested
    views included; an unknown kind or a missing field is ``UnknownEvent``, never a guess."""
    from hermes_agent.events import PlannedCallView, RefusedCallView

    selection = SelectionEvent(
        status=200,
        planned=[PlannedCallView("add", {"a": 1})],
        rejected=[RefusedCallView("nuke", 403, "hidden")],
    )
    read = read_event({**selection.to_dict(), "added_later": True})  # newer fields: ignored
    assert read == selection and isinstance(read, SelectionEvent)
    assert read.rejected[0].status == 403
    asked = ApprovalRequiredEvent("ap-1", "req-1", "charge", {"n": 5}, "t0", None)
    assert read_event(asked.to_dict()) == asked
    answered = {"output": "hi", "usage": {"total_tokens": 7}}
    result = read_event({"kind": "result", "result": answered})
    assert isinstance(result, StoredResultEvent) and result.tokens == 7
    assert is_end(result.to_dict()) and is_end(RunStoppedEvent("failed", "x").to_dict())
    assert not is_end(selection.to_dict()) and not is_end({"kind": "nope"})
    for bad in ({"kind": "nope"}, {"kind": "thought"}, {"kind": "result", "result": "x"}, {}):
        with pytest.raises(UnknownEvent):
            read_event(bad)


EVIL = {"type": "string", "pattern": "^(a+)+\\1$"}
"""A regular expression with a backreference: RE2, the linear-time engine a caller's patterns
run on, cannot run it (tests/tools/test_caller_schemas.py has the ones it runs)."""


def test_regular_expressions_and_client_tools_are_the_gates_at_every_door(
    tmp_path: Path,
) -> None:
    """A caller's schema with a regex RE2 cannot run is refused (as an output
    schema, a facade response_format, a client tool's parameters); client tools brought to
    POST /v1/runs or the WebSocket pass the same checks the facade's do: the operator's
    setting, names apart from the agent's tools, results only for declared tools and within
    max_message_chars."""
    weather = {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}
    charged = len(CHARGED)
    with serve(_app(tmp_path, max_message_chars=200)) as base:
        client = httpx.Client(base_url=base, timeout=30)
        nested = {"type": "object", "properties": {"pattern": {"type": "object",
                  "properties": {"x": {"anyOf": [{"type": "integer"}, EVIL]}}}}}  # fmt: skip
        refused = client.post("/v1/runs", json={"message": "hi", "output_schema": nested})
        assert refused.status_code == 422 and "linear-time" in refused.json()["detail"]
        named = {"type": "object", "properties": {"pattern": {"type": "string"}}}
        ran = client.post("/v1/runs", json={"message": "hi", "output_schema": named}).json()
        assert ran["request_id"], ran  # a property named pattern is no regex: admitted
        facade = client.post(
            "/v1/chat/completions",
            json={
                "model": "hermes-agent",
                "messages": [{"role": "user", "content": "hi"}],
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": "x", "schema": EVIL}},
            },
        )  # fmt: skip
        assert facade.status_code == 422 and "linear-time" in facade.text, facade.text
        bad_tool = {"tools": [{"name": "t", "parameters": {"type": "object",
                    "properties": {"s": EVIL}}}]}  # fmt: skip
        cases: list[tuple[dict[str, Any], int, str]] = [
            ({"client": bad_tool}, 422, "linear-time"),
            ({"client": {"tools": [{"name": "lookup"}]}}, 422, "the agent's own tools"),
            ({"client": {"tools": [weather], "results": [
                {"call_id": "c1", "name": "charge", "content": "ok"}]}}, 422, "charge"),
            ({"client": {"tools": [weather], "results": [
                {"call_id": "c1", "name": "get_weather", "content": "x" * 300}]}}, 413,
             "max_message_chars"),
        ]  # fmt: skip
        for extra, status, words in cases:
            reply = client.post("/v1/runs", json={"message": "hi", **extra})
            assert reply.status_code == status and words in reply.json()["detail"], reply.text
            with connect(base.replace("http://", "ws://") + "/v1/ws") as ws:
                ws.send(json.dumps({"type": "run", "message": "hi", **extra}))
                frame = json.loads(ws.recv(timeout=10))
            assert (frame["status"], frame["detail"]) == (status, reply.json()["detail"])
        assert len(CHARGED) == charged  # nothing the requests named ran
    with serve(_app(tmp_path, openai_client_tools="off")) as base:
        reply = httpx.post(
            f"{base}/v1/runs", json={"message": "hi", "client": {"tools": [weather]}}, timeout=30
        )
        assert reply.status_code == 422 and "openai_client_tools: off" in reply.json()["detail"]
