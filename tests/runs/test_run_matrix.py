"""The same scenarios through every front door, in both engines: the matrix the run layer
promises. Rows are the doors — REST, SSE, the WebSocket, the OpenAI facade (plain and
streaming), channels inbound, MCP over HTTP (the service's ``mcp`` door: ``ask``) — and
columns the checks: the answer reaches the caller, another
user gets 404 for the run, a spent daily quota is refused, the per-user limit on runs in flight
is refused, a cancel stops the run, and an approval is asked, answered (approved and denied) and
honoured. Each engine runs the same agent from the same config: the step model (an
OpenAI-compatible endpoint) and a ``step`` tool that writes to PostgreSQL; in process in the
service, and queued on real ``hermes-agent worker`` processes over Redis.

A cell is ``ok`` when the door did what the check says, ``n/a`` where the door has no such
operation (the facade and channels cannot cancel or answer an approval); the table is printed.
An MCP ``ask`` run is a run of the service like any other (REST sees it, cancels it); nobody
can be asked over MCP, so its approvals are the door's policy: ``approve`` lists ``step`` in
the approvals world (the policy's denial is tests/mcp/test_mcp_gate.py's).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import ClientConnection, connect

from hermes_agent.channels import signed_headers
from server_harness import sse_events, wait_for
from test_channels import Receiver
from test_channels_inbound import INBOUND_SECRET, channels
from worker_harness import STEP_SLEEP, QueuedService, step_world

pytestmark = pytest.mark.timeout(300)

DOORS = ("rest", "sse", "websocket", "facade", "facade_stream", "channel", "mcp")


class World(QueuedService):
    """One service (in process or queued) on its own database, with three API-key users:
    alice and bob, and carol whose daily quota is spent; and a channel ``relay``."""

    def __init__(self, service: QueuedService, receiver: Receiver):
        super().__init__(service.url, service.keys, service.cluster, service.db_url)
        self.receiver = receiver

    def socket(self, user: str) -> ClientConnection:
        ws_url = self.url.replace("http://", "ws://") + "/v1/ws"
        return connect(ws_url, additional_headers={"Authorization": f"Bearer {self.keys[user]}"})

    def inbound(self, user: str, text: str) -> httpx.Response:
        payload = {"text": {"content": text}, "external_userid": user}
        body = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json", **signed_headers(INBOUND_SECRET, body)}
        return httpx.post(
            f"{self.url}/v1/channels/relay/inbound", content=body, headers=headers, timeout=30
        )

    def ask(self, user: str, message: str) -> Any:
        """``ask`` over the service's MCP door as ``user`` (the SDK's client)."""
        import httpx2
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client

        async def main() -> Any:
            auth = {"Authorization": f"Bearer {self.keys[user]}"}
            http = httpx2.AsyncClient(headers=auth, timeout=60)
            transport = streamable_http_client(f"{self.url}/mcp", http_client=http)
            async with Client(transport, read_timeout_seconds=60) as client:
                return await client.call_tool("ask", {"message": message})

        return asyncio.run(asyncio.wait_for(main(), 90))


@contextlib.contextmanager
def world(tmp_path: Path, mode: str, *, approvals: bool) -> Iterator[World]:
    """The harness's ``step_world`` with every door of the matrix: channels (``relay``, whose
    twin ``relay~broke`` has no quota left) and MCP (``ask``)."""
    with (
        Receiver() as receiver,
        step_world(
            tmp_path,
            mode,
            approvals=approvals,
            quotas={"users": {"carol": {"runs_per_day": 0}, "relay~broke": {"runs_per_day": 0}}},
            channels=channels(receiver.url),
            mcp={"path": "/mcp", "approve": ["step"] if approvals else []},
        ) as service,
    ):
        yield World(service, receiver)


def until(predicate: Callable[[], Any], timeout: float = 60.0, what: str = "") -> Any:
    return wait_for(predicate, timeout, what)


def ended(w: World, rid: str, user: str = "alice") -> dict[str, Any]:
    with w.client(user) as c:
        return until(
            lambda: (
                (v := c.get(f"/v1/runs/{rid}").json())["status"]
                in ("completed", "failed", "cancelled", "timed_out", "dead")
                and v
            ),
            what=f"run {rid} to end",
        )


def ws_until(socket: ClientConnection, predicate: Callable[[dict[str, Any]], bool]) -> Any:
    while True:
        frame = json.loads(socket.recv(timeout=60))
        if predicate(frame):
            return frame


def facade_body(text: str, stream: bool = False) -> dict[str, Any]:
    return {
        "model": "hermes-agent",
        "messages": [{"role": "user", "content": text}],
        "stream": stream,
    }


def streamed_text(reply: httpx.Response) -> str:
    chunks = [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: {")]
    return "".join(
        (c.get("choices") or [{}])[0].get("delta", {}).get("content") or "" for c in chunks
    )


# -- the answer, and whose it is ------------------------------------------------------------------


def answer(w: World, door: str) -> str:
    """Start ``job <door> steps=1`` through the door, check the answer, return the run's id."""
    tag = door.replace("_", "")
    message = f"job {tag} steps=1"
    expected = f"done {tag} after 1 steps"
    with w.client("alice") as alice:
        if door == "rest":
            reply = alice.post("/v1/runs", json={"message": message})
            assert reply.status_code in (200, 202), reply.text
            rid = reply.json()["request_id"]
            assert ended(w, rid)["result"]["output"].startswith(expected)
        elif door == "sse":
            with alice.stream("POST", "/v1/runs", json={"message": message, "stream": True}) as r:
                assert r.status_code == 200
                rid = r.headers["location"].rsplit("/", 1)[1]
                frames = [f for f in sse_events(r.iter_lines()) if "event" in f]
            assert frames[-1]["event"] == "result"
            assert frames[-1]["data"]["result"]["output"].startswith(expected)
        elif door == "websocket":
            with w.socket("alice") as socket:
                socket.send(json.dumps({"type": "run", "message": message}))
                rid = ws_until(socket, lambda f: f["type"] == "started")["request_id"]
                last = ws_until(socket, lambda f: f.get("event", {}).get("kind") == "result")
            assert last["event"]["result"]["output"].startswith(expected)
        elif door == "facade":
            reply = alice.post("/v1/chat/completions", json=facade_body(message))
            assert reply.status_code == 200, reply.text
            assert reply.json()["choices"][0]["message"]["content"].startswith(expected)
            rid = reply.json()["hermes"]["request_id"]
        elif door == "facade_stream":
            with alice.stream(
                "POST", "/v1/chat/completions", json=facade_body(message, True)
            ) as reply:
                assert reply.status_code == 200
                lines = list(reply.iter_lines())
            first = json.loads(next(x for x in lines if x.startswith("data: {"))[6:])
            rid = first["hermes"]["request_id"]
            text = "".join(
                json.loads(x[6:])["choices"][0]["delta"].get("content") or ""
                for x in lines
                if x.startswith("data: {") and json.loads(x[6:]).get("choices")
            )
            assert text.startswith(expected), text
        elif door == "mcp":
            reply = w.ask("alice", message)
            assert not reply.is_error, reply
            assert reply.structured_content["output"].startswith(expected), reply
            rid = reply.structured_content["request_id"]
            assert ended(w, rid)["result"]["output"].startswith(expected)  # a service run
        else:
            accepted = w.inbound("wm-1", message)
            assert accepted.status_code == 202 and accepted.json()["status"] == "accepted"
            rid = accepted.json()["request_id"]
            until(
                lambda: any(expected in json.dumps(b) for b in w.receiver.bodies()),
                what="the channel's answer",
            )
    assert w.executions(tag) == 1
    return str(rid)


def owner_only(w: World, door: str, rid: str) -> None:
    """Another user (bob; for a channel's run, alice) sees none of it: 404 everywhere."""
    other = "alice" if door == "channel" else "bob"
    with w.client(other) as c:
        assert c.get(f"/v1/runs/{rid}").status_code == 404
        assert c.get(f"/v1/runs/{rid}/events").status_code == 404
        assert c.post(f"/v1/runs/{rid}/cancel").status_code == 404
        assert all(r["request_id"] != rid for r in c.get("/v1/runs").json()["runs"])
    with w.socket(other) as socket:
        socket.send(json.dumps({"type": "cancel", "request_id": rid}))
        assert json.loads(socket.recv(timeout=30))["status"] == 404


# -- quota and limits ----------------------------------------------------------------------------


def start_status(w: World, door: str, user: str, message: str) -> tuple[int, str]:
    """Start a run through the door as ``user``: the status code and message it answered."""
    if door == "channel":
        reply = w.inbound(user, message)
        return reply.status_code, reply.text
    if door == "websocket":
        with w.socket(user) as socket:
            socket.send(json.dumps({"type": "run", "message": message}))
            frame = json.loads(socket.recv(timeout=30))
            return int(frame.get("status") or 200), json.dumps(frame)
    if door == "mcp":  # a refusal is the tool's error: "refused (<status>): <why>"
        text = w.ask(user, message).content[0].text
        return (int(text[9:12]), text) if text.startswith("refused (") else (200, text)
    with w.client(user) as c:
        if door == "rest":
            reply = c.post("/v1/runs", json={"message": message})
            return reply.status_code, reply.text
        if door == "sse":
            reply = c.post("/v1/runs", json={"message": message, "stream": True})
            return reply.status_code, reply.text
        reply = c.post("/v1/chat/completions", json=facade_body(message, door != "facade"))
        return reply.status_code, reply.text


def quota(w: World, door: str) -> None:
    user = "broke" if door == "channel" else "carol"
    code, text = start_status(w, door, user, "job q steps=1")
    if door == "channel":  # the channel answers its user politely; no run starts
        assert code == 202 and json.loads(text)["status"] == "quota_exceeded", text
    else:
        assert code == 429 and "runs_per_day" in text, (code, text)
    assert w.executions("q") == 0


def limit(w: World, door: str) -> None:
    """With one run of the user in flight, the door refuses a second (429)."""
    if door == "channel":
        w.inbound("wm-9", "job busyc steps=3")
        code, text = start_status(w, door, "wm-9", "job second steps=1")
        assert code == 429 and "in flight" in text, (code, text)
        until(lambda: w.executions("busyc") == 3, what="the channel's first run")
        time.sleep(1.0)  # its answer is delivered, and its slot freed
        return
    with w.socket("alice") as holder:  # a run of alice's in flight, started elsewhere
        holder.send(json.dumps({"type": "run", "message": f"job busy{door} steps=3"}))
        first = ws_until(holder, lambda f: f["type"] == "started")["request_id"]
        code, text = start_status(w, door, "alice", "job second steps=1")
        assert code == 429 and "in flight" in text, (code, text)
        ended(w, first)


# -- cancel and approvals -----------------------------------------------------------------------


def cancel(w: World, door: str) -> str:
    if door == "mcp":
        return cancel_mcp(w)
    if door not in ("rest", "sse", "websocket"):
        return "n/a"
    tag = f"cancel{door}"
    with w.client("alice") as alice:
        if door == "websocket":
            with w.socket("alice") as socket:
                socket.send(json.dumps({"type": "run", "message": f"job {tag} steps=4"}))
                rid = ws_until(socket, lambda f: f["type"] == "started")["request_id"]
                until(lambda: w.executions(tag) >= 1, what="the first step")
                socket.send(json.dumps({"type": "cancel", "request_id": rid}))
                answered = ws_until(socket, lambda f: f["type"] == "cancelled")
                assert answered["cancelled"] is True
        else:
            body = {"message": f"job {tag} steps=4", "stream": True}
            with alice.stream("POST", "/v1/runs", json=body) as reply:
                rid = reply.headers["location"].rsplit("/", 1)[1]
                until(lambda: w.executions(tag) >= 1, what="the first step")
                if door == "rest":
                    done = alice.post(f"/v1/runs/{rid}/cancel").json()
                    assert done["cancelled"] is True
                else:  # the stream that follows the run ends with how it stopped

                    def cancel_elsewhere(rid: str = rid) -> None:
                        with w.client("alice") as other:
                            other.post(f"/v1/runs/{rid}/cancel")

                    threading.Timer(0.1, cancel_elsewhere).start()
                frames = [f for f in sse_events(reply.iter_lines()) if "event" in f]
                assert frames[-1]["event"] == "run_stopped"
                assert frames[-1]["data"]["status"] == "cancelled"
    assert ended(w, rid)["status"] == "cancelled"
    time.sleep(2 * STEP_SLEEP)  # two steps' time, in which a run still going would run on
    assert w.executions(tag) < 4  # it stopped
    return "ok"


def cancel_mcp(w: World) -> str:
    """An MCP ``ask`` run cancelled as any run of the caller's is: its ``ask`` ends with it."""
    tag = "cancelmcp"
    asked: list[Any] = []
    caller = threading.Thread(target=lambda: asked.append(w.ask("alice", f"job {tag} steps=4")))
    caller.start()
    until(lambda: w.executions(tag) >= 1, what="the first step")
    with w.client("alice") as alice:
        running = alice.get("/v1/runs", params={"status": "running"}).json()["runs"]
        rid = running[0]["request_id"]
        assert alice.post(f"/v1/runs/{rid}/cancel").json()["cancelled"] is True
    caller.join(60)
    assert asked and asked[0].is_error, asked
    assert asked[0].structured_content["run_status"] == "cancelled", asked[0]
    assert ended(w, rid)["status"] == "cancelled"
    time.sleep(2 * STEP_SLEEP)  # two steps' time, in which a run still going would run on
    assert w.executions(tag) < 4
    return "ok"


def approval(w: World, door: str) -> str:
    """Approve one run's call and deny another's through the door; bob cannot answer."""
    if door == "mcp":  # the door's policy approves step (approve: [step])
        reply = w.ask("alice", "job apmcp steps=1")
        assert not reply.is_error, reply
        run = ended(w, reply.structured_content["request_id"])
        assert run["status"] == "completed", run
        assert [a["approved"] for a in run["result"]["approvals"]] == [True], run
        assert w.executions("apmcp") == 1
        return "approved by policy"
    if door not in ("rest", "sse", "websocket"):
        return "n/a"
    for approved in (True, False):
        tag = f"ap{door}{int(approved)}"
        message = f"job {tag} steps=1"
        with w.client("alice") as alice, w.client("bob") as bob:
            if door == "websocket":
                with w.socket("alice") as socket:
                    socket.send(json.dumps({"type": "run", "message": message}))
                    rid = ws_until(socket, lambda f: f["type"] == "started")["request_id"]
                    asked = ws_until(
                        socket, lambda f: f.get("event", {}).get("kind") == "approval_required"
                    )["event"]
                    assert (
                        bob.post(
                            f"/v1/approvals/{asked['approval_id']}", json={"approved": True}
                        ).status_code
                        == 404
                    )
                    socket.send(
                        json.dumps(
                            {
                                "type": "approve",
                                "approval_id": asked["approval_id"],
                                "approved": approved,
                            }
                        )
                    )
                    ws_until(socket, lambda f: f["type"] == "approval_answered")
                    ws_until(socket, lambda f: f.get("event", {}).get("kind") == "result")
            elif door == "sse":
                with alice.stream(
                    "POST", "/v1/runs", json={"message": message, "stream": True}
                ) as reply:
                    rid = reply.headers["location"].rsplit("/", 1)[1]
                    frames = sse_events(reply.iter_lines())
                    asked = next(f for f in frames if f.get("event") == "approval_required")
                    ref = asked["data"]["approval_id"]
                    assert (
                        bob.post(f"/v1/approvals/{ref}", json={"approved": True}).status_code == 404
                    )
                    answered = alice.post(f"/v1/approvals/{ref}", json={"approved": approved})
                    assert answered.status_code == 200, answered.text
                    assert [f for f in frames if "event" in f][-1]["event"] == "result"
            else:
                rid = alice.post("/v1/runs", json={"message": message}).json()["request_id"]
                view = f"/v1/runs/{rid}"
                pending = until(
                    lambda view=view: alice.get(view).json()["pending_approvals"],
                    what="the approval",
                )
                ref = pending[0]["approval_id"]
                assert bob.post(f"/v1/approvals/{ref}", json={"approved": True}).status_code == 404
                answered = alice.post(f"/v1/approvals/{ref}", json={"approved": approved})
                assert answered.status_code == 200, answered.text
                again = alice.post(f"/v1/approvals/{ref}", json={"approved": approved})
                assert again.status_code == 409
        assert ended(w, rid)["status"] == "completed"
        assert w.executions(tag) == (1 if approved else 0)
    return "ok"


@pytest.mark.parametrize("mode", ["in_process", "queue"])
def test_every_door_in_both_engines(tmp_path: Path, mode: str) -> None:
    table: dict[str, dict[str, str]] = {door: {} for door in DOORS}
    with world(tmp_path / "plain", mode, approvals=False) as w:
        for door in DOORS:
            row = table[door]
            rid = answer(w, door)
            row["answer"] = "ok"
            owner_only(w, door, rid)
            row["other user 404"] = "ok"
            quota(w, door)
            row["quota 429"] = "ok"
            limit(w, door)
            row["limit 429"] = "ok"
            row["cancel"] = cancel(w, door)
    with world(tmp_path / "approvals", mode, approvals=True) as w:
        for door in DOORS:
            table[door]["approve/deny"] = approval(w, door)
    print(f"\n{mode}:")
    for door, row in table.items():
        print(f"  {door:14} " + "  ".join(f"{check}={value}" for check, value in row.items()))
    allowed = ("ok", "n/a", "approved by policy")
    assert all(v in allowed for row in table.values() for v in row.values())
