"""A real uvicorn server on a free loopback port, in a thread, for the service tests; and a
scripted agent whose answers depend on the message."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import uvicorn
from fastapi import FastAPI

from hermes_agent import Agent, ScriptedModel
from hermes_agent.testing import tool_call as call
from hermes_agent.tools.registry import Tool
from hermes_agent.types import Message

if TYPE_CHECKING:
    from hermes_agent.server import ServiceSettings


def script(messages: Sequence[Message], _tools: Sequence[dict[str, Any]]) -> str:
    """hello → an answer; ``slow`` → a 1 s tool, then an answer; ``delete X`` → a call that
    needs approval; ``slow delete X`` → the slow tool first; ``nap F`` → a subprocess tool
    that starts ``sleep 60`` (pid in F) and waits."""
    user = next(m.content for m in reversed(messages) if m.role == "user")
    done = sum(1 for m in messages[messages.index(_last_user(messages)) :] if m.role == "tool")
    words = str(user).split()
    if words[0] == "slow" and done == 0:
        return call("wait", seconds=1.0)
    if "delete" in words and done == (1 if words[0] == "slow" else 0):
        return call("delete_file", path=words[-1])
    if words[0] == "nap" and done == 0:
        return call("nap", pid_file=words[1])
    if done:
        return f"done: {str(messages[-1].content)[:200]}"
    return "Hello!"


def _last_user(messages: Sequence[Message]) -> Message:
    return next(m for m in reversed(messages) if m.role == "user")


async def wait(seconds: float) -> str:
    """Wait a while."""
    await asyncio.sleep(seconds)  # slow work on purpose: a run to act on while it is in flight
    return "waited"


def delete_file(path: str) -> str:
    """Delete a file."""
    return f"deleted {path}"


def nap(pid_file: str) -> str:
    """Start a sleeper and wait for it."""
    child = subprocess.Popen(["sleep", "60"])
    Path(pid_file).write_text(str(child.pid))
    child.wait()
    return "woke"


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def user_calls(messages: Sequence[Message], _tools: Sequence[dict[str, Any]]) -> str:
    """A model that makes the call written in the user message, then says it is done."""
    if messages[-1].role == "tool":
        return "done"
    return str(next(m for m in reversed(messages) if m.role == "user").content)


def scripted(*replies: str) -> ScriptedModel:
    """A scripted model that gives ``replies`` in turn."""
    return ScriptedModel(list(replies))


def make_agent(storage: str) -> Agent:
    """The scripted agent the service tests serve."""
    agent = Agent(model=ScriptedModel(script, chunk_size=8), storage=storage)
    agent.add_tool(Tool.from_function(wait))
    agent.add_tool(Tool.from_function(delete_file, requires_approval=True))
    agent.add_tool(Tool.from_function(nap, execution_mode="subprocess", timeout=120))
    return agent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    """Run ``app`` on uvicorn in a thread; yields its base URL; stops it (lifespan included)."""
    port = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=3
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started or not thread.is_alive(), 20, "the test server starting")
    if not server.started:
        raise RuntimeError("the test server did not start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def post_in_background(
    client: httpx.Client, body: dict[str, Any]
) -> tuple[threading.Thread, list[httpx.Response]]:
    """``POST /v1/runs`` with ``body`` from a thread, for a test that acts while the run is in
    flight; the answer lands in the list once the thread is joined."""
    answers: list[httpx.Response] = []
    poster = threading.Thread(target=lambda: answers.append(client.post("/v1/runs", json=body)))
    poster.start()
    return poster, answers


def only_run_id(client: httpx.Client) -> str:
    """The id of the one run ``GET /v1/runs`` lists for the caller."""
    (request_id,) = [row["request_id"] for row in client.get("/v1/runs").json()["runs"]]
    return str(request_id)


def sse_events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """Parse SSE frames: ``{"id", "event", "data"}`` per frame; comments as ``{"comment"}``."""
    frame: dict[str, Any] = {}
    for line in lines:
        if line == "":
            if frame:
                yield frame
            frame = {}
        elif line.startswith(":"):
            yield {"comment": line[1:].strip()}
        else:
            field, _, value = line.partition(": ")
            frame[field] = json.loads(value) if field == "data" else value


def process_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (gone, or a zombie nobody reaped yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 10.0,
    what: str | Callable[[], str] = "condition",
    *,
    pace: float = 0.01,
) -> Any:
    """Poll ``predicate`` until it holds, and return what it returned; fail saying ``what``
    never held once ``timeout`` seconds have passed (``what`` may be a function, asked then:
    the state the wait ended in). The tests' one way to wait for something to happen (no fixed
    sleep before an assertion); ``pace`` is the pause between polls."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {_said(what)}")
        time.sleep(pace)  # the polling pace
    return value


async def await_for(
    predicate: Callable[[], Any],
    timeout: float = 10.0,
    what: str | Callable[[], str] = "condition",
    *,
    pace: float = 0.01,
) -> Any:
    """``wait_for`` for a coroutine: polls without blocking the event loop."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {_said(what)}")
        await asyncio.sleep(pace)  # the polling pace
    return value


def _said(what: str | Callable[[], str]) -> str:
    return what if isinstance(what, str) else what()


def poll_run(client: httpx.Client, request_id: str, timeout: float = 10.0) -> dict[str, Any]:
    """GET the run until it is over."""
    seen: list[dict[str, Any]] = []

    def over() -> dict[str, Any] | None:
        seen.append(client.get(f"/v1/runs/{request_id}").json())
        return seen[-1] if seen[-1]["status"] not in ("running", "waiting_approval") else None

    ended: dict[str, Any] = wait_for(
        over, timeout, lambda: f"run {request_id} to end (still {seen[-1]['status']})", pace=0.05
    )
    return ended


def asking(client: httpx.Client, request_id: str, timeout: float = 60.0) -> dict[str, Any]:
    """GET the run until it asks for an approval; its view then (``pending_approvals``)."""

    def view() -> dict[str, Any] | None:
        body: dict[str, Any] = client.get(f"/v1/runs/{request_id}").json()
        return body if body["pending_approvals"] else None

    found: dict[str, Any] = wait_for(
        view, timeout, f"run {request_id} asking for an approval", pace=0.05
    )
    return found


def pid_from(path: Path) -> int:
    wait_for(lambda: path.exists() and path.read_text().strip() != "")
    return int(path.read_text())


def bearer(key: str) -> dict[str, str]:
    """The header that presents ``key``."""
    return {"Authorization": f"Bearer {key}"}


def local(**overrides: Any) -> ServiceSettings:
    """Service settings without authentication (``auth: none``), with ``overrides``."""
    from hermes_agent.server import ServiceSettings

    return ServiceSettings(auth="none", **overrides)
