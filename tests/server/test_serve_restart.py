"""``hermes-agent serve`` SIGKILLed under load and started again (SQLite, and a PostgreSQL
database of the test's own): every run id the service gave out still resolves, and every run
has exactly one ending — what completed is ``completed``, what the kill cut short is
``interrupted`` (written by the restarted service), never a 404 or an open ``incomplete``.

The clients get their ids the two early ways: an event stream (``X-Run-Id`` with the headers)
and ``Prefer: respond-async`` (202 at once). The model is an OpenAI-compatible endpoint of the
test's own (``test_server_shutdown.model_endpoint``): a run calls ``pause`` (0.5 s for a
``short`` run, 60 s for a ``long`` one), then answers "All done.".

The kill comes once the short runs have completed and the store holds their endings: the
trail is written behind the runs, so a run that ended in the fraction of a second before a
kill is ended ``interrupted`` too (docs/service.md says so); waiting for the store keeps the
outcome of each run known to the test."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from hermes_agent.audit.records import Role
from hermes_agent.runs.status import FINAL_STATUSES
from hermes_agent.storage import open_storage
from server_harness import await_for, free_port
from storage_backends import sql_database_url  # noqa: F401  (the sql_url fixture)
from test_server_shutdown import model_endpoint

RUNS = 40
KINDS = ["short", "long"] * (RUNS // 2)

TOOLS = '''
import asyncio

from hermes_agent import tool


@tool
async def pause(seconds: float) -> str:
    """Wait a while."""
    await asyncio.sleep(seconds)  # slow work on purpose: a run in flight at the kill
    return "paused"
'''


def _config(tmp_path: Path, model_url: str, storage_url: str, port: int) -> Path:
    config = tmp_path / "config.yaml"
    config.write_text(
        textwrap.dedent(f"""\
            model:
              provider: openai
              base_url: {model_url}
              model_name: scripted-model
              api_key: test
              max_retries: 0
            storage:
              url: {storage_url}
            service:
              auth: none
              port: {port}
              max_runs_in_flight: 500
              max_runs_in_flight_per_user: 500
            """)
    )
    return config


@contextmanager
def serving(
    tmp_path: Path, config: Path, port: int, name: str
) -> Iterator[subprocess.Popen[bytes]]:
    """``hermes-agent serve`` as a person starts it; waits for ``/healthz``."""
    tools = tmp_path / "tools.py"
    tools.write_text(TOOLS)
    command = Path(sys.executable).parent / "hermes-agent"
    log = (tmp_path / f"{name}.log").open("wb")
    process = subprocess.Popen(
        [
            str(command),
            "serve",
            "--config",
            str(config),
            "--tools",
            str(tools),
            "--port",
            str(port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        cwd=tmp_path,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, (tmp_path / f"{name}.log").read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "serve did not start"
            time.sleep(0.1)  # the polling pace, bounded by the deadline above
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(30)
        log.close()


async def _start(client: httpx.AsyncClient, index: int, kind: str, ids: list[str]) -> None:
    """Start one run and keep its id the moment it arrives (an event stream's headers, or the
    202 of ``Prefer: respond-async``); a streaming client then follows until it is cut."""
    body = {"message": kind, "session_id": f"s{index}"}
    if index % 2:  # the even ones ask for 202 at once
        async with client.stream("POST", "/v1/runs", json={**body, "stream": True}) as reply:
            assert reply.status_code == 200
            ids.append(reply.headers["X-Run-Id"])
            try:
                async for _ in reply.aiter_lines():
                    pass
            except httpx.HTTPError:
                pass  # the kill
        return
    reply = await client.post("/v1/runs", json=body, headers={"Prefer": "respond-async"})
    assert reply.status_code == 202, reply.text
    assert reply.headers["Preference-Applied"] == "respond-async"
    ids.append(reply.headers["X-Run-Id"])


def _load_then_kill(url: str, process: subprocess.Popen[bytes], storage_url: str) -> list[str]:
    """Start every run; once every id is out and the short runs have ended (their endings in
    the store), SIGKILL."""

    async def scenario() -> list[str]:
        ids: list[str] = []
        limits = httpx.Limits(max_connections=RUNS + 10, max_keepalive_connections=RUNS + 10)
        async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
            tasks = [asyncio.create_task(_start(client, i, k, ids)) for i, k in enumerate(KINDS)]
            await await_for(lambda: len(ids) >= RUNS, 60, f"the {RUNS} runs given ids")
            completed = await _until_short_runs_end(client, ids)
            await asyncio.to_thread(_until_endings_stored, storage_url, completed)
            process.send_signal(signal.SIGKILL)
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
        return ids

    return asyncio.run(scenario())


async def _until_short_runs_end(client: httpx.AsyncClient, ids: list[str]) -> list[str]:
    """The ids of the runs the service reports completed, once half of them are."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        statuses = {rid: (await client.get(f"/v1/runs/{rid}")).json()["status"] for rid in ids}
        completed = [rid for rid, status in statuses.items() if status == "completed"]
        if len(completed) >= RUNS // 2:
            return completed
        await asyncio.sleep(0.2)  # the polling pace, bounded by the deadline above
    raise AssertionError("the short runs did not complete")


def _until_endings_stored(storage_url: str, request_ids: list[str]) -> None:
    """Until the service's trail writer has stored each run's output record, on its own: no
    flush is asked for, so this also shows it stores a burst soon after the runs pause."""
    storage = open_storage(storage_url)
    try:
        deadline = time.monotonic() + 30
        waiting = list(request_ids)
        while waiting:
            assert time.monotonic() < deadline, f"endings never stored: {waiting}"
            waiting = [
                rid
                for rid in waiting
                if not any(r.role == Role.OUTPUT.value for r in storage.records(rid))
            ]
            time.sleep(0.02)  # the polling pace, bounded by the deadline above
    finally:
        storage.close()


def test_serve_killed_under_load_and_restarted_answers_for_every_run(
    tmp_path: Path, sql_url: str
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    released = threading.Event()
    released.set()  # the model answers at once (after its latency)
    with model_endpoint(released) as model_url:
        config = _config(tmp_path, model_url, sql_url, port)
        with serving(tmp_path, config, port, "first") as process:
            ids = _load_then_kill(url, process, sql_url)
            assert process.wait(10) == -signal.SIGKILL
        with serving(tmp_path, config, port, "restarted"):
            client = httpx.Client(base_url=url, timeout=30)
            answers = {rid: client.get(f"/v1/runs/{rid}") for rid in ids}
    unknown = [rid for rid, answer in answers.items() if answer.status_code == 404]
    statuses = {rid: answer.json()["status"] for rid, answer in answers.items()}
    open_runs = [rid for rid, status in statuses.items() if status not in FINAL_STATUSES]
    counts = Counter(statuses.values())
    print(
        f"\n{sql_url.partition(':')[0]}: {len(ids)} runs given out, {counts['completed']} "
        f"completed, {counts['interrupted']} interrupted; 404 after restart: {len(unknown)}, "
        f"left without an ending: {len(open_runs)}"
    )
    assert len(set(ids)) == RUNS
    assert unknown == [], "ids the restarted service does not know"
    assert open_runs == [], "runs left without an ending"
    assert counts == {"completed": RUNS // 2, "interrupted": RUNS // 2}, counts

    storage = open_storage(sql_url)
    try:
        for rid in ids:
            records = storage.records(rid)
            assert (records[0].role, records[0].seq) == (Role.ACCEPTED.value, -1)
            endings = [r for r in records if r.role in (Role.OUTPUT.value, Role.STOPPED.value)]
            assert len(endings) == 1 and endings[0] is records[-1], f"{rid}: {len(endings)}"
            session = storage.sessions.load(records[0].session_id)
            if statuses[rid] == "interrupted":
                stopped = json.loads(records[-1].content)
                assert (records[-1].status_code, stopped["status"]) == (503, "interrupted")
                assert session == []  # nothing of a cut run reached its session
            else:
                assert [m.role for m in session] == ["user", "assistant", "tool", "assistant"]
    finally:
        storage.close()
