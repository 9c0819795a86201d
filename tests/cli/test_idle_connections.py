"""Connections that say nothing cannot crowd out other users, as an attacker with no key would
try: on ``hermes-agent serve``'s uvicorn (a real one, on loopback), three times
``limit_concurrency`` connections are opened and left silent — and opened again as the
service closes them — while another client makes ordinary requests. uvicorn alone counts every
open connection towards the limit, so nearly all of those requests got 503; now silent
connections do not count (and the oldest are closed past the limit), so fewer than 5% fail."""

from __future__ import annotations

import resource
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn

from hermes_agent.cli.serve import uvicorn_config
from hermes_agent.server import ServiceSettings, create_app
from server_harness import free_port, make_agent, wait_for

LIMIT = 100
SILENT = 3 * LIMIT
REQUESTS = 80


def _room_for(descriptors: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < descriptors:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(descriptors, hard), hard))


@contextmanager
def _serve(limit: int) -> Iterator[tuple[uvicorn.Server, int]]:
    """The service under ``serve``'s uvicorn configuration, on loopback, in a thread."""
    settings = ServiceSettings(auth="none", limit_concurrency=limit, port=free_port())
    app = create_app(agent=make_agent("memory://"), settings=settings)
    server = uvicorn.Server(uvicorn_config(app, settings, "error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 20)
    try:
        yield server, settings.port
    finally:
        server.should_exit = True
        thread.join(20)


def test_requests_in_progress_still_meet_limit_concurrency() -> None:
    with _serve(4) as (server, port), httpx.Client(timeout=10) as client:
        base = f"http://127.0.0.1:{port}"
        slow = [
            threading.Thread(
                target=client.post, args=(f"{base}/v1/runs",), kwargs={"json": {"message": "slow"}}
            )
            for _ in range(4)
        ]
        for poster in slow:
            poster.start()
        wait_for(lambda: len(server.server_state.tasks) >= 4, 10)
        assert httpx.get(f"{base}/healthz", timeout=5).status_code == 503
        for poster in slow:
            poster.join(20)
        assert client.get(f"{base}/healthz").status_code == 200


def test_silent_connections_do_not_fail_other_users_requests() -> None:
    _room_for(4 * SILENT + 256)  # both ends of each connection live in this process
    with _serve(LIMIT) as (_, port):
        _flood_and_measure(port)


def _flood_and_measure(port: int) -> None:
    stop, flooding = threading.Event(), threading.Event()
    held: list[socket.socket] = []
    closed_by_service = 0

    def flood() -> None:
        """Keep SILENT connections open and silent, opening a new one for each closed."""
        nonlocal closed_by_service
        while not stop.is_set():
            while len(held) < SILENT and not stop.is_set():
                sock = socket.create_connection(("127.0.0.1", port), timeout=5)
                sock.setblocking(False)
                held.append(sock)
            if len(held) >= SILENT and closed_by_service > 0:
                flooding.set()  # full again after the service closed some: the flood is on
            for sock in list(held):
                try:
                    if sock.recv(1) == b"":
                        raise ConnectionResetError
                except BlockingIOError:
                    continue
                except OSError:
                    held.remove(sock)
                    sock.close()
                    closed_by_service += 1
            stop.wait(0.02)

    attacker = threading.Thread(target=flood, daemon=True)
    attacker.start()
    try:
        # Told by the flood itself: a poll of ``held`` from here can miss the moment it is full.
        assert flooding.wait(60), f"no flood: {len(held)} held, {closed_by_service} closed"
        failed = 0
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
            for _ in range(REQUESTS):
                try:
                    failed += client.get("/healthz").status_code != 200
                except httpx.HTTPError:
                    failed += 1
                time.sleep(0.01)  # a steady client's pace, all through the flood
        assert failed / REQUESTS < 0.05, f"{failed} of {REQUESTS} requests failed"
        # The flood was going on all the while: the service kept closing the oldest.
        assert closed_by_service >= SILENT - LIMIT, closed_by_service
    finally:
        stop.set()
        attacker.join(10)
        for sock in held:
            sock.close()
