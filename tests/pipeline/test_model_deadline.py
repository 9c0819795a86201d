"""A model request has a total deadline, not only a per-read timeout: an endpoint that answers
with a byte a second (a real socket server of the test's own) cannot hold a run forever — plain
or streamed, from the library and over the service."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from hermes_agent import Agent
from hermes_agent.errors import ModelError
from hermes_agent.models.base import ModelSettings
from hermes_agent.models.openai import OpenAICompatible, Transport
from hermes_agent.runs.status import ending_status
from hermes_agent.server import ServiceSettings, create_app
from hermes_agent.types import Message
from server_harness import serve

DRIP_S = 1.0  # one byte a second: never slower than a read timeout of a few seconds
DEADLINE_S = 2.0


class DrippingServer:
    """Answers every request with headers at once, then its body one byte per ``DRIP_S``."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.stopping = threading.Event()
        self.requests = 0
        self.bytes_sent = 0
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                0,
            )
            while len(body) < length:
                body += conn.recv(65536)
            self.requests += 1
            streaming = b'"stream":true' in body.replace(b" ", b"")
            kind = b"text/event-stream" if streaming else b"application/json"
            payload = (
                b'data: {"id":"x","object":"chat.completion.chunk","created":0,"model":"m",'
                b'"choices":[{"index":0,"delta":{"content":"never"}}]}\n\n'
                if streaming
                else b'{"id":"x","object":"chat.completion","created":0,"model":"m",'
                b'"choices":[{"index":0,"message":{"role":"assistant","content":"never"}}]}'
            )
            try:
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: " + kind + b"\r\nContent-Length: "
                    + str(len(payload) * 100).encode() + b"\r\n\r\n"
                )  # fmt: skip
                for byte in payload * 100:
                    if self.stopping.wait(DRIP_S):
                        return
                    conn.sendall(bytes([byte]))
                    self.bytes_sent += 1
            except OSError:
                return  # the client gave up: what the deadline is for

    def close(self) -> None:
        self.stopping.set()
        self.sock.close()


@contextmanager
def dripping() -> Iterator[DrippingServer]:
    server = DrippingServer()
    try:
        yield server
    finally:
        server.close()


def model(server: DrippingServer, transport: Transport = "httpx") -> OpenAICompatible:
    # A read timeout well above the drip: only the deadline can end the request.
    return OpenAICompatible(
        "m",
        base_url=server.base_url,
        timeout=5.0,
        max_retries=2,
        deadline=DEADLINE_S,
        transport=transport,
    )


@pytest.mark.parametrize("transport", ["httpx", "aiohttp"])
@pytest.mark.parametrize("streamed", [False, True], ids=["complete", "stream"])
def test_a_trickling_endpoint_is_cut_at_the_deadline(streamed: bool, transport: Transport) -> None:
    async def ask(m: OpenAICompatible) -> None:
        messages, settings = [Message("user", "hi")], ModelSettings()
        if streamed:
            async for _ in m.stream(messages, [], settings):
                pass
        else:
            await m.complete(messages, [], settings)

    async def asked(m: OpenAICompatible) -> None:
        try:
            await ask(m)
        finally:
            await m.aclose()

    with dripping() as server:
        m = model(server, transport)
        started = time.monotonic()
        with pytest.raises(ModelError, match="deadline of 2 s") as caught:
            asyncio.run(asked(m))
        took = time.monotonic() - started
        assert DEADLINE_S - 0.1 <= took < DEADLINE_S + 1.5, took
        assert server.requests == 1  # cut, not retried past the deadline
        assert server.bytes_sent >= 1  # it was trickling, not silent: reads kept arriving
        assert "trickling" in str(caught.value)


def test_the_default_deadline_is_every_attempt_s_timeout() -> None:
    m = OpenAICompatible("m", base_url="http://127.0.0.1:9/v1", timeout=10.0, max_retries=2)
    assert m.deadline == 10.0 * 3 + 8.0 * 2 + 1.0  # every attempt, the backoffs, a second


def test_a_run_against_a_trickling_endpoint_fails_in_time_and_saves_no_turn(
    tmp_path: Path,
) -> None:
    with dripping() as server:
        agent = Agent(model=model(server), storage=f"sqlite:///{tmp_path / 'state.db'}")
        started = time.monotonic()
        result = agent.run("hello", session_id="s")
        assert time.monotonic() - started < DEADLINE_S + 3
        assert result.status == 502 and "deadline" in (result.error or "")
        assert ending_status(result) == "failed"
        assert agent.sessions.load("s") == []  # the failure is not history
        agent.close()


@pytest.mark.parametrize("transport", ["httpx", "aiohttp"])
def test_a_service_run_against_a_trickling_endpoint_ends_failed(
    tmp_path: Path, transport: Transport
) -> None:
    with dripping() as server:
        agent = Agent(model=model(server, transport), storage=f"sqlite:///{tmp_path / 'state.db'}")
        with serve(create_app(agent=agent, settings=ServiceSettings(auth="none"))) as url:
            client = httpx.Client(base_url=url, timeout=30)
            started = time.monotonic()
            answer = client.post("/v1/runs", json={"message": "hello"})
            assert time.monotonic() - started < DEADLINE_S + 3
            assert answer.status_code == 502, answer.text
            run = client.get(f"/v1/runs/{answer.headers['X-Run-Id']}").json()
            assert run["status"] == "failed" and "deadline" in run["error"]
        agent.close()
