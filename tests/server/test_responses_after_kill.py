"""A ``/v1/responses`` id the service announced (``response.created`` of a stream) can be
continued with ``previous_response_id`` after the service was SIGKILLed mid-run and started
again, on a SQLite file and on a PostgreSQL database of the test's own: the response exists from
its announcement, so the chain is not cut where a run was.

The model (``test_server_shutdown.model_endpoint``) holds every answer until the test releases
it, so each run is in flight when the kill comes; afterwards it calls ``pause`` and answers
"All done."."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
from pathlib import Path

import httpx

from hermes_agent.storage import open_storage
from hermes_agent.types import Message
from server_harness import free_port
from storage_backends import database_url, sql_database_url  # noqa: F401  (fixtures)
from test_serve_restart import _config, serving
from test_server_shutdown import model_endpoint

RESPONSES = 8


async def _announced_id(client: httpx.AsyncClient, ids: list[str]) -> None:
    """Start a streamed response; keep its id once ``response.created`` names it, then follow
    the stream until the kill cuts it."""
    body = {"model": "hermes-agent", "input": "long", "stream": True}
    try:
        async with client.stream("POST", "/v1/responses", json=body) as reply:
            assert reply.status_code == 200, await reply.aread()
            async for line in reply.aiter_lines():
                if line.startswith("data: "):
                    event = json.loads(line[len("data: ") :])
                    if event.get("type") == "response.created":
                        ids.append(event["response"]["id"])
    except httpx.HTTPError:
        pass  # the kill


def _announce_then_kill(url: str, process: object) -> list[str]:
    async def scenario() -> list[str]:
        ids: list[str] = []
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            tasks = [asyncio.create_task(_announced_id(client, ids)) for _ in range(RESPONSES)]
            async with asyncio.timeout(30):
                while len(ids) < RESPONSES:
                    failed = [t for t in tasks if t.done() and t.exception() is not None]
                    if failed:
                        raise failed[0].exception()  # type: ignore[misc]
                    await asyncio.sleep(0.02)  # the polling pace, bounded by the timeout above
            process.send_signal(signal.SIGKILL)  # type: ignore[attr-defined]
            await asyncio.wait_for(asyncio.gather(*tasks), 30)
        return ids

    return asyncio.run(scenario())


def test_a_response_announced_before_a_kill_can_be_continued(tmp_path: Path, sql_url: str) -> None:
    released = threading.Event()
    with model_endpoint(released) as model_url:
        port = free_port()
        config = _config(tmp_path, model_url, sql_url, port)
        url = f"http://127.0.0.1:{port}"
        with serving(tmp_path, config, port, "first") as process:
            ids = _announce_then_kill(url, process)
        assert len(set(ids)) == RESPONSES
        released.set()
        with serving(tmp_path, config, port, "second"), httpx.Client(base_url=url) as client:
            answers = [
                client.post(
                    "/v1/responses",
                    json={"model": "hermes-agent", "input": "short", "previous_response_id": rid},
                    timeout=60,
                )
                for rid in ids
            ]
    unresumable = [a.text for a in answers if a.status_code != 200]
    assert unresumable == [], f"{len(unresumable)} of {RESPONSES} ids could not be continued"
    assert all(a.json()["status"] == "completed" for a in answers)
    assert [a.json()["previous_response_id"] for a in answers] == ids


def test_a_created_session_exists_with_no_message_and_takes_turns(db_url: str) -> None:
    """What the facade writes when it announces an id, on every store."""
    storage = open_storage(db_url)
    try:
        sessions = storage.sessions
        assert not sessions.exists("resp_1")
        sessions.create("resp_1")
        assert sessions.exists("resp_1") and sessions.load("resp_1") == []
        sessions.append("resp_1", [Message("user", "hi"), Message("assistant", "hello")])
        sessions.create("resp_1")  # made already: its turns stay
        assert [m.content for m in sessions.load("resp_1")] == ["hi", "hello"]
        assert sessions.delete("resp_1") and not sessions.exists("resp_1")
    finally:
        storage.close()
