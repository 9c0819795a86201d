"""Service hardening, round 2: each an attack over a real uvicorn on loopback.

- A key revoked while its WebSocket and event streams are open: the socket refuses its next
  message (an error, then close 1008) and the streams end at their next keep-alive — one opened
  with a stream token too; the run they watched is untouched.
- Stream tokens: one run's event stream and nothing else, for a while.
- The WebSocket checks ``Origin`` under ``auth: keys`` (a key alone does not let another site's
  page open one); a loopback service answers 421 for a foreign ``Host``; every answer carries
  the security headers.
- A user holds at most ``max_streams_per_user`` streams and sockets.
- ``serve``'s uvicorn closes clients that never finish their headers (slowloris), and its
  ``limit_concurrency`` bounds the connections held.
- One signed channel request, sent to two service processes on one store and again after a
  restart: one run.
- No documented way of running the service writes a key to its log.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from hermes_agent.channels import signed_headers
from hermes_agent.channels.store import SqlChannelStore
from hermes_agent.cli.serve import uvicorn_config
from hermes_agent.runs.keys import KeyStore, SqlKeyStore, key_id_of
from hermes_agent.server import ServiceSettings, create_app
from server_harness import free_port, make_agent, serve, wait_for
from test_readme_commands import hermes_agent_command

TESTS = Path(__file__).resolve().parents[1] / "harness"


@dataclass
class Service:
    url: str
    keys: KeyStore
    app: Any

    def client(self, key: str) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, timeout=30, headers={"Authorization": f"Bearer {key}"}
        )

    @property
    def ws(self) -> str:
        return self.url.replace("http://", "ws://") + "/v1/ws"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    folder = tmp_path_factory.mktemp("hardening2")
    url = f"sqlite:///{folder / 'state.db'}"
    keys = SqlKeyStore(url)
    settings = ServiceSettings(
        keepalive_s=0.3,
        key_check_s=0.2,
        approval_policy="wait",
        approval_timeout_s=120,
        shutdown_grace_s=1,
        max_streams_per_user=3,
        stream_token_ttl_s=1.5,
        allowed_origins=["https://app.example"],
        allowed_hosts=["agent.internal"],
    )
    app = create_app(agent=make_agent(url), settings=settings, keys=keys)
    with serve(app) as base:
        yield Service(base, keys, app)


def _waiting_run(client: httpx.Client) -> str:
    """A run that waits for an approval (and so stays open)."""
    reply = client.post("/v1/runs", json={"message": "delete old.txt"})
    assert reply.status_code == 202, reply.text
    request_id: str = reply.json()["request_id"]
    return request_id


class _Stream(threading.Thread):
    """Reads one event stream in a thread; ``ended`` is when the server ended it."""

    def __init__(self, client: httpx.Client, path: str) -> None:
        super().__init__(daemon=True)
        self.client, self.path = client, path
        self.status = 0
        self.lines: list[str] = []
        self.opened = threading.Event()
        self.ended: float | None = None

    def run(self) -> None:
        try:
            with self.client.stream("GET", self.path) as reply:
                self.status = reply.status_code
                self.opened.set()
                for line in reply.iter_lines():
                    self.lines.append(line)
        except httpx.TransportError:  # the service stopped under a stream left open
            return
        self.ended = time.monotonic()


# -- 1. revoked keys on open connections -------------------------------------------------------


def test_a_revoked_key_stops_acting_on_its_open_socket_and_streams(service: Service) -> None:
    key, other = service.keys.create("rita"), service.keys.create("rita")
    client = service.client(key)
    request_id = _waiting_run(client)
    token = client.post(f"/v1/runs/{request_id}/stream-token").json()["token"]
    by_header = _Stream(client, f"/v1/runs/{request_id}/events")
    by_token = _Stream(
        httpx.Client(base_url=service.url, timeout=30),
        f"/v1/runs/{request_id}/events?stream_token={token}",
    )
    for stream in (by_header, by_token):
        stream.start()
        assert stream.opened.wait(10) and stream.status == 200
    with connect(service.ws, additional_headers={"Authorization": f"Bearer {key}"}) as ws:
        ws.send(json.dumps({"type": "run", "message": "hello"}))  # the key works now
        assert json.loads(ws.recv(timeout=10))["type"] == "started"
        wait_for(lambda: any("keep-alive" in line for line in by_token.lines))

        key_id = key_id_of(key)
        assert key_id is not None and service.keys.revoke(key_id)
        revoked = time.monotonic()
        time.sleep(0.3)  # past key_check_s: the socket's last check is stale now
        ws.send(json.dumps({"type": "cancel", "request_id": request_id}))
        answers = []
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                answers.append(json.loads(ws.recv(timeout=10)))
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
        errors = [a for a in answers if a["type"] == "error"]
        assert errors and errors[-1]["status"] == 401 and "revoked" in errors[-1]["detail"]
        assert not any(a["type"] == "cancelled" for a in answers)
    for stream in (by_header, by_token):
        stream.join(10)
        assert stream.ended is not None, "the stream of a revoked key is still open"
        assert stream.ended - revoked < 3.0  # keep-alive 0.3 s, check 0.2 s
        assert any("revoked" in line for line in stream.lines)
    # Nothing acted for the revoked key: the run still waits, the token opens nothing more.
    view = service.client(other).get(f"/v1/runs/{request_id}").json()
    assert view["status"] == "waiting_approval"
    again = httpx.get(f"{service.url}/v1/runs/{request_id}/events?stream_token={token}")
    assert again.status_code == 401


# -- 5. stream tokens --------------------------------------------------------------------------


def test_a_stream_token_opens_its_runs_events_only_and_only_for_a_while(service: Service) -> None:
    owner, stranger = service.keys.create("sam"), service.keys.create("tess")
    client = service.client(owner)
    mine, also_mine = _waiting_run(client), _waiting_run(client)
    granted = client.post(f"/v1/runs/{mine}/stream-token")
    assert granted.status_code == 200, granted.text
    body = granted.json()
    token = body["token"]
    assert token.startswith("hst_") and owner not in json.dumps(body)
    assert body["events_url"] == f"/v1/runs/{mine}/events?stream_token={token}"
    anonymous = httpx.Client(base_url=service.url, timeout=10)
    with anonymous.stream("GET", body["events_url"]) as stream:
        assert stream.status_code == 200
        assert next(stream.iter_lines()).startswith("id: 1")
    # Nowhere else: another run, the run itself, the API, a new token, the WebSocket.
    assert anonymous.get(f"/v1/runs/{also_mine}/events?stream_token={token}").status_code == 401
    assert anonymous.get(f"/v1/runs/{mine}?stream_token={token}").status_code == 401
    assert anonymous.get(f"/v1/runs?stream_token={token}").status_code == 401
    forged = anonymous.post(
        f"/v1/runs/{mine}/stream-token", headers={"Authorization": f"Bearer {token}"}
    )
    assert forged.status_code == 401
    with pytest.raises(InvalidStatus):
        connect(service.ws, subprotocols=["bearer", token]).close()  # type: ignore[list-item]
    # Someone else's run: no token for it.
    assert service.client(stranger).post(f"/v1/runs/{mine}/stream-token").status_code == 404
    time.sleep(1.6)  # past stream_token_ttl_s
    assert anonymous.get(body["events_url"]).status_code == 401


# -- 3. browsers: Origin on the WebSocket, Host, security headers ------------------------------


def test_the_websocket_refuses_another_sites_page_even_with_a_key(service: Service) -> None:
    key = service.keys.create("uma")
    bearer = {"Authorization": f"Bearer {key}"}
    for origin in ("http://evil.example", "null", "http://127.0.0.1:1"):
        with pytest.raises(InvalidStatus) as refused:
            connect(service.ws, origin=origin, additional_headers=bearer).close()  # type: ignore[arg-type]
        assert refused.value.response.status_code == 403, origin
    for origin in (service.url, "https://app.example"):  # its own, and a configured one
        with connect(service.ws, origin=origin, additional_headers=bearer) as ws:  # type: ignore[arg-type]
            ws.send(json.dumps({"type": "run", "message": "hello"}))
            assert json.loads(ws.recv(timeout=10))["type"] == "started"


def test_a_foreign_host_is_421_and_every_answer_carries_the_security_headers(
    service: Service,
) -> None:
    key = service.keys.create("vic")
    client = service.client(key)
    rebound = client.get("/v1/runs", headers={"Host": "evil.example"})
    assert rebound.status_code == 421 and "allowed_hosts" in rebound.json()["detail"]
    assert client.get("/v1/runs", headers={"Host": "agent.internal:8443"}).status_code == 200
    port = int(service.url.rsplit(":", 1)[1])
    with pytest.raises(InvalidStatus) as refused:  # a socket to 127.0.0.1 named evil.example
        connect(
            f"ws://evil.example:{port}/v1/ws",
            sock=socket.create_connection(("127.0.0.1", port)),
            additional_headers={"Authorization": f"Bearer {key}"},
        ).close()
    assert refused.value.response.status_code == 421
    answers = [
        httpx.get(f"{service.url}/healthz"),
        httpx.get(f"{service.url}/v1/runs"),  # 401
        client.get("/v1/runs/nope"),  # 404
        client.get("/console/"),
        rebound,
    ]
    for answer in answers:
        assert answer.headers["x-content-type-options"] == "nosniff", answer.url
        assert answer.headers["referrer-policy"] == "no-referrer"
        assert answer.headers["x-frame-options"] == "DENY"
        assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]


# -- 8. connection limits ----------------------------------------------------------------------


def test_a_user_holds_at_most_max_streams_per_user(service: Service) -> None:
    key = service.keys.create("wes")
    client = service.client(key)
    request_id = _waiting_run(client)
    streams = [_Stream(client, f"/v1/runs/{request_id}/events") for _ in range(2)]
    for stream in streams:
        stream.start()
        assert stream.opened.wait(10) and stream.status == 200
    with connect(service.ws, additional_headers={"Authorization": f"Bearer {key}"}) as ws:
        over = client.get(f"/v1/runs/{request_id}/events")  # the fourth
        assert over.status_code == 429 and "max_streams_per_user" in over.json()["detail"]
        with connect(service.ws, additional_headers={"Authorization": f"Bearer {key}"}) as extra:
            refusal = json.loads(extra.recv(timeout=10))
            assert refusal["type"] == "error" and refusal["status"] == 429
            with pytest.raises(ConnectionClosed) as closed:
                extra.recv(timeout=10)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
        # Another user is not affected.
        other = service.client(service.keys.create("xena"))
        with other.stream("GET", f"/v1/runs/{_waiting_run(other)}/events") as theirs:
            assert theirs.status_code == 200
        ws.send(json.dumps({"type": "run", "message": "hello"}))
        assert json.loads(ws.recv(timeout=10))["type"] == "started"
    wait_for(lambda: service.app.state.streams.held("wes") == 2)
    with client.stream("GET", f"/v1/runs/{request_id}/events") as again:  # one closed: room
        assert again.status_code == 200


def test_serve_closes_clients_that_never_finish_their_headers(tmp_path: Path) -> None:
    settings = ServiceSettings(auth="none", header_timeout_s=1.0, limit_concurrency=8)
    app = create_app(agent=make_agent("memory://"), settings=settings)
    config = uvicorn_config(app, settings.model_copy(update={"port": free_port()}), "warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 20)
    base = f"http://127.0.0.1:{config.port}"
    slow: list[socket.socket] = []
    try:
        for _ in range(4):  # slowloris: a header line now and then, never the end
            sock = socket.create_connection(("127.0.0.1", config.port))
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            slow.append(sock)
        time.sleep(0.3)  # the slow clients' first lines reach the server before the real request
        # The slow clients hold no slot of limit_concurrency (no request head yet, see
        # tests/cli/test_idle_connections.py), so a real request is answered ...
        assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200
        for sock in slow:
            sock.sendall(b"X-Slow: 1\r\n")
        # ... until the header timeout closes them (uvicorn alone keeps them for ever).
        for sock in slow:
            sock.settimeout(5)
            assert sock.recv(100) == b"", "a client that never ended its headers is still open"
        wait_for(lambda: httpx.get(f"{base}/healthz", timeout=5).status_code == 200, 5)
        # A WebSocket lives on past the header timeout (its own pings keep it).
        with connect(base.replace("http://", "ws://") + "/v1/ws") as ws:
            time.sleep(1.5)  # a measured spell: past the header timeout
            ws.send(json.dumps({"type": "run", "message": "hello"}))
            assert json.loads(ws.recv(timeout=10))["type"] == "started"
    finally:
        for sock in slow:
            sock.close()
        server.should_exit = True
        thread.join(20)


# -- 4. channel replays across processes and restarts -------------------------------------------

INBOUND_SECRET = "inbound-secret-for-the-replay-test-0123"
_SERVICES = f"""
import os, sys, uvicorn
from hermes_agent.server import ServiceSettings, create_app
from server_harness import make_agent

# Imports once, then forks one service process per port read from stdin (each builds its own
# app: nothing in memory is shared), printing each child's pid.
url = sys.argv[1]
channels = {{"relay": {{"type": "webhook", "url": "http://127.0.0.1:9/", "secret": "s" * 24,
    "retry": {{"attempts": 1, "backoff_s": 0.01}},
    "inbound": {{"secret": {INBOUND_SECRET!r}, "message_field": "text", "user_field": "user"}}}}}}
for line in sys.stdin:
    pid = os.fork()
    if pid == 0:
        settings = ServiceSettings(keys_url=url, channels=channels, shutdown_grace_s=1)
        app = create_app(agent=make_agent(url), settings=settings)
        uvicorn.run(app, host="127.0.0.1", port=int(line), log_level="warning")
        os._exit(0)
    print(pid, flush=True)
"""


class _Services:
    """Service processes on one store, forked from one parent that imported everything once."""

    def __init__(self, url: str, folder: Path) -> None:
        paths = [str(TESTS), os.environ.get("PYTHONPATH", "")]
        self.log = (folder / "services.log").open("w")
        self.parent = subprocess.Popen(
            [sys.executable, "-c", _SERVICES, url],
            env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        self.pids: list[int] = []

    def start(self) -> str:
        """A new service process; its URL once it answers."""
        assert self.parent.stdin is not None and self.parent.stdout is not None
        port = free_port()
        self.parent.stdin.write(f"{port}\n")
        self.parent.stdin.flush()
        self.pids.append(int(self.parent.stdout.readline()))
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _answers(url), 60)
        return url

    def stop(self) -> None:
        """Stop every service process, then the parent."""
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        self.parent.kill()
        self.parent.wait(10)
        self.log.close()


def test_a_signed_channel_request_runs_once_across_processes_and_restarts(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    SqlKeyStore(url).close()  # the tables made once, before two processes open them
    body = json.dumps({"text": "hello", "user": "wm-7"}).encode()
    headers = {"Content-Type": "application/json", **signed_headers(INBOUND_SECRET, body)}
    path = "/v1/channels/relay/inbound"
    services = _Services(url, tmp_path)
    try:
        first, second = services.start(), services.start()
        codes = [httpx.post(first + path, content=body, headers=headers).status_code]
        codes.append(httpx.post(second + path, content=body, headers=headers).status_code)
        os.kill(services.pids[0], signal.SIGTERM)  # the first one restarts: a new process
        restarted = services.start()
        codes.append(httpx.post(restarted + path, content=body, headers=headers).status_code)
    finally:
        services.stop()
    store = SqlChannelStore.open(url)
    try:
        accepted = store.entries(event="accepted")
        replays = store.entries(event="rejected_replay")
    finally:
        store.close()
    assert codes == [202, 409, 409]
    assert len(accepted) == 1 and len(replays) == 2


# -- 5. no key in the logs of the documented ways of running the service -----------------------


def test_serve_at_debug_level_writes_no_key_to_its_log(tmp_path: Path) -> None:
    home, folder = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    folder.mkdir()
    (folder / "config.yaml").write_text(
        "model:\n  provider: scripted\n  responses: ['Hello!']\n"
        f"storage:\n  url: sqlite:///{folder / 'state.db'}\n"
    )
    environment = {**os.environ, "HOME": str(home)}
    command = hermes_agent_command()
    keys = SqlKeyStore(f"sqlite:///{folder / 'state.db'}")  # where `keys create` puts them
    key = keys.create("yan")
    keys.close()
    port = free_port()
    log = folder / "serve.log"
    with log.open("w") as output:
        process = subprocess.Popen(
            [
                *command,
                "serve",
                "--config",
                "config.yaml",
                "--port",
                str(port),
                "--log-level",
                "debug",
            ],
            cwd=folder,
            env=environment,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _answers(base), 60)
        client = httpx.Client(base_url=base, timeout=30)
        run = client.post(
            "/v1/runs", json={"message": "hi"}, headers={"Authorization": f"Bearer {key}"}
        )
        request_id = run.json()["request_id"]
        assert client.get(f"/v1/runs/{request_id}/events?access_token={key}").status_code == 200
        token = client.post(
            f"/v1/runs/{request_id}/stream-token", headers={"Authorization": f"Bearer {key}"}
        ).json()["token"]
        assert client.get(f"/v1/runs/{request_id}/events?stream_token={token}").status_code == 200
        with connect(base.replace("http", "ws") + "/v1/ws", subprotocols=["bearer", key]) as ws:  # type: ignore[list-item]
            ws.send(json.dumps({"type": "run", "message": "hi"}))
            assert json.loads(ws.recv(timeout=10))["type"] == "started"
    finally:
        process.terminate()
        process.wait(30)
    written = log.read_text()
    assert '"path": "/v1/runs/' in written  # the access log is on, at debug level even
    secret = key.split(".", 1)[1]
    assert secret not in written and token.split(".", 1)[1] not in written


def _answers(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
    except httpx.TransportError:
        return False
