"""A cancel says what it stopped and what it could not: over a real uvicorn service with a
SQLite trail, a run cancelled while a sync in-process tool runs answers ``cancelled`` and names
the call still running; the tool's late result is written to the trail after the run's
ending (``late_result``), and the run still reads as cancelled, from memory and from the
store. An async tool is stopped by the cancel: nothing is left running. With ``execution:
queue`` the answer names the calls the run's journal shows started."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from hermes_agent import Agent, ScriptedModel
from hermes_agent.audit.records import Role
from hermes_agent.audit.trace_view import trace_view
from hermes_agent.runs.keys import MemoryKeyStore, SqlKeyStore
from hermes_agent.server import ServiceSettings, create_app
from hermes_agent.storage import open_storage
from hermes_agent.testing import tool_call as call
from hermes_agent.tools.registry import Tool
from hermes_agent.types import Message
from hermes_agent.worker.store import RunStore
from server_harness import only_run_id, post_in_background, serve, wait_for
from step_model import running_step_model
from worker_harness import REDIS, cluster, free_port

started = threading.Event()
release = threading.Event()
async_started = threading.Event()


def slow_write(path: str) -> str:
    """Write a file, slowly (a sync tool: once started, nothing can stop it)."""
    started.set()
    release.wait(30)
    Path(path).write_text("written")
    return f"wrote {path}"


async def slow_fetch(url: str) -> str:
    """Fetch a page, slowly (an async tool: a cancel stops it)."""
    async_started.set()
    await asyncio.sleep(30)  # slow work on purpose: a cancel stops it
    return "fetched"


def _script(messages: Sequence[Message], _tools: Sequence[dict[str, Any]]) -> str:
    user = next(m for m in reversed(messages) if m.role == "user")
    if messages[-1].role == "tool":
        return "done"
    words = str(user.content).split()
    if words[0] == "write":
        return call("slow_write", path=words[1])
    return call("slow_fetch", url=words[1])


def _app(tmp_path: Path, keys: MemoryKeyStore) -> Any:
    agent = Agent(model=ScriptedModel(_script), storage=f"sqlite:///{tmp_path / 'trail.db'}")
    agent.add_tool(Tool.from_function(slow_write, timeout=60))
    agent.add_tool(Tool.from_function(slow_fetch, timeout=60))
    settings = ServiceSettings(keys_url="memory://")
    return create_app(agent=agent, settings=settings, keys=keys)


def test_a_cancel_names_the_sync_call_it_cannot_stop_and_its_late_result_is_in_the_trail(
    tmp_path: Path,
) -> None:
    started.clear()
    release.clear()
    keys = MemoryKeyStore()
    alice = keys.create("alice")
    target = tmp_path / "out.txt"
    app = _app(tmp_path, keys)
    storage = app.state.manager.agent.storage
    with serve(app) as base:
        client = httpx.Client(
            base_url=base, timeout=30, headers={"Authorization": f"Bearer {alice}"}
        )
        poster, answers = post_in_background(client, {"message": f"write {target}"})
        try:
            assert started.wait(10)
            request_id = only_run_id(client)
            cancel = client.post(f"/v1/runs/{request_id}/cancel").json()
            assert (cancel["cancelled"], cancel["status"]) == (True, "cancelled"), cancel
            (running,) = cancel["still_running"]
            assert running["name"] == "slow_write" and running["call_id"], running
            view = client.get(f"/v1/runs/{request_id}").json()
            assert "still running: slow_write" in view["error"], view
            assert not target.exists()  # the tool is still at work
        finally:
            release.set()
        poster.join(10)
        assert answers[0].status_code == 409, answers[0].text

        def late() -> list[Any]:
            return [r for r in storage.records(request_id) if r.role == Role.LATE_RESULT]

        wait_for(lambda: bool(late()))
        assert target.read_text() == "written"  # the write happened after the cancel...
        (record,) = late()  # ...and the trail says so, after the run's ending
        roles = [r.role for r in storage.records(request_id)]
        assert roles[-2:] == [Role.STOPPED, Role.LATE_RESULT], roles
        content = json.loads(record.content)
        assert content["call_id"] == running["call_id"]
        assert (content["name"], content["status"]) == ("slow_write", "success")
        assert content["result"] == f"wrote {target}"
        view = trace_view(storage.records(request_id))  # the console's reading of the trail
        assert view.pipeline_records == len(roles) - 1 and view.output is None  # not accepted
        after = client.get(f"/v1/runs/{request_id}").json()
        assert after["status"] == "cancelled" and after["still_running"] == []
    # Another process on the same trail reads the run from its records alone: the late
    # record does not hide the ending.
    with serve(_app(tmp_path, keys)) as base:
        headers = {"Authorization": f"Bearer {alice}"}
        stored = httpx.get(f"{base}/v1/runs/{request_id}", headers=headers, timeout=30).json()
    assert (stored["source"], stored["status"]) == ("store", "cancelled"), stored


def test_a_cancel_stops_an_async_tool_and_leaves_nothing_running(tmp_path: Path) -> None:
    async_started.clear()
    keys = MemoryKeyStore()
    alice = keys.create("alice")
    app = _app(tmp_path, keys)
    with serve(app) as base:
        client = httpx.Client(
            base_url=base, timeout=30, headers={"Authorization": f"Bearer {alice}"}
        )
        poster, _ = post_in_background(client, {"message": "fetch https://example.test"})
        assert async_started.wait(10)
        request_id = only_run_id(client)
        cancel = client.post(f"/v1/runs/{request_id}/cancel").json()
        poster.join(10)
    assert cancel == {"request_id": request_id, "cancelled": True, "status": "cancelled"}


# -- queued: the worker's journal says which calls started ------------------------------------


@pytest.mark.timeout(240)
def test_a_queued_cancel_names_the_started_call_and_a_cut_turn_counts_its_reservation(
    tmp_path: Path, pg_url: str
) -> None:
    """With ``execution: queue``: a run cancelled while its sync tool runs on the worker
    answers with that call (from the run's journal) and counts exactly the turn it took; a
    run cancelled inside its first model turn, which no stored event counts, counts its
    reservation."""
    keys = SqlKeyStore(pg_url)
    try:
        alice = keys.create("alice")
    finally:
        keys.close()
    quotas = {"tokens_per_day": 10**6, "tokens_reserved_per_run": 1_000}
    settings = ServiceSettings(execution="queue", auth="keys", keepalive_s=0.2, quotas=quotas)
    store = RunStore(open_storage(pg_url))
    with (
        running_step_model(free_port(), latency=1.0) as model_url,
        cluster(tmp_path, pg_url, REDIS, model_url, step_sleep=5) as c,
    ):
        c.start_worker(concurrency=2)
        c.wait_ready()
        app = create_app(tmp_path / "config.yaml", settings=settings)
        auth = {"Authorization": f"Bearer {alice}"}
        try:
            with serve(app) as url, httpx.Client(base_url=url, headers=auth, timeout=60) as client:
                rid = client.post("/v1/runs", json={"message": "job a steps=1"}).json()[
                    "request_id"
                ]

                def call_started() -> bool:
                    entries = store.journal_entries(rid)
                    return any(
                        k.startswith("call/") and s == "started" for k, (s, _) in entries.items()
                    )

                wait_for(call_started, timeout=60)
                cancel = client.post(f"/v1/runs/{rid}/cancel").json()
                assert (cancel["cancelled"], cancel["status"]) == (True, "cancelled"), cancel
                assert cancel["still_running"] == [
                    {"name": "step", "call_id": f"{rid}/0/0", "step": 0}
                ], cancel
                spent = app.state.manager.quotas.usage("alice").tokens
                assert spent == 30  # its one model turn, exactly: no reservation left

                cut = client.post("/v1/runs", json={"message": "job b steps=1"}).json()
                cut_id = cut["request_id"]
                wait_for(lambda: (run := store.get(cut_id)) is not None and run.claims > 0)
                cancelled = client.post(f"/v1/runs/{cut_id}/cancel").json()
                assert cancelled["cancelled"] is True, cancelled
                assert app.state.manager.quotas.usage("alice").tokens == 30 + 1_000
        finally:
            store.storage.close()
