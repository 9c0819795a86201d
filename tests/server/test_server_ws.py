"""``/v1/ws`` over a real uvicorn: two runs in flight on one socket, an approval answered on
the socket, cancel, errors, and a dropped socket that cancels nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import connect

from hermes_agent.runs.keys import MemoryKeyStore
from hermes_agent.server import ServiceSettings, create_app
from server_harness import make_agent, poll_run, serve


def test_two_runs_on_one_socket_with_an_approval_answered_there(tmp_path: Path) -> None:
    keys = MemoryKeyStore()
    key = keys.create("alice")
    settings = ServiceSettings(approval_policy="deny", approval_timeout_s=30)
    app = create_app(
        agent=make_agent(f"sqlite:///{tmp_path / 'state.db'}"), settings=settings, keys=keys
    )
    with serve(app) as url:
        ws_url = url.replace("http", "ws") + "/v1/ws"
        with connect(ws_url, additional_headers={"Authorization": f"Bearer {key}"}) as socket:
            socket.send(json.dumps({"type": "run", "message": "slow delete /a", "client_ref": 1}))
            socket.send(json.dumps({"type": "run", "message": "hello", "client_ref": 2}))
            socket.send(json.dumps({"type": "cancel", "request_id": "nope"}))
            results: dict[Any, dict[str, Any]] = {}
            errors = []
            kinds: set[str] = set()
            while len(results) < 2:
                message = json.loads(socket.recv(timeout=20))
                if message["type"] == "error":
                    errors.append(message)
                elif message["type"] == "event":
                    event = message["event"]
                    kinds.add(event["kind"])
                    if event["kind"] == "approval_required":
                        assert event["arguments"] == {"path": "/a"}
                        socket.send(
                            json.dumps(
                                {
                                    "type": "approve",
                                    "approval_id": event["approval_id"],
                                    "approved": True,
                                }
                            )
                        )
                    elif event["kind"] == "result":
                        results[message["client_ref"]] = event["result"]
            assert [e["status"] for e in errors] == [404]
            assert {"text_delta", "tool_call_parsed"} <= kinds  # a socket gets the pieces
            assert results[2]["output"] == "Hello!"
            assert results[1]["approvals"][0]["approved"] is True
            assert results[1]["tool_calls"][-1]["status_code"] == 200

        # A socket that drops mid-run cancels nothing: the run finishes.
        with connect(ws_url, additional_headers={"Authorization": f"Bearer {key}"}) as socket:
            socket.send(json.dumps({"type": "run", "message": "slow"}))
            started = json.loads(socket.recv(timeout=20))
            assert started["type"] == "started"
        client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"})
        final = poll_run(client, started["request_id"])
        assert final["status"] == "completed"

        # No key: the handshake is refused.
        try:
            with connect(ws_url) as socket:
                socket.recv(timeout=5)
            refused = False
        except Exception:
            refused = True
        assert refused
