"""The whole HTTP and WebSocket API over a real uvicorn on loopback, once on SQLite and once on
PostgreSQL (sessions, audit records and API keys all in that database): runs, SSE, a client that
drops mid-run and reconnects, WebSocket with an approval answered on the socket, approvals over
HTTP (approve, deny, expire), sessions, traces, keys (hashed, revoked, surviving a restart),
size limits (413) and isolation between two users' keys (404s)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import ClientConnection, connect

from hermes_agent.runs.keys import SqlKeyStore
from hermes_agent.server import ServiceSettings, create_app
from server_harness import bearer as _bearer
from server_harness import (
    make_agent,
    pid_from,
    poll_run,
    process_gone,
    serve,
    sse_events,
    wait_for,
)
from storage_backends import sql_database_url  # noqa: F401  (the sql_url fixture)


def _settings(sql_url: str, **overrides: Any) -> ServiceSettings:
    values: dict[str, Any] = {
        "auth": "keys",
        "keys_url": sql_url,
        "approval_policy": "wait",
        "approval_timeout_s": 30.0,
        "keepalive_s": 0.2,
    }
    values.update(overrides)
    return ServiceSettings(**values)


@pytest.fixture(name="keys")
def _keys(sql_url: str) -> Iterator[dict[str, str]]:
    """Keys for alice and bob, made in the test database (where the app reads them)."""
    store = SqlKeyStore(sql_url)
    try:
        yield {"alice": store.create("alice"), "bob": store.create("bob")}
    finally:
        store.close()


def _frames(response: httpx.Response) -> Iterator[dict[str, Any]]:
    return (f for f in sse_events(response.iter_lines()) if "comment" not in f)


def test_runs_streams_a_dropped_client_sessions_traces_and_cancel(
    sql_url: str, keys: dict[str, str], tmp_path: Path
) -> None:
    alice = _bearer(keys["alice"])
    app = create_app(agent=make_agent(sql_url), settings=_settings(sql_url))
    with serve(app) as url:
        client = httpx.Client(base_url=url, headers=alice, timeout=30)
        # A plain run, its status, and the list.
        result = client.post("/v1/runs", json={"message": "hello", "session_id": "s1"}).json()
        assert (result["output"], result["session_id"]) == ("Hello!", "s1")
        hello = result["request_id"]
        assert client.get(f"/v1/runs/{hello}").json()["status"] == "completed"
        listed = client.get("/v1/runs", params={"session_id": "s1", "status": "completed"})
        assert [r["request_id"] for r in listed.json()["runs"]] == [hello]

        # A stream the client drops once the 1 s tool is about to run; the run goes on.
        seen: list[dict[str, Any]] = []
        body = {"message": "slow", "session_id": "s1", "stream": True}
        with client.stream("POST", "/v1/runs", json=body) as reply:
            assert reply.headers["content-type"].startswith("text/event-stream")
            assert reply.headers["x-accel-buffering"] == "no"
            for frame in _frames(reply):
                seen.append(frame)
                if frame["event"] == "selection":
                    break
        request_id = seen[0]["data"]["request_id"]
        assert client.get(f"/v1/runs/{request_id}").json()["status"] == "running"
        # Nobody listens while the tool runs; the run finishes all the same.
        assert poll_run(client, request_id)["status"] == "completed"
        rest: list[dict[str, Any]] = []
        headers = {"Last-Event-ID": seen[-1]["id"]}
        with client.stream("GET", f"/v1/runs/{request_id}/events", headers=headers) as reply:
            rest.extend(_frames(reply))
        ids = [int(f["id"]) for f in seen + rest]
        assert ids == list(range(1, len(ids) + 1)), ids  # every event once, none lost
        kinds = [f["event"] for f in rest]
        assert "tool_results" in kinds and kinds[-1] == "result"
        final = rest[-1]["data"]["result"]
        assert final["output"].startswith("done")
        # The tool ran to its end while nobody listened.
        assert (final["tool_calls"][0]["status_code"], final["tool_calls"][0]["result"]) == (
            200,
            "waited",
        )
        backend = sql_url.split(":")[0]
        print(f"\n[{backend}] dropped after {len(seen)} events, {len(rest)} more on reconnect")
        # The same events again from the start, for a client that lost everything.
        with client.stream("GET", f"/v1/runs/{request_id}/events") as reply:
            assert [int(f["id"]) for f in _frames(reply)] == ids

        # Sessions and traces, from the store.
        session = client.get("/v1/sessions/s1").json()
        assert [m["role"] for m in session["messages"]] == [
            "user",
            "assistant",
            "user",
            "assistant",
            "tool",
            "assistant",
        ]
        assert session["runs"] == [hello, request_id]
        assert [s["id"] for s in client.get("/v1/sessions").json()["sessions"]] == ["s1"]
        trace = client.get(f"/v1/runs/{request_id}/trace").json()["records"]
        stages = [r["stage"] for r in trace]
        # The service's first record (the run accepted), then the run's own stages.
        assert stages[:2] == ["RunManager", "InputParser"] and stages[-1] == "OutputRenderer"
        assert "ToolExecutor" in stages
        assert {r["session_id"] for r in trace} == {"s1"}
        jsonl = client.get(f"/v1/runs/{request_id}/trace.jsonl")
        assert jsonl.headers["content-type"].startswith("application/x-ndjson")
        assert [json.loads(line)["stage"] for line in jsonl.text.splitlines()] == stages
        assert client.delete("/v1/sessions/s1").status_code == 204
        assert client.get("/v1/sessions/s1").json()["messages"] == []
        assert client.delete("/v1/sessions/s1").status_code == 404

        # Cancel stops a run whose tool sleeps in a subprocess: the sleeper is gone.
        pid_file = tmp_path / "sleeper.pid"
        with client.stream(
            "POST", "/v1/runs", json={"message": f"nap {pid_file}", "stream": True}
        ) as reply:
            napping = next(_frames(reply))["data"]["request_id"]
        sleeper = pid_from(pid_file)
        cancelled = client.post(f"/v1/runs/{napping}/cancel").json()
        assert (cancelled["cancelled"], cancelled["status"]) == (True, "cancelled")
        wait_for(lambda: process_gone(sleeper), timeout=5)
        with client.stream("GET", f"/v1/runs/{napping}/events") as reply:
            last = list(_frames(reply))[-1]
        assert (last["event"], last["data"]["status"]) == ("run_stopped", "cancelled")


def test_approvals_over_http_and_on_a_websocket_that_may_drop(
    sql_url: str, keys: dict[str, str]
) -> None:
    alice, bob = _bearer(keys["alice"]), _bearer(keys["bob"])
    settings = _settings(sql_url, approval_timeout_s=1.0)
    with serve(create_app(agent=make_agent(sql_url), settings=settings)) as url:
        client = httpx.Client(base_url=url, headers=alice, timeout=30)
        outcomes: dict[str, dict[str, Any]] = {}
        for answer in ("approve", "deny", "expire"):
            reply = client.post("/v1/runs", json={"message": f"delete /tmp/{answer}.txt"})
            assert reply.status_code == 202, reply.text
            (pending,) = reply.json()["pending_approvals"]
            assert pending["arguments"] == {"path": f"/tmp/{answer}.txt"}
            approval = f"/v1/approvals/{pending['approval_id']}"
            assert client.post(approval, json={"approved": True}, headers=bob).status_code == 404
            if answer != "expire":
                approved = answer == "approve"
                sent = client.post(approval, json={"approved": approved, "reason": answer})
                assert sent.status_code == 200
                assert client.post(approval, json={"approved": True}).status_code == 409
            outcomes[answer] = poll_run(client, reply.json()["request_id"])["result"]
            if answer == "expire":
                assert client.post(approval, json={"approved": True}).status_code == 409
        assert outcomes["approve"]["tool_calls"][0]["status_code"] == 200
        assert outcomes["approve"]["tool_calls"][0]["result"] == "deleted /tmp/approve.txt"
        assert outcomes["deny"]["tool_calls"][0]["status_code"] == 403
        assert outcomes["deny"]["approvals"][0]["reason"] == "deny"
        assert outcomes["expire"]["tool_calls"][0]["status_code"] == 403
        assert outcomes["expire"]["approvals"][0]["reason"] == "expired"

        # On a WebSocket: the approval is pushed to the socket and answered there; bob's
        # socket can neither answer it nor cancel the run.
        ws_url = url.replace("http", "ws") + "/v1/ws"
        with (
            connect(ws_url, additional_headers=alice) as mine,
            connect(ws_url, subprotocols=["bearer", keys["bob"]]) as theirs,  # type: ignore[list-item]
        ):
            assert theirs.subprotocol == "bearer"
            mine.send(json.dumps({"type": "run", "message": "delete /tmp/ws.txt"}))
            event = _next_event(mine, "approval_required")
            theirs.send(
                json.dumps(
                    {"type": "approve", "approval_id": event["approval_id"], "approved": True}
                )
            )
            assert _receive(theirs)["status"] == 404
            theirs.send(json.dumps({"type": "cancel", "request_id": event["request_id"]}))
            assert _receive(theirs)["status"] == 404
            mine.send(
                json.dumps(
                    {"type": "approve", "approval_id": event["approval_id"], "approved": True}
                )
            )
            result = _next_event(mine, "result")["result"]
        assert result["approvals"][0]["approved"] is True
        assert result["tool_calls"][0]["result"] == "deleted /tmp/ws.txt"
        # The answer was recorded in the store's audit trail.
        trace = client.get(f"/v1/runs/{result['request_id']}/trace").json()["records"]
        assert any(r["stage"] == "ToolExecutor" and r["status_code"] == 200 for r in trace)

        # A socket that drops mid-run cancels nothing: the run finishes, and its events are
        # all there for a client that comes back over HTTP.
        with connect(ws_url, additional_headers=alice) as socket:
            socket.send(json.dumps({"type": "run", "message": "slow"}))
            started = _receive(socket)
            assert started["type"] == "started"
        assert poll_run(client, started["request_id"])["status"] == "completed"
        with client.stream("GET", f"/v1/runs/{started['request_id']}/events") as reply:
            frames = list(_frames(reply))
        assert [int(f["id"]) for f in frames] == list(range(1, len(frames) + 1))
        assert frames[-1]["data"]["result"]["tool_calls"][0]["result"] == "waited"


def _receive(socket: ClientConnection) -> dict[str, Any]:
    message: dict[str, Any] = json.loads(socket.recv(timeout=20))
    return message


def _next_event(socket: ClientConnection, kind: str) -> dict[str, Any]:
    while True:
        message = _receive(socket)
        assert message["type"] != "error", message
        if message["type"] == "event" and message["event"]["kind"] == kind:
            event: dict[str, Any] = message["event"]
            return event


def test_keys_isolation_size_limits_and_a_restart(sql_url: str, keys: dict[str, str]) -> None:
    alice, bob = _bearer(keys["alice"]), _bearer(keys["bob"])
    settings = _settings(sql_url, max_body_bytes=4000, max_message_chars=200)
    with serve(create_app(agent=make_agent(sql_url), settings=settings)) as url:
        client = httpx.Client(base_url=url, timeout=30)
        # No key, a made-up key, a malformed one: 401.
        for headers in (
            {},
            _bearer("hk_0123456789abcdef.not-the-right-secret-at-all"),
            alice | {"Authorization": "Basic x"},
        ):
            assert client.get("/v1/runs", headers=headers).status_code == 401
        run = client.post(
            "/v1/runs", json={"message": "hello", "session_id": "mine"}, headers=alice
        ).json()
        request_id = run["request_id"]
        # Someone else's run, session and trace are 404s, never 403s.
        for method, path in (
            ("GET", f"/v1/runs/{request_id}"),
            ("GET", f"/v1/runs/{request_id}/events"),
            ("GET", f"/v1/runs/{request_id}/trace"),
            ("GET", f"/v1/runs/{request_id}/trace.jsonl"),
            ("POST", f"/v1/runs/{request_id}/cancel"),
            ("GET", "/v1/sessions/mine"),
            ("DELETE", "/v1/sessions/mine"),
        ):
            assert client.request(method, path, headers=bob).status_code == 404, path
            if method == "GET":
                assert client.request(method, path, headers=alice).status_code == 200, path
        events = f"/v1/runs/{request_id}/events"
        assert client.get(events, params={"access_token": keys["bob"]}).status_code == 404
        assert client.get(events, params={"access_token": keys["alice"]}).status_code == 200
        assert client.get(events, params={"access_token": "hk_x.y"}).status_code == 401
        assert client.get("/v1/runs", headers=bob).json()["runs"] == []
        assert client.get("/v1/sessions", headers=bob).json()["sessions"] == []
        # Bob's session of the same name is his own.
        client.post("/v1/runs", json={"message": "hello", "session_id": "mine"}, headers=bob)
        assert len(client.get("/v1/sessions/mine", headers=bob).json()["messages"]) == 2
        assert len(client.get("/v1/sessions/mine", headers=alice).json()["messages"]) == 2

        # Size limits: the body (checked before it is read) and the message.
        big = client.post("/v1/runs", json={"message": "x" * 5000}, headers=alice)
        assert big.status_code == 413 and "max_body_bytes" in big.json()["detail"]
        long = client.post("/v1/runs", json={"message": "x" * 201}, headers=alice)
        assert long.status_code == 413 and "max_message_chars" in long.json()["detail"]
        ws_url = url.replace("http", "ws") + "/v1/ws"
        with connect(ws_url, additional_headers=alice) as socket:
            socket.send(json.dumps({"type": "run", "message": "x" * 201, "client_ref": 7}))
            refused = _receive(socket)
        assert (refused["type"], refused["status"], refused["client_ref"]) == ("error", 413, 7)

    # Keys are stored hashed in the same database, and a revoked key stops working.
    store = SqlKeyStore(sql_url)
    with store.engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT key_sha256, user_id FROM hermes_api_keys").all()
    assert sorted(row[1] for row in rows) == ["alice", "bob"]
    assert not any(key in str(rows) for key in keys.values())
    (bobs,) = [info for info in store.list() if info.user_id == "bob"]
    assert store.revoke(bobs.key_id)
    store.close()

    # A new process on the same database: keys, runs and sessions are still there.
    with serve(create_app(agent=make_agent(sql_url), settings=settings)) as url:
        client = httpx.Client(base_url=url, timeout=30)
        assert client.get("/v1/runs", headers=bob).status_code == 401
        status = client.get(f"/v1/runs/{request_id}", headers=alice).json()
        assert (status["source"], status["status"], status["output"]) == (
            "store",
            "completed",
            "Hello!",
        )
        assert [r["request_id"] for r in client.get("/v1/runs", headers=alice).json()["runs"]] == [
            request_id
        ]
        assert client.get("/v1/sessions/mine", headers=alice).json()["runs"] == [request_id]
