"""Graceful shutdown under load, for real: a service process (uvicorn, SQLite or PostgreSQL)
with 100 runs in flight against an OpenAI-compatible endpoint that takes 0.3 s per answer gets
SIGTERM. Then, from the store the process left behind:

- every run either completed (its trail ends with its output, its turn is in its session) or
  is recorded as cancelled (its trail ends with a ``stopped`` record; its session holds
  nothing of the turn);
- every trail is whole: records numbered 0..n-1, prompts followed by their completions, tool
  results by their call records, JSON where JSON belongs, one ending;
- the process exited within the grace period (plus the time to cancel), after its lifespan
  shutdown completed, and the processes of a subprocess tool that was running are gone;
- every client that followed a run got its ending (the result, or ``run_stopped``).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from hermes_agent.audit.records import AuditRecord, Role
from hermes_agent.runs.in_process import stored_status
from hermes_agent.storage import open_storage
from processes import alive
from server_harness import await_for, free_port, wait_for
from storage_backends import sql_database_url  # noqa: F401  (the sql_url fixture)

RUNS = 100
GRACE_S = 6.0
"""Long enough that the runs meant to finish do so on a loaded 2-core machine: here they need
about 1.1 s (short) and 2.1 s (medium) of waiting, and 100 runs starting at once on PostgreSQL
have taken 2 s more than that."""
MODEL_LATENCY_S = 0.3
KINDS = ["short"] * 40 + ["medium"] * 30 + ["long"] * 26 + ["nap"] * 4
"""What each run's tool does: ``short`` waits 0.5 s and ``medium`` 1.5 s (a run takes two model
answers more: both end within the grace period), ``long`` waits 60 s and ``nap`` runs a
subprocess tool that sleeps 60 s (both are cancelled)."""
PAUSE_S = {"short": 0.5, "medium": 1.5, "long": 60.0}

SERVICE = """
import asyncio, os, subprocess, sys
from pathlib import Path

import uvicorn

from hermes_agent import Agent, Tool
from hermes_agent.models.openai import OpenAICompatible
from hermes_agent.server import ServiceSettings, create_app

model_url, storage_url, port, grace = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])


async def pause(seconds: float) -> str:
    \"\"\"Wait a while.\"\"\"
    await asyncio.sleep(seconds)  # slow work on purpose: a run in flight at SIGTERM
    return "paused"


def nap(pid_file: str) -> str:
    \"\"\"Start a sleeper and wait for it.\"\"\"
    sleeper = subprocess.Popen(["sleep", "60"])
    Path(pid_file).write_text(f"{os.getpid()} {sleeper.pid}")
    sleeper.wait()
    return "woke"


agent = Agent(
    model=OpenAICompatible("scripted-model", base_url=model_url, api_key="test", max_retries=0),
    storage=storage_url,
)
agent.add_tool(Tool.from_function(pause, timeout=120))
agent.add_tool(Tool.from_function(nap, execution_mode="subprocess", timeout=120))
settings = ServiceSettings(
    auth="none",
    port=port,
    shutdown_grace_s=grace,
    max_runs_in_flight=500,
    max_runs_in_flight_per_user=500,
)
app = create_app(agent=agent, settings=settings)


class Server(uvicorn.Server):
    # On SIGTERM, start the runs' grace period at once, while uvicorn waits for connections:
    # clients following a run then receive its ending before their connection closes.
    async def shutdown(self, sockets=None):
        draining = asyncio.ensure_future(app.state.manager.shutdown(settings.shutdown_grace_s))
        await super().shutdown(sockets)
        await draining


config = uvicorn.Config(
    app,
    host="127.0.0.1",
    port=port,
    log_level="info",
    access_log=False,
    timeout_graceful_shutdown=int(grace) + 5,
)
Server(config).run()
"""


# -- the model: an OpenAI-compatible endpoint that takes its time --------------------------------


def _answer(body: dict[str, Any]) -> str:
    """A tool call for the user's message, then (once a tool result is in) the answer."""
    messages = body["messages"]
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    if any(m["role"] == "tool" for m in messages[last_user:]):
        return "All done."
    kind, _, argument = str(messages[last_user]["content"]).partition(" ")
    if kind == "nap":
        name, arguments = "nap", {"pid_file": argument}
    else:
        name, arguments = "pause", {"seconds": PAUSE_S[kind]}
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def _chunk(delta: dict[str, Any], finish: str | None = None) -> str:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    return f"data: {json.dumps({**chunk, 'choices': [choice]})}\n\n"


async def _stream(content: str) -> AsyncIterator[str]:
    # The answer in one piece: the load is the runs, not the parsing of many small deltas.
    yield _chunk({"role": "assistant", "content": content})
    yield _chunk({}, "stop")
    yield "data: [DONE]\n\n"


def _model_app(released: threading.Event) -> FastAPI:
    """The model; it holds every answer until ``released`` is set, so that every run is in
    flight (waiting for its first answer) when the service gets SIGTERM."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await request.json()
        content = _answer(body)
        await await_for(released.is_set, 120, "the test releasing the model")
        await asyncio.sleep(MODEL_LATENCY_S)  # a model's pace: runs are in flight at SIGTERM
        if body.get("stream"):
            return StreamingResponse(_stream(content), media_type="text/event-stream")
        message = {"role": "assistant", "content": content}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        answer = {"id": "c", "object": "chat.completion", "created": 0, "model": "m"}
        return JSONResponse({**answer, "choices": [choice], "usage": usage})

    return app


@contextmanager
def model_endpoint(released: threading.Event) -> Iterator[str]:
    port = free_port()
    config = uvicorn.Config(
        _model_app(released), host="127.0.0.1", port=port, log_level="warning", lifespan="off"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started or not thread.is_alive(), 20, "the model starting")
    assert server.started, "the model did not start"
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(10)


# -- the clients: each starts a run and follows it -----------------------------------------------


@dataclass
class Followed:
    kind: str
    session_id: str
    request_id: str = ""
    ending: str = ""
    """``result``, ``run_stopped:<status>``, or ``dropped: <error>``."""


async def _follow(
    client: httpx.AsyncClient, run: Followed, message: str, started: asyncio.Queue[str]
) -> None:
    body = {"message": message, "session_id": run.session_id, "stream": True}
    try:
        async with client.stream("POST", "/v1/runs", json=body) as reply:
            assert reply.status_code == 200, await reply.aread()
            async for line in reply.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = json.loads(line[len("data: ") :])
                if not run.request_id:
                    run.request_id = data["request_id"]
                    started.put_nowait(run.request_id)
                if data["kind"] == "result":
                    run.ending = "result"
                elif data["kind"] == "run_stopped":
                    run.ending = f"run_stopped:{data['status']}"
    except httpx.HTTPError as exc:
        run.ending = f"dropped: {type(exc).__name__}"
    if not run.request_id:
        started.put_nowait("")


def _load_and_stop(
    url: str,
    process: subprocess.Popen[bytes],
    runs: list[Followed],
    pid_dir: Path,
    released: threading.Event,
) -> tuple[float, int]:
    """Start every run, SIGTERM the service once all are in flight; (seconds from SIGTERM to
    the process's exit, its return code)."""

    async def scenario() -> tuple[float, int]:
        limits = httpx.Limits(max_connections=RUNS + 10, max_keepalive_connections=RUNS + 10)
        async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
            started: asyncio.Queue[str] = asyncio.Queue()
            tasks = []
            for index, run in enumerate(runs):
                message = run.kind if run.kind != "nap" else f"nap {pid_dir / f'{index}.pid'}"
                tasks.append(asyncio.create_task(_follow(client, run, message, started)))
            for _ in runs:  # every run is in flight (it sent its first event)
                assert await asyncio.wait_for(started.get(), 60), "a run did not start"
            assert not [run for run in runs if run.ending]  # all 100 in flight
            exited: list[float] = []
            # A thread of its own notices the exit at once, however busy this loop is.
            watcher = threading.Thread(
                target=lambda: (process.wait(60), exited.append(time.monotonic()))
            )
            process.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            watcher.start()
            released.set()  # the model answers from now on
            await asyncio.wait_for(asyncio.gather(*tasks), 60)
            await asyncio.to_thread(watcher.join, 60)
            assert exited, "the service did not exit"
            return exited[0] - sent, process.returncode

    return asyncio.run(scenario())


# -- what the store must show ------------------------------------------------------------------


STAGES = {"InputParser", "ThoughtGenerator", "ToolSelector", "ToolExecutor", "OutputRenderer"}
JSON_ROLES = {Role.SELECTION.value, Role.TOOL_CALLS.value, Role.STOPPED.value}


def check_trail(records: list[AuditRecord], request_id: str) -> str:
    """Assert that one run's trail is whole; returns how it ended (completed or cancelled)."""
    assert records, f"{request_id}: no records"
    # The service's first record (written before anything of the run), then the run's own.
    assert (records[0].stage, records[0].role, records[0].seq) == ("RunManager", "accepted", -1)
    own = records[1:]
    assert [r.seq for r in own] == list(range(len(own))), f"{request_id}: seq gaps"
    assert {r.request_id for r in records} == {request_id}
    assert len({r.session_id for r in records}) == 1
    assert (own[0].stage, own[0].role) == ("InputParser", Role.USER.value)
    steps = [r.step for r in records]
    assert steps == sorted(steps), f"{request_id}: steps out of order"
    times = [r.timestamp_ns for r in records]
    assert times == sorted(times), f"{request_id}: timestamps out of order"
    for index, record in enumerate(records):
        assert record.status == ("ok" if record.status_code < 400 else "error"), record
        assert record.stage in STAGES | {"RunManager"}, record
        assert record.role in {role.value for role in Role}, record
        if record.role in JSON_ROLES:
            json.loads(record.content)  # raises on half-written JSON
        following = records[index + 1] if index + 1 < len(records) else None
        if record.role in (Role.PROMPT.value, Role.PROMPT_ADDED.value):
            assert following is not None and following.role == Role.COMPLETION.value, record
            assert following.step == record.step
        if record.role == Role.TOOL.value:
            assert following is not None and following.role == Role.TOOL_CALLS.value, record
    endings = [r for r in records if r.role in (Role.OUTPUT.value, Role.STOPPED.value)]
    assert len(endings) == 1 and endings[0] is records[-1], f"{request_id}: {len(endings)} endings"
    last = records[-1]
    if last.role == Role.OUTPUT.value:
        completion = next(r for r in reversed(records) if r.role == Role.COMPLETION.value)
        assert (last.stage, last.status_code) == ("OutputRenderer", 200), completion.content
        assert last.content == "All done."
        return "completed"
    stopped = json.loads(last.content)
    assert (last.stage, last.status_code) == ("RunManager", 409)
    assert stopped["error"] == "the service shut down before the run finished"
    return str(stopped["status"])


def test_sigterm_during_100_runs_completes_or_records_each_and_leaves_whole_trails(
    tmp_path: Path, sql_url: str
) -> None:
    program = tmp_path / "service_app.py"
    program.write_text(textwrap.dedent(SERVICE))
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "service.log").open("w+")
    runs = [Followed(kind, f"s{index}") for index, kind in enumerate(KINDS)]
    released = threading.Event()
    with model_endpoint(released) as model_url:
        process = subprocess.Popen(
            [sys.executable, str(program), model_url, sql_url, str(port), str(GRACE_S)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=tmp_path,
        )
        try:

            def healthy() -> bool:
                assert process.poll() is None, "the service exited at start"
                try:
                    return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
                except httpx.HTTPError:
                    return False

            wait_for(healthy, 60, "the service answering /healthz")
            exit_s, returncode = _load_and_stop(url, process, runs, pid_dir, released)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    log.seek(0)
    output = log.read()
    log.close()

    # The process: a graceful exit (uvicorn re-raises SIGTERM once it has shut down).
    assert returncode in (0, -signal.SIGTERM), output
    assert "Application shutdown complete" in output, output
    # The runs had their grace period, and no more than it takes to cancel the rest (the
    # bound is loose: a loaded test machine is slow to cancel, and to notice an exit).
    assert GRACE_S <= exit_s < GRACE_S + 6, f"exited {exit_s:.2f} s after SIGTERM"

    # The clients: each saw its run's ending before its connection closed.
    endings = Counter(run.ending for run in runs)
    assert set(endings) <= {"result", "run_stopped:cancelled"}, endings

    # The store: every run completed or is recorded as cancelled, with a whole trail.
    storage = open_storage(sql_url)
    try:
        summaries = {row["request_id"]: row for row in storage.requests(limit=10 * RUNS)}
        assert set(summaries) == {run.request_id for run in runs}  # nothing else or missing
        states: dict[str, str] = {}
        for run in runs:
            state = check_trail(storage.records(run.request_id), run.request_id)
            states[run.request_id] = state
            # What GET /v1/runs/{id} answers once the run is known only from the store.
            summary = summaries[run.request_id]
            assert stored_status(summary["status"], summary["status_code"]) == state
            assert run.ending == ("result" if state == "completed" else "run_stopped:cancelled")
            messages = storage.sessions.load(f"local:{run.session_id}")
            if state == "completed":  # the turn was saved whole
                assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant"]
                assert messages[-1].content == "All done."
            else:  # and a cancelled one left nothing of itself in the session
                assert messages == []
    finally:
        storage.close()
    by_kind = Counter((run.kind, states[run.request_id]) for run in runs)
    assert by_kind[("short", "completed")] == KINDS.count("short")
    assert by_kind[("long", "cancelled")] == KINDS.count("long")
    assert by_kind[("nap", "cancelled")] == KINDS.count("nap")
    if sql_url.startswith("sqlite"):
        database = sqlite3.connect(sql_url.removeprefix("sqlite:///"))
        try:
            assert database.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        finally:
            database.close()

    # The subprocess tool's processes went with the cancelled runs.
    naps = [tuple(map(int, f.read_text().split())) for f in pid_dir.iterdir()]
    assert naps, "no nap tool got to run"
    assert not [pid for pair in naps for pid in pair if alive(pid)]

    completed = sum(1 for state in states.values() if state == "completed")
    print(
        f"\n{sql_url.partition(':')[0]}: {completed} completed, {RUNS - completed} cancelled "
        f"of {RUNS}; exit {exit_s:.2f} s after SIGTERM (grace {GRACE_S:g} s); "
        f"medium runs completed: {by_kind[('medium', 'completed')]}"
    )
