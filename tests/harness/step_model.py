"""An OpenAI-compatible endpoint that drives a fixed number of tool steps, decided from the
conversation alone (so any number of runs, in any order, on any worker, get the same script).

The user message ``job <tag> steps=<k>`` (``steps`` defaults to 3) makes the model call
``step(tag=<tag>, n=<i>)`` for i = 1..k, one call per turn, then answer
``done <tag> after <k> steps; user turns seen: <u>`` — ``u`` counts the user messages in the
whole conversation, so a run can show that it saw the session's earlier turns. Every reply waits
``latency`` seconds. Plain JSON and SSE streams (OpenAI's chunk format) are both served.

    python tests/harness/step_model.py --port 8123 --latency 0.2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

_JOB = re.compile(r"job (\S+)(?: steps=(\d+))?")


def reply_for(body: dict[str, Any]) -> dict[str, Any]:
    """The assistant message for this request: a ``step`` call or the final answer."""
    messages = body["messages"]
    last_user = max(i for i, m in enumerate(messages) if m.get("role") == "user")
    found = _JOB.search(str(messages[last_user].get("content") or ""))
    tag, steps = (found.group(1), int(found.group(2) or 3)) if found else ("?", 0)
    done = sum(1 for m in messages[last_user:] if m.get("role") == "tool")
    if done < steps:
        arguments = json.dumps({"tag": tag, "n": done + 1})
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"call_{tag}_{done + 1}",
                    "type": "function",
                    "function": {"name": "step", "arguments": arguments},
                }
            ],
        }
    users = sum(1 for m in messages if m.get("role") == "user")
    return {
        "role": "assistant",
        "content": f"done {tag} after {steps} steps; user turns seen: {users}",
    }


def _tag(body: dict[str, Any]) -> str:
    users = [m for m in body["messages"] if m.get("role") == "user"]
    found = _JOB.search(str(users[-1].get("content") or "")) if users else None
    return found.group(1) if found else "?"


def _completion(message: dict[str, Any]) -> bytes:
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    return json.dumps(
        {
            "id": "chatcmpl-step",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": "step-model",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30},
        }
    ).encode()


def _stream(message: dict[str, Any]) -> bytes:
    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        data = {
            "id": "chatcmpl-step",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": "step-model",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            **extra,
        }
        return f"data: {json.dumps(data)}\n\n"

    parts = [chunk({"role": "assistant"})]
    if message.get("tool_calls"):
        call = message["tool_calls"][0]
        parts.append(chunk({"tool_calls": [{"index": 0, **call}]}))
        parts.append(chunk({}, "tool_calls"))
    else:
        parts.append(chunk({"content": message["content"]}))
        parts.append(chunk({}, "stop"))
    usage = {"prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30}
    parts.append(
        "data: "
        + json.dumps(
            {
                "id": "chatcmpl-step",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "step-model",
                "choices": [],
                "usage": usage,
            }
        )
        + "\n\n"
    )
    parts.append("data: [DONE]\n\n")
    return "".join(parts).encode()


def model_app(latency: float, seen: Counter[str] | None = None) -> Callable[..., Awaitable[None]]:
    """A bare ASGI chat-completions endpoint; ``seen`` counts the requests per job tag."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await receive()
            await send({"type": "lifespan.startup.complete"})
            await receive()
            await send({"type": "lifespan.shutdown.complete"})
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        started = time.perf_counter()
        if scope["path"].endswith("/chat/completions"):
            body = json.loads(raw)
            reply = reply_for(body)
            if seen is not None:
                seen[_tag(body)] += 1
            if body.get("stream"):
                payload, media = _stream(reply), b"text/event-stream"
            else:
                payload, media = _completion(reply), b"application/json"
            status = 200
        else:
            payload, status, media = b'{"error": "not found"}', 404, b"application/json"
        # A model's latency: each answer takes this long.
        await asyncio.sleep(max(0.0, latency - (time.perf_counter() - started)))
        headers = [(b"content-type", media), (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    return app


@contextmanager
def running_step_model(
    port: int, latency: float = 0.0, seen: Counter[str] | None = None
) -> Iterator[str]:
    """Serve the step model on loopback in a thread; yields its base URL (``.../v1``)."""
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(
            model_app(latency, seen),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            access_log=False,
            lifespan="on",
            timeout_keep_alive=300,
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the step model did not start")
        time.sleep(0.02)  # the polling pace, bounded by the deadline above
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency", type=float, default=0.2)
    options = parser.parse_args()
    import uvicorn

    uvicorn.run(
        model_app(options.latency),
        host="127.0.0.1",
        port=options.port,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=300,
    )
