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


def test_silent_connections_do_not_fail_other_users_requests() -> None:
    _room_for(4 * SILENT + 256)  # both ends of each connection live in this process
    settings = ServiceSettings(auth="none", limit_concurrency=LIMIT, port=free_port())
    app = create_app(agent=make_agent("memory://"), settings=settings)
    server = uvicorn.Server(uvicorn_config(app, settings, "error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 20)
    stop = threading.Event()
    held: list[socket.socket] = []
    closed_by_service = 0

    def flood() -> None:
        """Keep SILENT connections open and silent, opening a new one for each closed."""
        nonlocal closed_by_service
        while not stop.is_set():
            while len(held) < SILENT and not stop.is_set():
                sock = socket.create_connection(("127.0.0.1", settings.port), timeout=5)
                sock.setblocking(False)
                held.append(sock)
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
        wait_for(lambda: len(held) >= SILENT and closed_by_service > 0, 20)
        failed = 0
        with httpx.Client(base_url=f"http://127.0.0.1:{settings.port}", timeout=5) as client:
            for _ in range(REQUESTS):
                try:
                    failed += client.get("/healthz").status_code != 200
                except httpx.HTTPError:
                    failed += 1
                time.sleep(0.01)
        assert failed / REQUESTS < 0.05, f"{failed} of {REQUESTS} requests failed"
        # The flood was going on all the while: the service kept closing the oldest.
        assert closed_by_service >= SILENT - LIMIT, closed_by_service
    finally:
        stop.set()
        attacker.join(10)
        for sock in held:
            sock.close()
        server.should_exit = True
        thread.join(20)
