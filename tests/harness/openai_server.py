"""A scripted OpenAI-compatible server for tests: real HTTP over a real socket, no model.

It records every request body it receives and answers each one with the next reply a test pushed
(or ``default`` when none is queued), as JSON or as an SSE stream in OpenAI's chunk format.

    with running_server() as server:
        server.push(text("Hello"), tool_calls(call("get_weather", {"city": "Paris"})))
        model = OpenAICompatible("test-model", base_url=server.base_url)
        ...
        assert server.requests[0]["messages"][0]["role"] == "system"
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from server_harness import free_port as free_port  # one definition, shared

MODEL = "scripted-model"
PIECE = 4  # characters per streamed delta: small, so boundaries fall inside tags and JSON


@dataclass
class Reply:
    """One scripted answer; ``tool_calls`` hold raw ``arguments`` strings (maybe malformed)."""

    content: str | None = None
    tool_calls: list[dict[str, str]] = field(default_factory=list)
    status: int = 200
    prompt_tokens: int = 11
    completion_tokens: int = 7
    stream_usage: bool = True  # False: ignore stream_options, like some servers do
    delay: float = 0.0  # seconds to wait before answering (for timeout tests)
    abort: bool = False  # stream: answer 200, then end the stream with no event at all
    raw: str | None = None  # the whole body as given (a malformed or non-JSON answer)...
    raw_type: str = "application/json"  # ...with this content type
    raw_chunks: list[str] | None = None  # stream: these data lines as given, then [DONE]
    cut: bool = False  # end cleanly mid-answer: a stream with no finish_reason and no [DONE],
    # or the first half of the JSON body
    done: bool = True  # stream: send [DONE] at the end (False: only the finish_reason says so)
    finish: bool = True  # stream: send the finish_reason (False: only [DONE] says so)
    pace: float = 0.0  # stream: seconds between pieces of the content (a slow model)


def text(content: str, **kwargs: Any) -> Reply:
    return Reply(content=content, **kwargs)


def call(name: str, arguments: dict[str, Any] | str, call_id: str = "") -> dict[str, str]:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id or f"call_{name}", "name": name, "arguments": raw}


def tool_calls(*calls: dict[str, str], content: str | None = None, **kwargs: Any) -> Reply:
    return Reply(content=content, tool_calls=list(calls), **kwargs)


def error(status: int, message: str = "scripted failure") -> Reply:
    return Reply(content=message, status=status)


class ScriptedServer:
    """State shared between a test and the app: the reply queue and the requests received."""

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[dict[str, Any]] = []
        self.default = text("ok")
        self.base_url = ""
        self.app = self._build_app()

    def push(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    def reset(self) -> None:
        self.replies.clear()
        self.requests.clear()

    @property
    def last(self) -> dict[str, Any]:
        return self.requests[-1]

    def _build_app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat_completions(request: Request) -> Response:
            body = await request.json()
            self.requests.append(body)
            reply = self.replies.popleft() if self.replies else self.default
            if reply.delay:
                await asyncio.sleep(reply.delay)  # a slow model, as the reply asks
            if reply.status != 200:
                failure = {"error": {"message": reply.content, "type": "server_error"}}
                return JSONResponse(failure, status_code=reply.status)
            if body.get("stream") and reply.raw_chunks is not None:
                return StreamingResponse(_raw_sse(reply.raw_chunks), media_type="text/event-stream")
            if reply.raw is not None:
                return Response(reply.raw, media_type=reply.raw_type)
            if body.get("stream") and reply.abort:
                return StreamingResponse(_nothing(), media_type="text/event-stream")
            if body.get("stream"):
                usage = reply.stream_usage and (body.get("stream_options") or {}).get(
                    "include_usage"
                )
                return StreamingResponse(_sse(reply, bool(usage)), media_type="text/event-stream")
            if reply.cut:
                whole = json.dumps(_completion(reply))
                return Response(whole[: len(whole) // 2], media_type="application/json")
            return JSONResponse(_completion(reply))

        return app


def _usage(reply: Reply) -> dict[str, int]:
    total = reply.prompt_tokens + reply.completion_tokens
    return {
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": reply.completion_tokens,
        "total_tokens": total,
    }


def _completion(reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {k: c[k] for k in ("name", "arguments")},
            }
            for c in reply.tool_calls
        ]
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": 0,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if reply.tool_calls else "stop",
            }
        ],
        "usage": _usage(reply),
    }


def _pieces(value: str) -> list[str]:
    return [value[i : i + PIECE] for i in range(0, len(value), PIECE)]


async def _sse(reply: Reply, include_usage: bool) -> AsyncIterator[str]:
    def event(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        choices = [{"index": 0, "delta": delta, "finish_reason": finish}] if delta or finish else []
        chunk = {
            "id": "chatcmpl-scripted",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": MODEL,
            "choices": choices,
            **extra,
        }
        return f"data: {json.dumps(chunk)}\n\n"

    yield event({"role": "assistant", "content": ""})
    for piece in _pieces(reply.content or ""):
        if reply.pace:
            await asyncio.sleep(reply.pace)  # a streaming model's pace, as the reply asks
        yield event({"content": piece})
    for index, c in enumerate(reply.tool_calls):
        head = {"index": index, "id": c["id"], "type": "function"}
        yield event({"tool_calls": [{**head, "function": {"name": c["name"], "arguments": ""}}]})
        for piece in _pieces(c["arguments"]):
            yield event({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    if reply.cut:
        return  # the connection closes cleanly, as a proxy that gave up would close it
    if reply.finish:
        yield event({}, "tool_calls" if reply.tool_calls else "stop")
    if include_usage:
        yield event({}, usage=_usage(reply))
    if reply.done:
        yield "data: [DONE]\n\n"


async def _raw_sse(chunks: list[str]) -> AsyncIterator[str]:
    for data in chunks:
        yield f"data: {data}\n\n"
    yield "data: [DONE]\n\n"


async def _nothing() -> AsyncIterator[str]:
    return
    yield  # an async generator that yields nothing: the stream ends at once


@contextmanager
def running_server() -> Iterator[ScriptedServer]:
    """Serve a fresh ``ScriptedServer`` with uvicorn on 127.0.0.1 in a background thread."""
    scripted = ScriptedServer()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(scripted.app, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the scripted OpenAI server did not start")
        time.sleep(0.01)  # the polling pace, bounded by the deadline above
    scripted.base_url = f"http://127.0.0.1:{port}/v1"
    try:
        yield scripted
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


# -- the fixtures of the modules that test against it ---------------------------------------


@pytest.fixture(name="running", scope="module")
def running_fixture() -> Iterator[ScriptedServer]:
    """One scripted server for a test module: ``from openai_server import running_fixture,
    server_fixture  # noqa: F401`` makes ``running`` and ``server`` its fixtures."""
    with running_server() as server:
        yield server


@pytest.fixture(name="server")
def server_fixture(running: ScriptedServer) -> ScriptedServer:
    """The module's scripted server, its replies and requests cleared for this test."""
    running.reset()
    return running


def hermes_call(name: str, **arguments: Any) -> str:
    """The ``<tool_call>`` block a Hermes model writes to call ``name``."""
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'
