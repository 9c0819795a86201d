"""Client cost of one agent step against an OpenAI-compatible endpoint, and what tools and agents
cost to define.

A fake OpenAI-compatible server runs in its own process on loopback and answers at once (no model
time): it replies with a tool call until the conversation holds N tool results (N is read from
the user message, ``steps=N``), then with a final text. Every row runs the same workload — N
tool-calling steps and one final answer, the conversation growing by two messages per step — and
reports the run's time divided by N (microseconds, median over conversations; rows take turns so
a busy spell on the machine falls on all of them), at N=10 and N=50, as wall time and as the CPU
time of the client process (the server's is not counted):

- ``bare httpx``: ``httpx.AsyncClient.post(json=body)`` and ``response.json()``, no SDK at all;
- ``SDK create()``: ``AsyncOpenAI().chat.completions.create`` in the same loop;
- ``SDK post()``: the SDK's lower-level ``client.post`` with the body as a dict, the floor of
  any client that keeps the SDK's retries, errors and response models;
- ``model.complete``: ``OpenAICompatible.complete`` alone (native and hermes modes), the client
  side of an agent step without the pipeline;
- ``model.stream``: the same, streamed (native mode);
- ``Agent.run``: a whole agent (native and hermes modes) with one async tool, its per-run work
  (session, audit trail) included.

``--baseline REV`` also loads ``OpenAICompatible`` as it was at git revision ``REV`` and runs
the model and agent rows with it, in the same process and the same run (rows marked
``(REV)``). The definition figures are the cost of ``Tool.from_function`` for a function seen
before, of a ``Tool`` with an explicit JSON Schema seen before (an MCP toolset's case), and of an
``Agent`` with one tool (given as a ``Tool`` or as a function); for an older revision, run the
script with that checkout's ``src`` first on ``PYTHONPATH`` and ``--definitions-only``.

    python benchmarks/bench_openai_client.py                        # markdown tables
    python benchmarks/bench_openai_client.py --runs 30 --baseline d588a78 \\
        --json benchmarks/results/openai_client.json
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import itertools
import json
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import httpx
import openai
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletion

from hermes_agent import Agent, ScriptedModel, Tool
from hermes_agent.models.base import ModelSettings
from hermes_agent.models.openai import OpenAICompatible
from hermes_agent.protocol.parser import parse_completion
from hermes_agent.types import Message, ToolResult

SIZES = (10, 50)
MODEL = "fake-model"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "echo",
            "description": "Return the value.",
            "parameters": {
                "type": "object",
                "properties": {"value": {"type": "integer"}},
                "required": ["value"],
                "additionalProperties": False,
            },
        },
    }
]
SYSTEM = "You are a careful assistant. Call echo as often as asked, then answer."

# -- the fake server (runs in its own process) -------------------------------------------------

_STEPS = re.compile(rb"steps=(\d+)")


def _reply(body: bytes) -> tuple[bytes, str]:
    """The answer to one request body, and its content type."""
    wanted = _STEPS.search(body)
    done = body.count(b'"role":"tool"')
    native = b'"tools":[' in body
    if wanted is not None and done < int(wanted.group(1)):
        if native:
            message: dict[str, Any] = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{done}",
                        "type": "function",
                        "function": {"name": "echo", "arguments": json.dumps({"value": done})},
                    }
                ],
            }
        else:
            call = json.dumps({"name": "echo", "arguments": {"value": done}})
            message = {"role": "assistant", "content": f"<tool_call>\n{call}\n</tool_call>"}
    else:
        message = {"role": "assistant", "content": f"Done after {done} calls."}
    usage = {"prompt_tokens": len(body) // 4, "completion_tokens": 9, "total_tokens": 0}
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    if b'"stream":true' not in body:
        completion = {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 0,
            "model": MODEL,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": usage,
        }
        return json.dumps(completion).encode(), "application/json"
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    content = message.get("content") or ""
    deltas += [{"content": content[i : i + 8]} for i in range(0, len(content), 8)]
    for index, tool_call in enumerate(message.get("tool_calls") or []):
        function = tool_call["function"]
        opening = {"index": index, "id": tool_call["id"], "type": "function"}
        deltas.append({"tool_calls": [{**opening, "function": {"name": function["name"]}}]})
        deltas.append(
            {"tool_calls": [{"index": index, "function": {"arguments": function["arguments"]}}]}
        )
    events: list[dict[str, Any]] = [
        {"index": 0, "delta": delta, "finish_reason": None} for delta in deltas
    ]
    events.append({"index": 0, "delta": {}, "finish_reason": finish})
    chunks = [{"choices": [event]} for event in events] + [{"choices": [], "usage": usage}]
    head: dict[str, Any] = {"id": "chatcmpl-fake", "object": "chat.completion.chunk"}
    head.update(created=0, model=MODEL)
    sse = "".join(f"data: {json.dumps({**head, **chunk})}\n\n" for chunk in chunks)
    return (sse + "data: [DONE]\n\n").encode(), "text/event-stream"


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            body = await reader.readexactly(length)
            payload, kind = _reply(body)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: " + kind.encode()
                + b"\r\ncontent-length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload
            )  # fmt: skip
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _serve() -> None:
    server = await asyncio.start_server(_handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(port, flush=True)
    async with server:
        await server.serve_forever()


class FakeServer:
    """The fake server in a child process; ``base_url`` ends in ``/v1``."""

    def __enter__(self) -> FakeServer:
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        self.base_url = f"http://127.0.0.1:{int(self.process.stdout.readline())}/v1"
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


# -- the rows -----------------------------------------------------------------------------------


def _first_messages(steps: int) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"steps={steps}"}]


async def bare_httpx(base_url: str, steps: int) -> None:
    async with httpx.AsyncClient(base_url=base_url, headers={"Authorization": "Bearer x"}) as http:
        for _ in range(_repeat()):
            messages = _first_messages(steps)
            while True:
                body = {"model": MODEL, "messages": messages, "tools": TOOLS, "tool_choice": "auto"}
                response = await http.post("/chat/completions", json=body)
                message = response.json()["choices"][0]["message"]
                calls = message.get("tool_calls")
                if not calls:
                    break
                messages.append({"role": "assistant", "content": "", "tool_calls": calls})
                for call in calls:
                    value = json.loads(call["function"]["arguments"])["value"]
                    content = json.dumps(value)
                    messages.append(
                        {"role": "tool", "tool_call_id": call["id"], "content": content}
                    )
            _tick()


async def sdk_post(base_url: str, steps: int) -> None:
    await sdk_create(base_url, steps, low_level=True)


async def sdk_create(base_url: str, steps: int, *, low_level: bool = False) -> None:
    async with AsyncOpenAI(base_url=base_url, api_key="x") as client:
        for _ in range(_repeat()):
            messages: list[Any] = _first_messages(steps)
            while True:
                if low_level:
                    body: dict[str, Any] = {"model": MODEL, "messages": messages}
                    body.update(tools=TOOLS, tool_choice="auto", stream=False)
                    response = await client.post(
                        "/chat/completions", body=body, cast_to=ChatCompletion
                    )
                else:
                    response = await client.chat.completions.create(  # type: ignore[call-overload]
                        model=MODEL, messages=messages, tools=TOOLS, tool_choice="auto"
                    )
                message = response.choices[0].message
                if not message.tool_calls:
                    break
                calls: list[dict[str, Any]] = [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {
                            "name": call.function.name,
                            "arguments": call.function.arguments,
                        },
                    }
                    for call in message.tool_calls
                    if call.type == "function"
                ]
                messages.append({"role": "assistant", "content": "", "tool_calls": calls})
                for call in calls:
                    value = json.loads(call["function"]["arguments"])["value"]
                    content = json.dumps(value)
                    messages.append(
                        {"role": "tool", "tool_call_id": call["id"], "content": content}
                    )
            _tick()


def model_loop(
    model_class: type[Any], mode: str, streaming: bool = False
) -> Callable[[str, int], Coroutine[Any, Any, None]]:
    """The client half of an agent run: the model asked, the call answered, N times."""

    async def run(base_url: str, steps: int) -> None:
        model = model_class(MODEL, base_url=base_url, api_key="x", mode=mode, max_retries=0)
        settings = ModelSettings()
        for _ in range(_repeat()):
            messages = [Message("system", SYSTEM), Message("user", f"steps={steps}")]
            while True:
                if streaming:
                    text = "".join([c.text async for c in model.stream(messages, TOOLS, settings)])
                    calls = parse_completion(text).tool_calls
                else:
                    calls = (await model.complete(messages, TOOLS, settings)).completion.tool_calls
                if not calls:
                    break
                messages.append(Message("assistant", "", tool_calls=calls))
                results = [ToolResult(c.id, c.name, c.arguments["value"]) for c in calls]
                messages.append(Message("tool", tool_results=results))
            _tick()
        await model.aclose()

    return run


def agent_loop(
    model_class: type[Any], mode: str
) -> Callable[[str, int], Coroutine[Any, Any, None]]:
    async def echo(value: int) -> int:
        """Return the value."""
        return value

    async def run(base_url: str, steps: int) -> None:
        model = model_class(MODEL, base_url=base_url, api_key="x", mode=mode, max_retries=0)
        agent = Agent(model=model, tools=[echo], system_prompt=SYSTEM, max_iterations=steps + 1)
        for _ in range(_repeat()):
            result = await agent.arun(f"steps={steps}")
            assert result.status == 200 and len(result.tool_calls) == steps, result.output
            _tick()
        agent.close()
        await model.aclose()

    return run


# Each row function runs ``_repeat()`` conversations and calls ``_tick()`` after each; the
# driver reads the time between ticks (the first conversation warms the connection up).
_state: dict[str, Any] = {}


def _repeat() -> int:
    return int(_state["runs"]) + 1


def _tick() -> None:
    _state["marks"].append((time.perf_counter(), time.process_time()))


def per_step(
    row: Callable[[str, int], Coroutine[Any, Any, None]], base_url: str, steps: int, runs: int
) -> tuple[list[float], list[float]]:
    """µs per step of each of ``runs`` conversations of ``steps`` steps: wall time, and the CPU
    time of this process (the client's; the server runs in another process)."""
    _state["runs"], _state["marks"] = runs, [(time.perf_counter(), time.process_time())]
    gc.collect()
    asyncio.run(row(base_url, steps))
    marks = _state["marks"][1:]  # the first conversation warmed up
    pairs = list(itertools.pairwise(marks))
    wall = [(b[0] - a[0]) / steps * 1e6 for a, b in pairs]
    cpu = [(b[1] - a[1]) / steps * 1e6 for a, b in pairs]
    return wall, cpu


def load_baseline(revision: str) -> type[Any]:
    """``OpenAICompatible`` as it was at ``revision`` (same process, today's other modules)."""
    root = Path(__file__).resolve().parent.parent
    source = subprocess.run(
        ["git", "show", f"{revision}:src/hermes_agent/models/openai.py"],
        cwd=root, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "openai_baseline.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location("hermes_agent.models._baseline", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    model_class: type[Any] = module.OpenAICompatible
    return model_class


# -- definition costs ------------------------------------------------------------------------------


def _weather(city: str, unit: str = "celsius", days: int = 1) -> dict[str, Any]:
    """Forecast for a city.

    Args:
        city: The city name.
        unit: celsius or fahrenheit.
        days: How many days ahead.
    """
    return {}


MCP_SCHEMA = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "description": "File path"},
        "recursive": {"type": "boolean"},
        "limit": {"type": "integer", "minimum": 1},
    },
    "required": ["path"],
    "additionalProperties": False,
}


def definition_costs(repeats: int) -> dict[str, float]:
    """µs per tool or agent defined from things seen before (medians of ``repeats`` batches):
    ``Tool.from_function`` of a function, a ``Tool`` with an explicit JSON Schema (a 50-tool MCP
    toolset shares a handful of shapes), and an ``Agent`` with one tool, given as a ``Tool`` or
    as the plain function."""
    model = ScriptedModel(["ok"])
    tool = Tool.from_function(_weather)

    def mcp(index: int) -> Tool:
        return Tool(
            name=f"mcp_{index}", description="List files.", parameters=MCP_SCHEMA, function=_weather
        )

    def timed(make: Callable[[int], object], batch: int = 20) -> float:
        make(0)  # the first time pays for reading the function and compiling the schema
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            for index in range(batch):
                make(index)
            samples.append((time.perf_counter() - started) / batch * 1e6)
        return statistics.median(samples)

    return {
        "Tool.from_function (function seen before)": timed(lambda i: Tool.from_function(_weather)),
        "Tool(parameters=schema seen before)": timed(mcp),
        "Agent(tools=[tool])": timed(lambda i: Agent(model=model, tools=[tool])),
        "Agent(tools=[function seen before])": timed(
            lambda i: Agent(model=model, tools=[_weather])
        ),
    }


# -- driver -------------------------------------------------------------------------------------


def step_rows(
    baseline: str | None, only: str | None
) -> dict[str, Callable[[str, int], Coroutine[Any, Any, None]]]:
    classes: dict[str, type[Any]] = {"": OpenAICompatible}
    if baseline:
        classes[f" ({baseline})"] = load_baseline(baseline)
    rows: dict[str, Callable[[str, int], Coroutine[Any, Any, None]]] = {
        "bare httpx": bare_httpx,
        "SDK create()": sdk_create,
        "SDK post() (body given)": sdk_post,
    }
    for suffix, model_class in classes.items():
        rows[f"model.complete, native{suffix}"] = model_loop(model_class, "native")
        rows[f"model.complete, hermes{suffix}"] = model_loop(model_class, "hermes")
        rows[f"model.stream, native{suffix}"] = model_loop(model_class, "native", streaming=True)
        rows[f"Agent.run, native{suffix}"] = agent_loop(model_class, "native")
        rows[f"Agent.run, hermes{suffix}"] = agent_loop(model_class, "hermes")
    kept = ("bare httpx", "SDK post() (body given)")
    return {name: row for name, row in rows.items() if name in kept or not only or only in name}


def step_costs(
    rows: dict[str, Callable[[str, int], Coroutine[Any, Any, None]]], runs: int
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """Median µs per step of each row at each size: wall time, and client CPU time."""
    # Rows and sizes take turns, a few conversations at a time (5 of N=10, 2 of N=50), so that
    # a busy spell on the machine falls on all of them alike.
    samples: dict[tuple[str, int], tuple[list[float], list[float]]] = {
        (name, steps): ([], []) for name in rows for steps in SIZES
    }
    with FakeServer() as server:
        for _ in range(max(1, runs // 5)):
            for steps in SIZES:
                for name, row in rows.items():
                    batch = 5 if steps == 10 else 2
                    wall_times, cpu_times = per_step(row, server.base_url, steps, batch)
                    samples[name, steps][0].extend(wall_times)
                    samples[name, steps][1].extend(cpu_times)
    wall = {n: {str(k): statistics.median(samples[n, k][0]) for k in SIZES} for n in rows}
    cpu = {n: {str(k): statistics.median(samples[n, k][1]) for k in SIZES} for n in rows}
    return wall, cpu


def print_steps(title: str, results: dict[str, dict[str, float]]) -> None:
    bare = results["bare httpx"]
    print(f"| µs per step, {title} | N=10 | N=50 | N=50 / N=10 | × bare (N=10) | × bare (N=50) |")
    print("|---|---|---|---|---|---|")
    for name, sizes in results.items():
        ten, fifty = sizes["10"], sizes["50"]
        print(
            f"| {name} | {ten:,.0f} | {fifty:,.0f} | {fifty / ten:.2f} | "
            f"{ten / bare['10']:.2f} | {fifty / bare['50']:.2f} |"
        )
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--runs", type=int, default=20, help="conversations per row at N=10 (2/5 of it at N=50)"
    )
    parser.add_argument("--baseline", help="git revision whose OpenAICompatible to compare")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--only", help="run only the rows whose name contains this text")
    parser.add_argument("--definitions-only", action="store_true", help="skip the step rows")
    parser.add_argument("--label", default="working tree", help="what code ran (for the JSON)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.serve:
        asyncio.run(_serve())
        return
    wall: dict[str, dict[str, float]] = {}
    cpu: dict[str, dict[str, float]] = {}
    if not options.definitions_only:
        wall, cpu = step_costs(step_rows(options.baseline, options.only), options.runs)
        print_steps("wall time", wall)
        print_steps("client CPU time", cpu)
    definitions = definition_costs(max(20, options.runs))
    print("| definition | µs |")
    print("|---|---|")
    for name, value in definitions.items():
        print(f"| {name} | {value:,.1f} |")
    if options.json:
        record = {
            "python": platform.python_version(),
            "openai": openai.__version__,
            "httpx": httpx.__version__,
            "code": options.label,
            "runs_n10": options.runs,
            "baseline": options.baseline,
            "per_step_wall_us": wall,
            "per_step_client_cpu_us": cpu,
            "definition_us": definitions,
        }
        options.json.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
