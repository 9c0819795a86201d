"""A model's reply is complete only when it says so: a stream that ends cleanly with no
``finish_reason`` and no ``[DONE]`` (a proxy that gave up, a server that hung up mid-answer) is
the model's failure (502), never a short answer — for the model itself, through every door of
the in-process service (REST and SSE, the OpenAI facade streamed and not) and in a worker.
Each is tried against a real OpenAI-compatible server on loopback that cuts its replies."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from websockets.sync.client import connect

from hermes_agent import Agent
from hermes_agent.errors import ModelError
from hermes_agent.models.base import ModelSettings
from hermes_agent.models.llamacpp.model import _check_ended
from hermes_agent.models.openai import OpenAICompatible
from hermes_agent.runs.request import QueuedRequest
from hermes_agent.server import ServiceSettings, create_app
from hermes_agent.storage.sql import SqlStorage
from hermes_agent.types import Message, StreamChunk
from hermes_agent.worker.runner import RunWorker
from hermes_agent.worker.store import RunStore
from openai_server import (  # noqa: F401  (the fixtures)
    Reply,
    ScriptedServer,
    call,
    running_fixture,
    server_fixture,
    text,
    tool_calls,
)
from server_harness import serve, sse_events

ASK = [Message("user", "What is the answer?")]
WHOLE = "The answer is forty-two, as the guide says."
CUT = Reply(content=WHOLE, cut=True)


def model_for(server: ScriptedServer, **options: Any) -> OpenAICompatible:
    return OpenAICompatible("test-model", base_url=server.base_url, max_retries=0, **options)


def stream(model: OpenAICompatible) -> list[StreamChunk]:
    async def run() -> list[StreamChunk]:
        try:
            return [c async for c in model.stream(ASK, [], ModelSettings())]
        finally:
            await model.aclose()

    return asyncio.run(run())


def complete(model: OpenAICompatible) -> str:
    async def run() -> str:
        try:
            return (await model.complete(ASK, [], ModelSettings())).text
        finally:
            await model.aclose()

    return asyncio.run(run())


# -- the model ---------------------------------------------------------------------------------


def test_a_stream_cut_mid_answer_is_a_model_error(server: ScriptedServer) -> None:
    server.push(CUT)
    with pytest.raises(ModelError, match=r"no finish_reason and no \[DONE\]"):
        stream(model_for(server))


def test_a_native_call_cut_mid_arguments_is_a_model_error(server: ScriptedServer) -> None:
    server.push(tool_calls(call("get_weather", {"city": "Paris"}), cut=True))
    with pytest.raises(ModelError, match="cut short"):
        stream(model_for(server, mode="native"))


@pytest.mark.parametrize(
    ("finish", "done"), [(True, True), (True, False), (False, True)], ids=["both", "finish", "done"]
)
def test_a_stream_that_says_it_ended_is_the_answer(
    server: ScriptedServer, finish: bool, done: bool
) -> None:
    """Either sign is enough: some servers send no ``[DONE]``, a few no ``finish_reason``."""
    server.push(Reply(content=WHOLE, finish=finish, done=done))
    assert "".join(c.text for c in stream(model_for(server))) == WHOLE


@pytest.mark.parametrize("finish", ["error", "abort"])
def test_a_reply_that_ends_in_a_failure_is_a_model_error(
    server: ScriptedServer, finish: str
) -> None:
    chunk = {"choices": [{"index": 0, "delta": {"content": "The ans"}}]}
    last = {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
    server.push(Reply(raw_chunks=[json.dumps(chunk), json.dumps(last)]))
    with pytest.raises(ModelError, match=f"finish_reason='{finish}'"):
        stream(model_for(server))
    whole = {"choices": [{"index": 0, "message": {"content": "The ans"}, "finish_reason": finish}]}
    server.push(Reply(raw=json.dumps(whole)))
    with pytest.raises(ModelError, match="failed mid-answer"):
        complete(model_for(server))


def test_a_reply_body_cut_short_is_a_model_error(server: ScriptedServer) -> None:
    server.push(CUT)
    with pytest.raises(ModelError, match="cut short"):
        complete(model_for(server))


def test_the_embedded_model_needs_a_finish_reason() -> None:
    _check_ended("stop")
    _check_ended("length")
    with pytest.raises(ModelError, match="without a finish reason"):
        _check_ended(None)


# -- the in-process service: every door, nothing saved ----------------------------------------


def _rest(client: httpx.Client, session: str) -> str:
    reply = client.post("/v1/runs", json={"message": "question", "session_id": session})
    return str(reply.json()["status"])


def _rest_streamed(client: httpx.Client, session: str) -> str:
    body = {"message": "question", "session_id": session, "stream": True}
    with client.stream("POST", "/v1/runs", json=body) as response:
        frames = [f for f in sse_events(response.iter_lines()) if "comment" not in f]
    assert frames[-1]["event"] == "result"
    return str(frames[-1]["data"]["result"]["status"])


def _websocket(url: str, session: str) -> str:
    with connect(url.replace("http", "ws") + "/v1/ws") as socket:
        socket.send(json.dumps({"type": "run", "message": "question", "session_id": session}))
        while True:
            frame = json.loads(socket.recv(timeout=30))
            if frame.get("event", {}).get("kind") == "result":
                return str(frame["event"]["result"]["status"])


def _responses(client: openai.OpenAI, session: str) -> str:
    """The streamed Responses API: its last event, and whether it says the reply was cut."""
    headers = {"X-Hermes-Session-Id": session}
    try:
        events = list(
            client.responses.create(
                model="hermes-agent", input="question", stream=True, extra_headers=headers
            )
        )
    except openai.APIError as exc:
        return "error" + (": cut short" if "cut short" in str(exc) else "")
    last = events[-1]
    cut = "cut short" in last.model_dump_json()
    return str(last.type) + (": cut short" if cut else "")


def _facade(client: openai.OpenAI, session: str, *, streamed: bool) -> str:
    """What the client was told: the error it got, or the answer's finish_reason."""
    headers = {"X-Hermes-Session-Id": session}
    messages: Any = [{"role": "user", "content": "question"}]
    try:
        if not streamed:
            reply = client.chat.completions.create(
                model="hermes-agent", messages=messages, extra_headers=headers
            )
            return f"finish_reason {reply.choices[0].finish_reason}"
        chunks = client.chat.completions.create(
            model="hermes-agent", messages=messages, stream=True, extra_headers=headers
        )
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
        return f"finish_reason {next((f for f in finishes if f), None)}"
    except openai.APIStatusError as exc:
        return f"error {exc.status_code}" + (": cut short" if "cut short" in str(exc) else "")
    except openai.APIError as exc:  # an error frame in the stream
        return "error" + (": cut short" if "cut short" in str(exc) else "")


def test_cut_streams_through_every_door_end_failed_and_save_nothing(
    server: ScriptedServer, tmp_path: Path
) -> None:
    """24 runs whose model reply is cut short, four through each door: every client is told
    the run failed, none is stored ``completed``, and no session holds a word of them."""
    server.default = CUT
    agent = Agent(model=model_for(server), storage=f"sqlite:///{tmp_path / 'state.db'}")
    told: dict[str, str] = {}
    with serve(create_app(agent=agent, settings=ServiceSettings(auth="none"))) as url:
        client = httpx.Client(base_url=url, timeout=30)
        sdk = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        for i in range(4):
            told[f"rest-{i}"] = _rest(client, f"rest-{i}")
            told[f"sse-{i}"] = _rest_streamed(client, f"sse-{i}")
            told[f"chat-{i}"] = _facade(sdk, f"chat-{i}", streamed=False)
            told[f"chat-stream-{i}"] = _facade(sdk, f"chat-stream-{i}", streamed=True)
            told[f"ws-{i}"] = _websocket(url, f"ws-{i}")
            told[f"responses-{i}"] = _responses(sdk, f"responses-{i}")
        runs = client.get("/v1/runs", params={"limit": 100}).json()["runs"]
        stored = {row["session_id"]: row["status"] for row in runs}
        saved = {
            sid: len(client.get(f"/v1/sessions/{sid}").json().get("messages", [])) for sid in stored
        }
    agent.close()
    completed = sorted(sid for sid, status in stored.items() if status == "completed")
    assert len(stored) == 24
    kept = sum(1 for count in saved.values() if count)
    assert completed == [], f"{len(completed)} of 24 stored completed, {kept} saved: {told}"
    failures = {"502", "error 502: cut short", "error: cut short", "response.failed: cut short"}
    assert set(told.values()) <= failures, told
    assert set(saved.values()) == {0}, saved
    # Both kinds of request met the cut: streamed (SSE) and whole (JSON) bodies.
    assert {bool(r.get("stream")) for r in server.requests} == {True, False}


# -- the queued engine -------------------------------------------------------------------------


def test_a_worker_run_whose_reply_is_cut_ends_failed_with_no_session_turn(
    server: ScriptedServer, url: str, cleanup: list[Any]
) -> None:
    server.default = CUT
    agent = Agent(model_for(server), storage=url)
    assert isinstance(agent.storage, SqlStorage)
    store = RunStore(agent.storage, max_redeliveries=1)
    worker = RunWorker(agent, store, lambda _rid: None, name="w:1", lease_ttl=5.0)
    cleanup.extend([agent, worker])
    rid = store.add("s-cut", QueuedRequest(message="question"))
    assert worker.execute(rid) == "failed"
    run = store.get(rid)
    assert run is not None and run.status == "failed"
    assert agent.sessions.load("s-cut") == []
