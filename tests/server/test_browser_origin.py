"""A web page on another origin cannot drive a service that runs with ``auth: none`` on
loopback, in a real browser (Debian's Chromium, through Playwright): the service on uvicorn,
and a second tiny HTTP server for the other site's pages — on another loopback port, and under
the name ``evil.example`` (which the browser resolves to 127.0.0.1, as DNS rebinding would).

From each page: a "simple" ``fetch`` (``mode: no-cors``, no preflight) that posts a run, a
WebSocket that starts one, and — from ``evil.example`` on the service's own port — requests
that are same-origin in the browser's eyes. Nothing runs.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from hermes_agent.server import ServiceSettings, create_app
from server_harness import make_agent, serve

CHROMIUM = "/usr/bin/chromium"

_ATTACK = """async (service) => {
    const outcome = {};
    try {
        await fetch(`${service}/v1/runs`, {
            method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"},
            body: JSON.stringify({message: "delete secrets.txt"}),
        });
        outcome.fetch = "sent";
    } catch (error) {
        outcome.fetch = "blocked";
    }
    outcome.socket = await new Promise((resolve) => {
        const socket = new WebSocket(service.replace("http", "ws") + "/v1/ws");
        socket.onopen = () => {
            socket.send(JSON.stringify({type: "run", message: "delete secrets.txt"}));
            socket.onmessage = (event) => resolve("open: " + event.data);
        };
        socket.onerror = () => resolve("refused");
        setTimeout(() => resolve("timeout"), 5000);
    });
    return outcome;
}"""

_REBOUND = """async () => {
    // Same-origin for the browser: the page's own host name, which resolves to 127.0.0.1.
    const read = await fetch("/v1/runs");
    const write = await fetch("/v1/runs", {
        method: "POST", headers: {"Content-Type": "application/json"},
        body: JSON.stringify({message: "delete secrets.txt"}),
    });
    return {read: read.status, write: write.status, body: await read.text()};
}"""


class _Page(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"<!doctype html><title>another site</title><p>hello"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture(scope="module")
def other_site() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    playwright_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"needs Chromium at {CHROMIUM} (apt-get install chromium)")
    with playwright_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--host-resolver-rules=MAP evil.example 127.0.0.1"],
        )
        try:
            yield launched
        finally:
            launched.close()


def test_a_page_of_another_origin_cannot_drive_a_service_without_keys(
    tmp_path: Path, browser: Any, other_site: int
) -> None:
    app = create_app(
        agent=make_agent(f"sqlite:///{tmp_path / 'state.db'}"),
        settings=ServiceSettings(auth="none"),
    )
    with serve(app) as service:
        port = int(service.rsplit(":", 1)[1])
        page = browser.new_page()
        try:
            outcomes = {}
            for site in (f"http://127.0.0.1:{other_site}/", f"http://evil.example:{other_site}/"):
                page.goto(site)
                outcomes[site] = page.evaluate(_ATTACK, service)
            page.goto(f"http://evil.example:{port}/console/")  # DNS rebinding
            rebound = page.evaluate(_REBOUND)
        finally:
            page.close()
        for site, outcome in outcomes.items():
            assert not outcome["socket"].startswith("open"), (site, outcome)
        assert rebound["read"] == 421 and rebound["write"] == 421, rebound
        # Nothing ran, and the service still serves its own clients.
        assert httpx.get(f"{service}/v1/runs", timeout=10).json()["runs"] == []
        assert app.state.manager.runs == {}
        page = browser.new_page()
        try:  # its own console, same origin: works
            page.goto(f"{service}/console/")
            own = page.evaluate(
                """async () => (await fetch("/v1/runs", {method: "POST",
                    headers: {"Content-Type": "application/json"},
                    body: JSON.stringify({message: "hello"})})).status"""
            )
        finally:
            page.close()
        assert own == 200


def test_the_console_follows_a_run_through_a_stream_token_not_its_key(
    tmp_path: Path, browser: Any
) -> None:
    from hermes_agent.runs.keys import MemoryKeyStore

    keys = MemoryKeyStore()
    key = keys.create("ana")
    app = create_app(agent=make_agent("memory://"), settings=ServiceSettings(), keys=keys)
    with serve(app) as service:
        run = httpx.post(
            f"{service}/v1/runs",
            json={"message": "hello"},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        ).json()
        page = browser.new_page()
        sent: list[Any] = []
        page.on("request", lambda request: sent.append(request))
        # The key is there before the console starts, as after a sign-in: set after the page
        # loaded, the console's own first request (without it) would clear it again.
        page.add_init_script(f"sessionStorage.setItem('hermes-console-key', {json.dumps(key)})")
        try:
            page.goto(f"{service}/console/")
            kinds = page.evaluate(
                """async ([key, id]) => {
                    sessionStorage.setItem("hermes-console-key", key);
                    const api = await import("/console/api.js");
                    const kinds = [];
                    await api.follow(id, {onEvent: (kind) => kinds.push(kind)});
                    return kinds;
                }""",
                [key, run["request_id"]],
            )
        finally:
            page.close()
    assert kinds[-1] == "result"
    events = [r for r in sent if "/events" in r.url]
    assert events and all("stream_token=hst_" in r.url for r in events)
    assert all(key not in r.url and "authorization" not in r.headers for r in events)
