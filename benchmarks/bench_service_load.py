"""The service under load: many concurrent runs over HTTP against a model with fixed latency.

Three processes on loopback:

- a fake OpenAI-compatible endpoint (uvicorn, a bare ASGI app) that waits ``--latency``
  seconds per call and then streams its reply: a ``<tool_call>`` for the first call of a run,
  an answer once the conversation holds a tool response;
- the service (``create_app`` on uvicorn, ``auth: none``, limits raised so ``--concurrency``
  runs can be in flight), its agent talking to that endpoint through ``OpenAICompatible``
  with a trivial sync tool, and storing sessions and the audit trail in SQLite or PostgreSQL;
- this process, the load generator: ``--concurrency`` workers, each with its own
  ``httpx.AsyncClient``, posting ``POST /v1/runs`` (plain JSON) back to back until
  ``concurrency × --runs-per-worker`` runs (at least ``--min-runs``) are done in all.

So each run is model call → tool call → model call → answer, and ideally takes twice the model
latency (200 ms at the default 100 ms). Reported per storage and concurrency:

- throughput, and its fraction of the ideal ``concurrency / ideal run time``;
- p50/p99 of the latency the service adds to a run (client-measured run time − 2 × latency);
- the service process's peak RSS (``VmHWM``) and CPU time per run;
- the CPU share each process got while the row ran (on a shared machine, what it could get);
- a *bare* row: the same workers calling the endpoint twice directly, no service — what the
  endpoint and the load generator alone can reach on this machine.

Each row starts after 100 warm-up runs; a failed run is counted and its error printed.
``--fast`` runs every process on uvloop and httptools (``uvicorn[standard]``; they must be
importable) instead of asyncio and h11; ``--model-keepalive N`` gives the service's model
client a pool that keeps N idle connections (the SDK keeps 100); ``--model-call-cost`` also
measures the CPU of one streamed model call through the SDK against plain httpx;
``--session-cost`` times one session load and append per storage, as a run makes them on the
event loop (``--costs-only``: these two measurements and no load);
``BENCH_PROFILE=FILE`` writes a cProfile of the service's event loop to FILE.

    python benchmarks/bench_service_load.py                        # 500 concurrent, both stores
    python benchmarks/bench_service_load.py --concurrency 1 10 50 100 500 --model-call-cost
    python benchmarks/bench_service_load.py --concurrency 50 500 --storage sqlite --fast
    python benchmarks/bench_service_load.py --json benchmarks/results/service_load.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

# Helpers the benchmarks share (this folder is on sys.path when run as a script).
from _common import code_version, free_port, pg_database

CALL = '<tool_call>\n{"name": "lookup", "arguments": {"city": "Paris"}}\n</tool_call>'
ANSWER = "It is sunny in Paris today."
TLS = ssl.create_default_context()  # unused on loopback http, but httpx builds one per client


def stack() -> dict[str, Any]:
    """uvicorn's event loop and HTTP parser: the pure-Python ones (asyncio, h11) unless
    ``--fast`` asked for uvloop and httptools (what ``uvicorn[standard]`` installs)."""
    if os.environ.get("BENCH_FAST"):
        return {"loop": "uvloop", "http": "httptools"}
    return {"loop": "asyncio", "http": "h11"}


# -- the fake model endpoint (its own process) ----------------------------------------------


def _chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    choices = [{"index": 0, "delta": delta, "finish_reason": finish}] if delta or finish else []
    body = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "bench",
        "choices": choices,
        **extra,
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _stream(content: str) -> bytes:
    usage = {"prompt_tokens": 120, "completion_tokens": 20, "total_tokens": 140}
    pieces = [_chunk({"role": "assistant", "content": ""})]
    pieces += [_chunk({"content": content[i : i + 16]}) for i in range(0, len(content), 16)]
    pieces += [_chunk({}, "stop"), _chunk({}, usage=usage), b"data: [DONE]\n\n"]
    return b"".join(pieces)


REPLIES = {"call": _stream(CALL), "answer": _stream(ANSWER)}


def _reply_for(body: dict[str, Any]) -> str:
    last = body["messages"][-1]
    content = last.get("content") or ""
    answered = last.get("role") == "tool" or "<tool_response>" in str(content)
    return "answer" if answered else "call"


def model_app(latency: float) -> Callable[..., Awaitable[None]]:
    """A minimal ASGI chat-completions endpoint (streamed replies only, as the service asks)."""

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
            kind = _reply_for(json.loads(raw))
            body, status, media = REPLIES[kind], 200, b"text/event-stream"
        else:
            body, status, media = b'{"error": "not found"}', 404, b"application/json"
        # The latency is counted from when the request was read, like a model's time to answer.
        await asyncio.sleep(max(0.0, latency - (time.perf_counter() - started)))
        headers = [(b"content-type", media), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


def serve_model(port: int, latency: float) -> None:
    import uvicorn

    uvicorn.run(
        model_app(latency),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        backlog=4096,
        # uvicorn closes idle connections after 5 s by default; a saturated service reuses
        # pooled ones later than that, and a request sent as the server closes it fails
        # (the service's model client has retries off here, so that every failure shows).
        timeout_keep_alive=300,
        **stack(),
    )


# -- the service (its own process) ------------------------------------------------------------


def lookup(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def serve_service(
    port: int, model_url: str, storage_url: str, concurrency: int, keepalive: int
) -> None:
    import uvicorn

    from hermes_agent.config import parse_config
    from hermes_agent.loading import build_agent
    from hermes_agent.server import ServiceSettings, create_app
    from hermes_agent.tools.registry import Tool

    config = parse_config(
        {
            "model": {
                "provider": "openai",
                "base_url": model_url,
                "api_key": "bench",
                "model_name": "bench",
                "mode": "hermes",
                "timeout": 120,
                "max_retries": 0,
            },
            "agent": {"max_iterations": 3},
            "storage": {"url": storage_url},
        }
    )
    overrides: dict[str, Any] = {}
    if keepalive:  # the SDK's pool keeps 100 idle connections; more in flight are reopened
        import openai

        from hermes_agent.models.openai import OpenAICompatible

        limits_type = type(openai._constants.DEFAULT_CONNECTION_LIMITS)
        limits = limits_type(max_connections=1000, max_keepalive_connections=keepalive)
        client = openai.AsyncOpenAI(
            base_url=model_url,
            api_key="bench",
            max_retries=0,
            timeout=120,
            http_client=openai.DefaultAsyncHttpxClient(limits=limits, timeout=120),
        )
        overrides["model"] = OpenAICompatible("bench", client=client, max_retries=0)
    agent = build_agent(config, tools=[Tool.from_function(lookup)], **overrides)
    settings = ServiceSettings(
        host="127.0.0.1",
        port=port,
        auth="none",
        keys_url="memory://",
        max_runs_in_flight=concurrency * 2,
        max_runs_in_flight_per_user=concurrency * 2,
        run_timeout_s=300,
    )
    app: Any = create_app(agent=agent, settings=settings)
    if os.environ.get("BENCH_PROFILE"):
        app = profiled(app, os.environ["BENCH_PROFILE"])
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        backlog=4096,
        timeout_keep_alive=60,
        **stack(),
    )
    agent.close()


def profiled(app: Any, path: str) -> Callable[..., Awaitable[None]]:
    """``app`` under cProfile (the event loop's thread); the stats go to ``path`` when the
    server shuts down (``BENCH_PROFILE=path``: to find where the service spends its time)."""
    import cProfile

    profile = cProfile.Profile()
    profile.enable()

    async def wrapper(scope: dict[str, Any], receive: Any, send: Any) -> None:
        async def watched() -> Any:
            message = await receive()
            if message["type"] == "lifespan.shutdown":
                profile.disable()
                profile.dump_stats(path)
            return message

        await app(scope, watched if scope["type"] == "lifespan" else receive, send)

    return wrapper


# -- the load generator (this process) --------------------------------------------------------


def spawn(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, __file__, "--role", *args])


async def wait_until_up(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as client:
        while True:
            try:
                await client.get(url)
                return
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"nothing answers at {url}") from None
                await asyncio.sleep(0.1)


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak) in bytes, and CPU seconds (user + system) as microseconds."""
    found: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) * 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    found["cpu_us"] = int((int(fields[11]) + int(fields[12])) / ticks * 1e6)
    return found


async def drive(
    one_run: Callable[[httpx.AsyncClient, int], Awaitable[None]], concurrency: int, runs: int
) -> tuple[float, list[float], int]:
    """``runs`` runs by ``concurrency`` workers; (wall seconds, each run's seconds, failures).

    Each worker has its own client holding one keep-alive connection: one client with a pool
    of hundreds of connections spends most of its time choosing a connection (httpcore scans
    the whole pool for every request), which would measure the load generator instead. The
    clients share one TLS context and are made before the clock starts (httpx builds a new
    context per client otherwise: ~45 ms each)."""
    times: list[float] = []
    failures = 0
    counter = iter(range(runs))
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    clients = [
        httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(300.0), verify=TLS)
        for _ in range(concurrency)
    ]

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal failures
        for index in counter:
            started = time.perf_counter()
            try:
                await one_run(client, index)
            except Exception as exc:  # counted and shown, never hidden
                failures += 1
                if failures <= 3:
                    print(f"  run failed: {type(exc).__name__}: {exc}", file=sys.stderr)
                continue
            times.append(time.perf_counter() - started)

    try:
        started = time.perf_counter()
        await asyncio.gather(*(worker(client) for client in clients))
        wall = time.perf_counter() - started
    finally:
        for client in clients:
            await client.aclose()
    return wall, times, failures


def service_run(base: str) -> Callable[[httpx.AsyncClient, int], Awaitable[None]]:
    async def one(client: httpx.AsyncClient, index: int) -> None:
        response = await client.post(f"{base}/v1/runs", json={"message": "weather in Paris?"})
        if response.status_code != 200:
            raise RuntimeError(f"{response.status_code}: {response.text[:200]}")
        result = response.json()
        if ANSWER not in result["output"] or len(result["tool_calls"]) != 1:
            raise RuntimeError(f"unexpected result: {str(result)[:300]}")

    return one


def bare_run(model_url: str) -> Callable[[httpx.AsyncClient, int], Awaitable[None]]:
    """Two calls straight to the endpoint, as the service would make them (streamed)."""
    first = {"model": "bench", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    second = {**first, "messages": [{"role": "tool", "content": "<tool_response>x"}]}

    async def one(client: httpx.AsyncClient, index: int) -> None:
        for body, expected in ((first, "tool_call"), (second, "sunny")):
            response = await client.post(f"{model_url}/chat/completions", json=body)
            if expected not in response.text:
                raise RuntimeError(f"unexpected reply: {response.text[:200]}")

    return one


def summarise(
    wall: float, times: list[float], failures: int, concurrency: int, ideal: float
) -> dict[str, Any]:
    done = len(times)
    throughput = done / wall
    ideal_throughput = concurrency / ideal
    added = sorted(t - ideal for t in times)

    def pct(q: float) -> float:
        return added[min(len(added) - 1, int(q * len(added)))] * 1000 if added else float("nan")

    return {
        "concurrency": concurrency,
        "runs": done,
        "failures": failures,
        "wall_s": round(wall, 3),
        "throughput_rps": round(throughput, 1),
        "ideal_rps": round(ideal_throughput, 1),
        "fraction_of_ideal": round(throughput / ideal_throughput, 4),
        "added_p50_ms": round(pct(0.50), 1),
        "added_p99_ms": round(pct(0.99), 1),
        "run_p50_ms": round(statistics.median(times) * 1000, 1) if times else float("nan"),
    }


async def bench_bare(
    model_url: str, model_pid: int, concurrency: int, runs: int, ideal: float
) -> dict[str, Any]:
    await drive(bare_run(model_url), min(concurrency, 50), 100)  # warm up
    pids = {"model": model_pid, "loadgen": os.getpid()}
    before = {name: proc_status(pid) for name, pid in pids.items()}
    wall, times, failures = await drive(bare_run(model_url), concurrency, runs)
    row = {
        "storage": "none (bare endpoint)",
        **summarise(wall, times, failures, concurrency, ideal),
    }
    for name, pid in pids.items():
        spent = proc_status(pid)["cpu_us"] - before[name]["cpu_us"]
        row[f"{name}_cpu_share"] = round(spent / 1e6 / wall, 2)
    return row


async def bench_service(
    storage: str,
    storage_url: str,
    model_url: str,
    model_pid: int,
    concurrencies: list[int],
    runs_per_worker: int,
    min_runs: int,
    ideal: float,
    keepalive: int,
) -> list[dict[str, Any]]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    service = spawn(
        "service", str(port), model_url, storage_url, str(max(concurrencies)), str(keepalive)
    )
    rows = []
    try:
        await wait_until_up(f"{base}/healthz")
        for concurrency in concurrencies:
            await drive(service_run(base), min(concurrency, 50), 100)  # warm up
            pids = {"model": model_pid, "loadgen": os.getpid()}
            others = {name: proc_status(pid)["cpu_us"] for name, pid in pids.items()}
            before = proc_status(service.pid)
            runs = max(min_runs, concurrency * runs_per_worker)
            wall, times, failures = await drive(service_run(base), concurrency, runs)
            after = proc_status(service.pid)
            row = {"storage": storage, **summarise(wall, times, failures, concurrency, ideal)}
            row["model_keepalive"] = keepalive or "SDK default (100)"
            row["service_cpu_ms_per_run"] = round(
                (after["cpu_us"] - before["cpu_us"]) / 1000 / max(1, len(times)), 2
            )
            row["service_cpu_share"] = round((after["cpu_us"] - before["cpu_us"]) / 1e6 / wall, 2)
            for name, pid in pids.items():
                spent = proc_status(pid)["cpu_us"] - others[name]
                row[f"{name}_cpu_share"] = round(spent / 1e6 / wall, 2)
            row["service_rss_mib"] = round(after["VmRSS"] / 2**20, 1)
            row["service_peak_rss_mib"] = round(after["VmHWM"] / 2**20, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        service.terminate()
        try:
            service.wait(60)
        except subprocess.TimeoutExpired:
            service.kill()
            service.wait()
    return rows


async def model_call_cost(model_url: str, calls: int = 500) -> dict[str, float]:
    """CPU per streamed model call in this process: through ``OpenAICompatible`` (the SDK,
    the Hermes prompt rendering, the parser) against a plain ``httpx`` stream of the same
    endpoint that only decodes each chunk's JSON. The endpoint answers at once here."""
    from hermes_agent.models.base import ModelSettings
    from hermes_agent.models.openai import OpenAICompatible
    from hermes_agent.types import Message

    model = OpenAICompatible("bench", base_url=model_url, api_key="bench", max_retries=0)
    messages = [Message("system", "You answer questions."), Message("user", "weather in Paris?")]
    parameters = {"type": "object", "properties": {"city": {"type": "string"}}}
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": parameters}}]
    settings = ModelSettings()
    body = {"model": "bench", "stream": True, "messages": [{"role": "user", "content": "hi"}]}

    async with httpx.AsyncClient(verify=TLS) as client:

        async def through_sdk() -> None:
            async for _ in model.stream(messages, tools, settings):
                pass

        async def plain() -> None:
            async with client.stream("POST", f"{model_url}/chat/completions", json=body) as reply:
                async for line in reply.aiter_lines():
                    if line.startswith("data: {"):
                        json.loads(line[6:])

        found = {}
        for name, call in (("openai_sdk_ms", through_sdk), ("plain_httpx_ms", plain)):
            for _ in range(50):
                await call()
            started = time.process_time()
            for _ in range(calls):
                await call()
            found[name] = round((time.process_time() - started) / calls * 1000, 3)
    await model.aclose()
    return found


def session_io_wait(url: str, runs: int = 300) -> dict[str, float]:
    """Wall time of what a run asks of the session store, called as the agent calls it (on
    the event loop's thread): one ``load`` and one ``append`` of a two-message turn, each on a
    new session; medians in ms."""
    from hermes_agent.storage import open_storage
    from hermes_agent.types import Message

    storage = open_storage(url)
    turn = [Message("user", "weather in Paris?"), Message("assistant", ANSWER)]
    loads, appends = [], []
    try:
        for index in range(runs):
            session = f"local:bench-{index}-{uuid.uuid4().hex[:8]}"
            started = time.perf_counter()
            storage.sessions.load(session)
            loads.append(time.perf_counter() - started)
            started = time.perf_counter()
            storage.sessions.append(session, turn)
            appends.append(time.perf_counter() - started)
    finally:
        storage.close()
    return {
        "load_p50_ms": round(statistics.median(loads) * 1000, 3),
        "append_p50_ms": round(statistics.median(appends) * 1000, 3),
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    ideal = 2 * args.latency
    model_port = free_port()
    model_url = f"http://127.0.0.1:{model_port}/v1"
    model = spawn("model", str(model_port), str(args.latency))
    rows: list[dict[str, Any]] = []
    costs: dict[str, float] = {}
    waits: dict[str, dict[str, float]] = {}
    try:
        await wait_until_up(f"{model_url}/models")
        if args.model_call_cost:
            cost_port = free_port()
            instant = spawn("model", str(cost_port), "0")
            try:
                await wait_until_up(f"http://127.0.0.1:{cost_port}/v1/models")
                costs = await model_call_cost(f"http://127.0.0.1:{cost_port}/v1")
                print(json.dumps({"cpu_per_model_call": costs}), flush=True)
            finally:
                instant.terminate()
                instant.wait(30)
        if not args.skip_bare and not args.costs_only:
            for concurrency in args.concurrency:
                bare = await bench_bare(
                    model_url,
                    model.pid,
                    concurrency,
                    max(args.min_runs, concurrency * args.runs_per_worker),
                    ideal,
                )
                print(json.dumps(bare), flush=True)
                rows.append(bare)
        for storage in args.storage:
            with tempfile.TemporaryDirectory(prefix="hermes-bench-") as folder:
                drop: Callable[[], None] = lambda: None  # noqa: E731
                if storage == "sqlite":
                    url = f"sqlite:///{Path(folder) / 'state.db'}"
                else:
                    url, _, drop = pg_database()
                try:
                    if args.session_cost:
                        waits[storage] = session_io_wait(url)
                        print(json.dumps({"session_io_wait": {storage: waits[storage]}}))
                    if args.costs_only:
                        continue
                    rows += await bench_service(
                        storage,
                        url,
                        model_url,
                        model.pid,
                        args.concurrency,
                        args.runs_per_worker,
                        args.min_runs,
                        ideal,
                        args.model_keepalive,
                    )
                finally:
                    drop()
    finally:
        model.terminate()
        model.wait(30)
    return {
        "benchmark": "service_load",
        "latency_s": args.latency,
        "ideal_run_s": ideal,
        "runs_per_worker": args.runs_per_worker,
        "min_runs": args.min_runs,
        "command": " ".join(["python", "benchmarks/bench_service_load.py", *sys.argv[1:]]),
        "machine": f"{os.cpu_count()} CPUs (shared), {platform.python_implementation()} "
        f"{platform.python_version()}, {platform.machine()}",
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "code": code_version(),
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "rows": rows,
        "cpu_per_model_call": costs,
        "session_io_wait": waits,
    }


def print_table(report: dict[str, Any]) -> None:
    print(
        "\n| storage | concurrency | runs | throughput | ideal | fraction | added p50 | added p99 "
        "| service CPU/run | service peak RSS |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in report["rows"]:
        cpu = row.get("service_cpu_ms_per_run")
        rss = row.get("service_peak_rss_mib")
        print(
            f"| {row['storage']} | {row['concurrency']} | {row['runs']} "
            f"| {row['throughput_rps']} runs/s | {row['ideal_rps']} | "
            f"{row['fraction_of_ideal'] * 100:.1f}% | {row['added_p50_ms']} ms "
            f"| {row['added_p99_ms']} ms | {f'{cpu} ms' if cpu is not None else '—'} "
            f"| {f'{rss} MiB' if rss is not None else '—'} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--role", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[500])
    parser.add_argument("--runs-per-worker", type=int, default=4)
    parser.add_argument("--min-runs", type=int, default=100, help="runs per row at least")
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument(
        "--storage", nargs="+", choices=["sqlite", "postgresql"], default=["sqlite", "postgresql"]
    )
    parser.add_argument("--skip-bare", action="store_true")
    parser.add_argument(
        "--session-cost",
        action="store_true",
        help="also time one session load and append per storage, as a run makes them",
    )
    parser.add_argument(
        "--costs-only",
        action="store_true",
        help="only the --model-call-cost and --session-cost measurements, no load",
    )
    parser.add_argument(
        "--model-call-cost",
        action="store_true",
        help="also measure the CPU of one model call through the SDK vs plain httpx",
    )
    parser.add_argument(
        "--fast",
        action="store_true",
        help="uvloop and httptools (uvicorn[standard]) in every process, not asyncio and h11",
    )
    parser.add_argument(
        "--model-keepalive",
        type=int,
        default=0,
        help="idle connections the service's model client keeps (default: the SDK's)",
    )
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args()
    if args.role:
        role, *rest = args.role
        if role == "model":
            serve_model(int(rest[0]), float(rest[1]))
        else:
            serve_service(int(rest[0]), rest[1], rest[2], int(rest[3]), int(rest[4]))
        return
    if args.fast:
        import uvloop  # type: ignore[import-not-found, unused-ignore]

        os.environ["BENCH_FAST"] = "1"  # the service and the endpoint inherit it
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            report = runner.run(main_async(args))
    else:
        report = asyncio.run(main_async(args))
    report["stack"] = "uvloop + httptools" if args.fast else "asyncio + h11"
    print_table(report)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
