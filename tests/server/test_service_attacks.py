"""Attacks on the service layer, each a regression test over a real uvicorn on loopback (or,
for a race that needs a store to stall at one exact point, on the ``RunManager`` itself): odd
bytes in a channel's signature, runs started at once past the per-user limit, a run admitted
after shutdown began, readiness errors shown to anyone, WebSocket frames past the body limit
or in binary, and a chunked body past the limit. An API-key user whose id is a channel's namespace
cannot reach that channel's users' sessions (channel users are ``<namespace>~<id>``)."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from hermes_agent.channels import signed_headers
from hermes_agent.runs import Principal
from hermes_agent.runs.approvals import ApprovalBook
from hermes_agent.runs.keys import MemoryKeyStore
from hermes_agent.runs.local import RunManager, RunRejected, RunRequest
from hermes_agent.runs.metrics import ServiceMetrics
from hermes_agent.runs.quotas import DailyUsage, MemoryQuotaStore, Quotas
from hermes_agent.runs.settings import QuotaLimits, QuotaSettings
from hermes_agent.server import ServiceSettings, create_app, open_key_store
from server_harness import await_for, make_agent, serve, wait_for
from storage_backends import sqlite_url as _sqlite
from test_channels import Receiver
from test_channels_inbound import INBOUND_SECRET, app_for, message, post


def _local(**overrides: Any) -> ServiceSettings:
    return ServiceSettings(auth="none", **overrides)


# -- channels: a signature header with bytes that are not ASCII ------------------------------


def test_a_signature_that_is_not_ascii_is_refused_with_401_not_a_crash(tmp_path: Path) -> None:
    with Receiver() as receiver:
        app = app_for(tmp_path, receiver.url)
        with serve(app) as base:
            client = httpx.Client(base_url=base, timeout=30)
            body = json.dumps(message("hello")).encode()
            headers = signed_headers(INBOUND_SECRET, body)
            # Latin-1 bytes in the header: hmac.compare_digest refuses non-ASCII str (TypeError).
            raw = [
                (b"content-type", b"application/json"),
                (b"x-hermes-timestamp", headers["X-Hermes-Timestamp"].encode()),
                (b"x-hermes-signature", b"sha256=\xe9" + b"0" * 63),
            ]
            reply = client.post("/v1/channels/relay/inbound", content=body, headers=raw)
            assert reply.status_code == 401, reply.text
            assert "bad signature" in reply.json()["detail"]
            assert app.state.manager.runs == {}


# -- runs: the per-user limit on runs in flight under concurrent starts -----------------------


def test_runs_started_at_once_cannot_pass_the_per_user_limit(tmp_path: Path) -> None:
    # With a quota, admission waits on the quota store (in a thread): every start that was
    # waiting there had passed the in-flight check before any of them counted as in flight.
    settings = _local(max_runs_in_flight_per_user=1, quotas=QuotaSettings(runs_per_day=1000))
    app = create_app(agent=make_agent(_sqlite(tmp_path)), settings=settings)
    with serve(app) as base:
        codes: list[int] = []
        barrier = threading.Barrier(6)

        def start() -> None:
            with httpx.Client(base_url=base, timeout=30) as client:
                barrier.wait()
                codes.append(client.post("/v1/runs", json={"message": "slow"}).status_code)

        threads = [threading.Thread(target=start) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert sorted(codes).count(200) == 1, codes
    assert codes.count(429) == 5, codes


class _StallingQuotas(MemoryQuotaStore):
    """A quota store whose admission waits until the test lets it go."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.go = threading.Event()

    def admit(self, user_id: str, day: str, limits: QuotaLimits) -> tuple[bool, DailyUsage]:
        self.entered.set()
        self.go.wait(10)
        return super().admit(user_id, day, limits)


def test_a_run_admitted_while_the_service_shuts_down_is_refused_not_left_running(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        settings = _local(quotas=QuotaSettings(runs_per_day=10))
        manager = RunManager(settings, ServiceMetrics(), ApprovalBook())
        base = make_agent(_sqlite(tmp_path))
        manager.agent = base.fork(approver=manager.approver)
        store = _StallingQuotas()
        manager.quotas = Quotas(settings.quotas, store)
        local = Principal("local")
        starting = asyncio.create_task(manager.start(local, RunRequest(message="slow")))
        await asyncio.to_thread(store.entered.wait, 10)
        shutting = asyncio.create_task(manager.shutdown(0.0))
        await await_for(lambda: not manager.accepting, what="the shutdown begun")
        store.go.set()
        with pytest.raises(RunRejected) as refused:
            await starting
        assert refused.value.status_code == 503
        await shutting
        assert manager.in_flight() == 0
        # It never ran: it does not count against the day's quota.
        assert store.usage("local", manager.quotas.today()).runs == 0
        manager.agent.close()
        base.close()

    asyncio.run(scenario())


# -- readiness: what an unauthenticated caller learns when a store fails ----------------------


class _BrokenKeys(MemoryKeyStore):
    def ping(self) -> None:
        raise RuntimeError(
            "connection to postgresql://svc:hunter2-secret@10.0.0.5/keys failed: "
            'SELECT 1 FROM "hermes_api_keys"'
        )


def test_readyz_does_not_show_store_errors_to_anyone_who_asks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(agent=make_agent(_sqlite(tmp_path)), keys=_BrokenKeys())
    with serve(app) as base, caplog.at_level("ERROR", logger="hermes_agent.server"):
        reply = httpx.get(f"{base}/readyz", timeout=30)
    assert reply.status_code == 503
    assert reply.json()["status"] == "unavailable"
    assert "hunter2" not in reply.text and "SELECT" not in reply.text
    # The operator still learns why, in the service's log.
    assert any("hunter2" in (r.exc_text or r.getMessage()) for r in caplog.records)


# -- WebSocket: frames past the body limit, and binary frames ---------------------------------


def test_a_websocket_frame_over_max_body_bytes_is_refused_and_runs_nothing(
    tmp_path: Path,
) -> None:
    settings = _local(max_body_bytes=2000, max_message_chars=100_000)
    app = create_app(agent=make_agent(_sqlite(tmp_path)), settings=settings)
    with serve(app) as base:
        ws_url = base.replace("http", "ws") + "/v1/ws"
        with connect(ws_url, max_size=None) as socket:
            socket.send(json.dumps({"type": "run", "message": "hello " + "x" * 50_000}))
            try:
                answer = json.loads(socket.recv(timeout=10))
            except ConnectionClosed as closed:
                assert closed.rcvd is not None and closed.rcvd.code == 1009
            else:
                assert answer["type"] == "error" and answer["status"] == 413, answer
                assert "max_body_bytes" in answer["detail"]
        assert app.state.manager.runs == {}


def test_a_binary_websocket_frame_gets_an_error_and_the_socket_goes_on(tmp_path: Path) -> None:
    app = create_app(agent=make_agent(_sqlite(tmp_path)), settings=_local())
    with serve(app) as base:
        ws_url = base.replace("http", "ws") + "/v1/ws"
        with connect(ws_url) as socket:
            socket.send(b'{"type": "run", "message": "hello"}')
            answer = json.loads(socket.recv(timeout=10))
            assert answer["type"] == "error" and answer["status"] == 400, answer
            socket.send(json.dumps({"type": "run", "message": "hello"}))
            started = json.loads(socket.recv(timeout=10))
            assert started["type"] == "started", started


# -- HTTP: a chunked body (no Content-Length) past the limit ----------------------------------


def test_a_chunked_body_past_max_body_bytes_is_413(tmp_path: Path) -> None:
    settings = _local(max_body_bytes=2000)
    app = create_app(agent=make_agent(_sqlite(tmp_path)), settings=settings)

    def chunks() -> Any:
        yield b'{"message": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}'

    with serve(app) as base:
        reply = httpx.post(
            f"{base}/v1/runs",
            content=chunks(),
            headers={"Content-Type": "application/json"},
            timeout=30,
        )
    assert reply.status_code == 413, reply.text
    assert "max_body_bytes" in reply.json()["detail"]
    assert app.state.manager.runs == {}


# -- identity: an API key whose user id is a channel's namespace -------------------------------


def test_an_api_user_named_like_a_channel_cannot_reach_the_channel_users_sessions(
    tmp_path: Path,
) -> None:
    keys = open_key_store(_sqlite(tmp_path))
    relay_key = keys.create("relay")  # an operator's key for a team called "relay"
    keys.close()
    with Receiver() as receiver:
        app = app_for(tmp_path, receiver.url)
        with serve(app) as base:
            client = httpx.Client(base_url=base, timeout=30)
            accepted = post(client, message("hello", conversation_id="c1"))
            assert accepted.status_code == 202, accepted.text
            wait_for(lambda: len(receiver.requests) == 1)
            bearer = {"Authorization": f"Bearer {relay_key}"}
            listed = client.get("/v1/sessions", headers=bearer).json()["sessions"]
            assert [s["id"] for s in listed] == []
            assert client.get("/v1/sessions/wm-42:c1", headers=bearer).status_code == 404
