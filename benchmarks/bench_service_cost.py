"""What a run costs the process serving it: CPU ms per run in the service (and in the PostgreSQL
backends serving it), against a bare FastAPI endpoint running the same loop with the openai SDK
and one making the same two model calls with plain httpx.

The workload (the step model, ``tests/harness/step_model.py``, in its own process on loopback): a
run is model call → the tool ``step`` → model call → answer (``job <tag> steps=1``), each model
reply after ``--latency`` seconds. Contenders, each a uvicorn process of its own (asyncio and h11
for all), serving ``POST /v1/runs`` with a JSON body ``{"message": ...}`` and answering plain JSON:

- ``NAME/memory``, ``NAME/sqlite``, ``NAME/postgresql`` (one NAME per ``--src`` tree, so that
  two versions of the code can be measured in one sitting; ``hermes`` by default): the
  project's service, ``create_app`` with ``auth: none`` and its limits raised so that the
  concurrency fits, its agent on the OpenAI-compatible model (``mode: native``) with the tool
  a plain function (run on the agent's tool threads; ``--inline-tool NAME`` declares it
  ``inline``, called on the event loop as the SDK loop calls it), its sessions and trail in
  ``memory://``, an SQLite file, or a throwaway PostgreSQL database;
- ``sdk-loop``: a FastAPI endpoint of about 40 lines that runs the loop with the openai SDK (one
  ``AsyncOpenAI`` for the app: ``chat.completions.create`` with the tool's JSON schema, the
  tool, the second call, the answer as JSON);
- ``httpx-floor``: the same endpoint making the two calls with one raw ``httpx2.AsyncClient``
  (the HTTP client recent openai SDKs are built on; JSON posted, the reply's dicts read; no
  SDK), its pool as large as the SDK's. ``--floor-client httpx`` makes it with httpx 0.28
  instead, whose pool scans its connections for every request: at 100 in flight that costs
  more than the whole SDK loop, so it is no floor there.

This process is the load generator: ``--concurrency`` workers (each with a client of its own,
one keep-alive connection) post runs back to back, ``--warmup`` of them first, then ``--runs``
measured ones, and check every answer. CPU is read from ``/proc``: the serving process (its
process group) between the first and the last measured run, and for a PostgreSQL row also the
backends of its database that the service opened (its connections carry an
``application_name`` of their own), sampled every 20 ms so that a backend that exits in the
window still counts (up to its last sample). Of the serving process's CPU, the time its
garbage collector took is read too (``gc.callbacks`` in the process, read over HTTP before and
after the measured runs: ``gc_ms_per_run``), its peak resident memory once they are done
(``VmHWM``: ``peak_rss_mb``), and how often its threads were switched out (``/proc``'s
voluntary and involuntary context switches of every thread: ``switches_per_run``, the
wake-ups a run costs, which CPU time on a shared machine shows only through its noise).

``--callgrind`` runs every contender under valgrind's callgrind instead, instrumented only
while the measured runs go (``callgrind_control -i on``/``off``), one process per concurrency,
and adds ``instructions_m_per_run``: millions of instructions the serving process ran per run,
in user space only (the kernel's share of a wake-up is not in it). A count repeats within
about 1.5% from round to round where CPU time on a shared machine moved by 10-55%, so it can
tell a change of a few percent; the CPU columns of such a sitting measure valgrind, not the
service. Rounds alternate the contenders (the order flips each round); the summary holds the
medians over the rounds, and each contender's total CPU per run as a multiple of the
sdk-loop's and of the httpx floor's at the same concurrency.

    python benchmarks/bench_service_cost.py
    python benchmarks/bench_service_cost.py --rounds 3 --runs 600 --json service_cost.json
    python benchmarks/bench_service_cost.py --src before=OLD_TREE --src after=NEW_TREE
    python benchmarks/bench_service_cost.py --concurrency 10 --storage memory --rounds 1
    python benchmarks/bench_service_cost.py --concurrency 100 --floor-client httpx
    python benchmarks/bench_service_cost.py --src httpx=. --src aiohttp=. --aiohttp aiohttp
    python benchmarks/bench_service_cost.py --callgrind --runs 150 --concurrency 10 --storage sqlite
    python benchmarks/bench_service_cost.py --src threads=. --src inline=. --inline-tool inline
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import ssl
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from _common import (
    PG,
    ROOT,
    callgrind_count,
    callgrind_instrument,
    code_version,
    find_postmaster,
    free_port,
    group_switches,
    group_ticks,
    pg_database,
    proc_stat,
    start_process,
    stop_group,
)
from pydantic import BaseModel

SERVICE_APP = "hermes-bench-service"  # application_name of the service's PostgreSQL sessions
STORAGES = ("memory", "sqlite", "postgresql")
BASELINES = ("sdk-loop", "httpx-floor")
MODEL = "step-model"
# The schema the service offers for ``step`` (what ``Tool.from_function(step)`` makes of it).
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "step",
            "description": "Do step n of job tag.",
            "parameters": {
                "type": "object",
                "properties": {
                    "tag": {"type": "string", "description": "the job."},
                    "n": {"type": "integer", "description": "the step number."},
                },
                "required": ["tag", "n"],
                "additionalProperties": False,
            },
        },
    }
]


def step(tag: str, n: int) -> str:
    """Do step n of job tag.

    Args:
        tag: the job.
        n: the step number.
    """
    return f"step {n} of {tag} done"


def expected(tag: str) -> str:
    return f"done {tag} after 1 steps; user turns seen: 1"


# -- the contenders (each its own process: this file with --serve KIND) ----------------------


class RunIn(BaseModel):
    message: str


def hermes_app(
    port: int,
    model_url: str,
    storage_url: str,
    in_flight: int,
    transport: str = "",
    tool_mode: str = "",
) -> tuple[Any, Any]:
    from hermes_agent.config import parse_config
    from hermes_agent.loading import build_agent
    from hermes_agent.server import ServiceSettings, create_app
    from hermes_agent.tools.registry import Tool

    model: dict[str, Any] = {
        "provider": "openai",
        "base_url": model_url,
        "api_key": "none",
        "model_name": MODEL,
        "mode": "native",
        "timeout": 120,
        "max_retries": 0,
    }
    if transport:  # only for trees that know the key (--aiohttp NAME)
        model["transport"] = transport
    config = parse_config(
        {
            "model": model,
            "agent": {"max_iterations": 6},
            "storage": {"url": storage_url},
        }
    )
    # The tool as a user registers it: a sync function on the agent's tool threads, or with
    # --inline-tool NAME declared ``inline`` (called on the event loop, as the SDK loop does).
    modes = {"execution_mode": tool_mode} if tool_mode else {}
    agent = build_agent(config, tools=[Tool.from_function(step, **modes)])
    settings = ServiceSettings(
        host="127.0.0.1",
        port=port,
        auth="none",
        keys_url="memory://",
        max_runs_in_flight=in_flight,
        max_runs_in_flight_per_user=in_flight,
        run_timeout_s=300,
    )
    return create_app(agent=agent, settings=settings), agent


def sdk_app(model_url: str) -> Any:
    """The loop with the openai SDK in a FastAPI endpoint; one client for the app."""
    import openai
    from fastapi import FastAPI, HTTPException

    client = openai.AsyncOpenAI(base_url=model_url, api_key="none", max_retries=0, timeout=120)
    app = FastAPI()

    @app.post("/v1/runs")
    async def run(body: RunIn) -> dict[str, Any]:
        messages: list[Any] = [{"role": "user", "content": body.message}]
        calls = []
        for _ in range(6):
            reply = await client.chat.completions.create(
                model=MODEL, messages=messages, tools=TOOLS
            )
            message = reply.choices[0].message
            if not message.tool_calls:
                return {"output": message.content, "tool_calls": calls}
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                arguments = json.loads(call.function.arguments)
                result = step(**arguments)
                calls.append({"name": call.function.name, "arguments": arguments})
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        raise HTTPException(500, "no answer after 6 model calls")

    return app


def httpx_app(model_url: str, library: str = "httpx2") -> Any:
    """The same endpoint with the model calls made by a raw httpx client (no SDK);
    ``library``: ``httpx`` or ``httpx2`` (same API)."""
    import importlib

    from fastapi import FastAPI, HTTPException

    http = importlib.import_module(library)
    # As large a pool as the SDK's (httpx's default keeps 20 idle connections).
    limits = http.Limits(max_connections=1000, max_keepalive_connections=100)
    client = http.AsyncClient(base_url=model_url, timeout=120, limits=limits)
    app = FastAPI()

    @app.post("/v1/runs")
    async def run(body: RunIn) -> dict[str, Any]:
        messages: list[Any] = [{"role": "user", "content": body.message}]
        calls = []
        for _ in range(6):
            request = {"model": MODEL, "messages": messages, "tools": TOOLS}
            response = await client.post("/chat/completions", json=request)
            response.raise_for_status()
            message = response.json()["choices"][0]["message"]
            if not message.get("tool_calls"):
                return {"output": message["content"], "tool_calls": calls}
            messages.append(message)
            for call in message["tool_calls"]:
                arguments = json.loads(call["function"]["arguments"])
                result = step(**arguments)
                calls.append({"name": call["function"]["name"], "arguments": arguments})
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        raise HTTPException(500, "no answer after 6 model calls")

    return app


def serve(
    kind: str,
    port: int,
    model_url: str,
    storage_url: str,
    in_flight: int,
    library: str,
    transport: str = "",
    tool_mode: str = "",
) -> None:
    import uvicorn

    agent = None
    if kind == "hermes":
        app, agent = hermes_app(port, model_url, storage_url, in_flight, transport, tool_mode)
        try:  # as `hermes-agent serve` does before it serves (a tree older than it has none)
            from hermes_agent.server import settle_heap
        except ImportError:
            pass
        else:
            settle_heap()
    elif kind == "sdk-loop":
        app = sdk_app(model_url)
    else:
        app = httpx_app(model_url, library)
    collecting = _time_collections()
    # The seconds the garbage collector has taken so far in this process (the load generator
    # reads them before and after the measured runs; never part of a run).
    app.add_api_route("/bench/gc", lambda: {"gc_s": collecting[0]}, methods=["GET"])
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        loop="asyncio",
        http="h11",
        backlog=4096,
        timeout_keep_alive=300,
    )
    if agent is not None:
        agent.close()


def _time_collections() -> list[float]:
    """A one-item list that adds up the wall seconds of every garbage collection from now on
    (``gc.callbacks``; the collecting thread holds the GIL throughout, so on a machine with a
    core to spare they are close to its CPU seconds)."""
    import gc

    spent = [0.0]
    began = [0.0]

    def note(phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            spent[0] += time.perf_counter() - began[0]

    gc.callbacks.append(note)
    return spent


# -- CPU from /proc ---------------------------------------------------------------------------


class BackendMeter:
    """CPU ticks of the service's backends in one database: the postmaster's children whose
    title names the database and whose ``application_name`` is the service's, sampled every
    20 ms. This meter's own connection is to another database, so it never counts."""

    def __init__(self, database: str, conninfo: str) -> None:
        import psycopg

        self.title = b" " + database.encode() + b" "
        self.postmaster = find_postmaster()
        self.conn = psycopg.connect(conninfo, dbname=PG["dbname"], autocommit=True)
        self.kind: dict[int, str] = {}  # pid -> "service" | "other"
        self.first: dict[int, int] = {}
        self.last: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _backends(self) -> list[int]:
        path = f"/proc/{self.postmaster}/task/{self.postmaster}/children"
        try:
            return [int(pid) for pid in Path(path).read_text().split()]
        except OSError as exc:  # a PostgreSQL row that counted no backend would mislead
            raise SystemExit(f"cannot list PostgreSQL's backends ({path}): {exc}") from None

    def _kind(self, pid: int) -> str | None:
        """The backend's kind, or None while it is too young to tell (asked again later)."""
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return None
        if self.title not in title:
            return "other"
        row = self.conn.execute(
            "SELECT application_name FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()
        if row is None:
            return None
        return "service" if row[0] == SERVICE_APP else "other"

    def _sample(self, at_start: bool) -> None:
        for pid in self._backends():
            if pid not in self.kind:
                kind = self._kind(pid)
                if kind is not None:
                    self.kind[pid] = kind
            if self.kind.get(pid) == "other":
                continue
            fields = proc_stat(pid)
            if fields is None:
                continue
            used = int(fields[11]) + int(fields[12])
            self.last[pid] = used
            self.first.setdefault(pid, used if at_start else 0)  # born in the window: from 0

    def _loop(self) -> None:
        while not self._stop.wait(0.02):
            self._sample(at_start=False)

    def start(self) -> None:
        self.first, self.last = {}, {}
        self._sample(at_start=True)
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def stop(self) -> tuple[float, int]:
        """(CPU seconds of the service's backends in the window, backends seen)."""
        self._stop.set()
        assert self._thread is not None
        self._thread.join()
        self._sample(at_start=False)
        ticks = 0
        seen = 0
        for pid, last in self.last.items():
            if self.kind.get(pid, "service") == "service":  # one never told apart: counted
                ticks += last - self.first[pid]
                seen += 1
        return ticks / os.sysconf("SC_CLK_TCK"), seen

    def close(self) -> None:
        self.conn.close()


# -- processes --------------------------------------------------------------------------------


async def wait_up(url: str, process: Any, log: Path, timeout: float = 120.0) -> None:
    """Until ``url`` answers anything (uvicorn listens once the app's startup is done)."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as client:
        while True:
            try:
                await client.get(url)
                return
            except httpx.TransportError:
                if process.poll() is not None or time.monotonic() > deadline:
                    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
                    raise RuntimeError(f"nothing answers at {url}:\n{tail}") from None
                await asyncio.sleep(0.1)


# -- the load generator (this process) --------------------------------------------------------

TLS = ssl.create_default_context()  # one for all clients (httpx builds one per client otherwise)


async def drive(base: str, concurrency: int, runs: int) -> dict[str, Any]:
    """``runs`` runs posted by ``concurrency`` workers back to back; each worker has a client
    of its own with one keep-alive connection (one client's pool of many connections costs the
    load generator more than the service). Every answer is checked."""
    label = uuid.uuid4().hex[:8]
    times: list[float] = []
    wrong: list[str] = []
    counter = iter(range(runs))
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    clients = [
        httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(300.0), verify=TLS)
        for _ in range(concurrency)
    ]

    async def worker(client: httpx.AsyncClient) -> None:
        for index in counter:
            tag = f"{label}-{index}"
            started = time.perf_counter()
            try:
                response = await client.post(
                    f"{base}/v1/runs", json={"message": f"job {tag} steps=1"}
                )
                result = response.json() if response.status_code == 200 else None
            except Exception as exc:  # counted and shown, never hidden
                wrong.append(f"{type(exc).__name__}: {exc}")
                continue
            elapsed = time.perf_counter() - started
            if (
                result is None
                or result.get("output") != expected(tag)
                or len(result.get("tool_calls") or []) != 1
            ):
                wrong.append(f"{response.status_code}: {response.text[:300]}")
                continue
            times.append(elapsed)

    try:
        started = time.perf_counter()
        await asyncio.gather(*(worker(client) for client in clients))
        wall = time.perf_counter() - started
    finally:
        for client in clients:
            await client.aclose()
    for problem in wrong[:3]:
        print(f"  wrong answer: {problem}", file=sys.stderr)
    return {"wall": wall, "times": sorted(times), "wrong": len(wrong)}


def _peak_rss_mb(pid: int) -> float | None:
    """The serving process's peak resident memory so far (``VmHWM``), in MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


async def _collected_s(base: str) -> float:
    """The seconds the service's garbage collector has taken so far."""
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        reply = await client.get("/bench/gc")
        reply.raise_for_status()
        return float(reply.json()["gc_s"])


async def measure(
    base: str, pid: int, concurrency: int, args: argparse.Namespace, meter: BackendMeter | None
) -> dict[str, Any]:
    warm = await drive(base, concurrency, args.warmup)
    if warm["wrong"]:
        raise RuntimeError(f"{warm['wrong']} of the warm-up runs failed")
    if meter is not None:
        meter.start()
    before, collected, switched = group_ticks(pid), await _collected_s(base), group_switches(pid)
    if args.callgrind:
        callgrind_instrument(pid, "on")
    done = await drive(base, concurrency, args.runs)
    if args.callgrind:
        callgrind_instrument(pid, "off")
    switched = group_switches(pid) - switched
    service_s = (group_ticks(pid) - before) / os.sysconf("SC_CLK_TCK")
    collected = await _collected_s(base) - collected
    backend_s, backends = meter.stop() if meter is not None else (0.0, 0)
    times, wall = done["times"], done["wall"]

    def pct(q: float) -> float | None:
        return round(times[min(len(times) - 1, int(q * len(times)))] * 1000, 1) if times else None

    row: dict[str, Any] = {
        "concurrency": concurrency,
        "runs": args.runs,
        "correct": len(times),
        "wrong": done["wrong"],
        "wall_s": round(wall, 2),
        "runs_per_s": round(args.runs / wall, 1),
        "service_cpu_ms_per_run": round(service_s * 1000 / args.runs, 3),
        "postgres_cpu_ms_per_run": None,
        "total_cpu_ms_per_run": round((service_s + backend_s) * 1000 / args.runs, 3),
        "gc_ms_per_run": round(collected * 1000 / args.runs, 3),
        "peak_rss_mb": _peak_rss_mb(pid),
        "switches_per_run": round(switched / args.runs, 2),
        "instructions_m_per_run": None,  # counted once the process has exited (--callgrind)
        "latency_p50_ms": pct(0.50),
        "latency_p99_ms": pct(0.99),
    }
    if meter is not None:
        row["postgres_cpu_ms_per_run"] = round(backend_s * 1000 / args.runs, 3)
        row["postgres_backends"] = backends
    return row


async def measure_contender(
    name: str,
    args: argparse.Namespace,
    folder: Path,
    model_url: str,
    tree: Path | None,
    concurrencies: list[int],
) -> list[dict[str, Any]]:
    """One contender's process, each concurrency measured in turn (warm-up, then the runs)."""
    kind = "hermes" if tree is not None else name
    storage = name.rsplit("/", 1)[1] if tree is not None else ""
    storage_url, database, conninfo, drop = "", "", "", None
    env = {"PYTHONPATH": str(tree / "src")} if tree is not None else {}
    if storage == "memory":
        storage_url = "memory://"
    elif storage == "sqlite":
        storage_url = f"sqlite:///{folder / 'state.db'}"
    elif storage == "postgresql":
        url, database, drop = pg_database()
        storage_url = f"{url}?application_name={SERVICE_APP}"
        conninfo = url.replace("postgresql+psycopg://", "postgresql://")
    port = free_port()
    log = f"{kind}-{port}.log"
    command = [sys.executable, str(Path(__file__).resolve()), "--serve", kind, "--port", str(port)]
    if args.callgrind:
        output = f"--callgrind-out-file={folder / f'callgrind-{port}.out'}"
        command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", output, *command]
    command += ["--model-url", model_url, "--storage-url", storage_url]
    command += ["--in-flight", str(2 * max(args.concurrency)), "--floor-client", args.floor_client]
    if tree is not None and name.rsplit("/", 1)[0] in (args.aiohttp or []):
        command += ["--transport", "aiohttp"]
    if tree is not None and name.rsplit("/", 1)[0] in (args.inline_tool or []):
        command += ["--tool-mode", "inline"]
    meter: BackendMeter | None = None
    process = None
    rows = []
    try:
        process = start_process(command, folder, log, env)
        base = f"http://127.0.0.1:{port}"
        await wait_up(f"{base}/healthz", process, folder / log, 600 if args.callgrind else 120)
        if database:
            meter = BackendMeter(database, conninfo)
        for concurrency in concurrencies:
            row = await measure(base, process.pid, concurrency, args, meter)
            rows.append(row)
    finally:
        if process is not None:
            stop_group(process, timeout=120 if args.callgrind else 30)
        if meter is not None:
            meter.close()
        if drop is not None:
            drop()
    if args.callgrind:  # one concurrency per process: its count is the row's
        (row,) = rows
        row["instructions_m_per_run"] = round(callgrind_count(folder / log) / args.runs / 1e6, 3)
    return rows


def summarise(results: dict[str, list[dict[str, Any]]], concurrencies: list[int]) -> list[Any]:
    def median(rows: list[dict[str, Any]], key: str) -> float | None:
        values = [r[key] for r in rows if r[key] is not None]
        return round(statistics.median(values), 3) if values else None

    def floor(name: str, concurrency: int) -> float | None:
        rows = [r for r in results.get(name, []) if r["concurrency"] == concurrency]
        return median(rows, "total_cpu_ms_per_run") if rows else None

    summary = []
    for concurrency in concurrencies:
        sdk, bare = floor("sdk-loop", concurrency), floor("httpx-floor", concurrency)
        for name, all_rows in results.items():
            rows = [r for r in all_rows if r["concurrency"] == concurrency]
            if not rows:
                continue
            total = median(rows, "total_cpu_ms_per_run")
            summary.append(
                {
                    "contender": name,
                    "concurrency": concurrency,
                    "rounds": len(rows),
                    "service_cpu_ms_per_run": median(rows, "service_cpu_ms_per_run"),
                    "postgres_cpu_ms_per_run": median(rows, "postgres_cpu_ms_per_run"),
                    "total_cpu_ms_per_run": total,
                    "total_cpu_ms_per_run_each_round": [r["total_cpu_ms_per_run"] for r in rows],
                    "gc_ms_per_run": median(rows, "gc_ms_per_run"),
                    "switches_per_run": median(rows, "switches_per_run"),
                    "instructions_m_per_run": median(rows, "instructions_m_per_run"),
                    "peak_rss_mb": max(
                        (r["peak_rss_mb"] for r in rows if r["peak_rss_mb"] is not None),
                        default=None,
                    ),
                    "x_sdk_loop": round(total / sdk, 2) if total and sdk else None,
                    "x_httpx_floor": round(total / bare, 2) if total and bare else None,
                    "runs_per_s": median(rows, "runs_per_s"),
                    "latency_p50_ms": median(rows, "latency_p50_ms"),
                    "latency_p99_ms": median(rows, "latency_p99_ms"),
                    "all_correct": all(r["wrong"] == 0 for r in rows),
                }
            )
    return summary


async def run(args: argparse.Namespace) -> dict[str, Any]:
    sources = dict(item.split("=", 1) for item in args.src) if args.src else {"hermes": str(ROOT)}
    trees = {name: Path(tree).resolve() for name, tree in sources.items()}
    contenders: dict[str, Path | None] = {
        f"{source}/{storage}": tree for source, tree in trees.items() for storage in args.storage
    }
    contenders.update(dict.fromkeys(BASELINES))
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in contenders}
    model_port = free_port()
    model_url = f"http://127.0.0.1:{model_port}/v1"
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hermes-bench-") as tmp:
        model_log = Path(tmp) / "step_model.log"
        model = start_process(
            [
                sys.executable,
                str(ROOT / "tests" / "harness" / "step_model.py"),
                "--port",
                str(model_port),
                "--latency",
                str(args.latency),
            ],
            Path(tmp),
            model_log.name,
            {},
        )
        try:
            await wait_up(f"{model_url}/models", model, model_log)
            for round_ in range(args.rounds):
                order = list(contenders)
                if round_ % 2:
                    order.reverse()
                # Under callgrind a process per concurrency: its count covers one.
                batches = [[c] for c in args.concurrency] if args.callgrind else [args.concurrency]
                for name in order:
                    folder = Path(tmp) / f"{name.replace('/', '_')}-{round_}"
                    folder.mkdir()
                    for concurrencies in batches:
                        for row in await measure_contender(
                            name, args, folder, model_url, contenders[name], concurrencies
                        ):
                            row["round"] = round_
                            print(json.dumps({name: row}), flush=True)
                            results[name].append(row)
        finally:
            stop_group(model, timeout=30)
    return {
        "benchmark": "service_cost",
        "command": " ".join(["python", "benchmarks/bench_service_cost.py", *sys.argv[1:]]),
        "concurrency": args.concurrency,
        "runs": args.runs,
        "warmup": args.warmup,
        "model_latency_s": args.latency,
        "stack": "asyncio + h11 (uvicorn), every contender",
        "floor_client": args.floor_client,
        "callgrind": args.callgrind,
        "machine": f"{os.cpu_count()} CPUs (shared), {platform.python_implementation()} "
        f"{platform.python_version()}, {platform.machine()}",
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "code": code_version(),
        "sources": sources,
        "duration_s": round(time.monotonic() - started, 1),
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "summary": summarise(results, args.concurrency),
        "rows": results,
    }


def print_table(summary: list[dict[str, Any]]) -> None:
    def show(value: Any, unit: str = "") -> str:
        return "—" if value is None else f"{value}{unit}"

    print(
        "\n| contender | concurrency | CPU ms/run service | + PostgreSQL | total "
        "| × sdk-loop | × httpx floor | of it GC | switches | M instructions "
        "| runs/s | p50 ms | p99 ms | all correct |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for row in summary:
        print(
            f"| {row['contender']} | {row['concurrency']} | {row['service_cpu_ms_per_run']} "
            f"| {show(row['postgres_cpu_ms_per_run'])} | {row['total_cpu_ms_per_run']} "
            f"| {show(row['x_sdk_loop'], '×')} | {show(row['x_httpx_floor'], '×')} "
            f"| {show(row['gc_ms_per_run'])} | {show(row['switches_per_run'])} "
            f"| {show(row['instructions_m_per_run'])} "
            f"| {row['runs_per_s']} | {show(row['latency_p50_ms'])} "
            f"| {show(row['latency_p99_ms'])} | {'yes' if row['all_correct'] else 'NO'} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--runs", type=int, default=400, help="measured runs per row")
    parser.add_argument("--warmup", type=int, default=40, help="runs before each row")
    parser.add_argument(
        "--concurrency", type=int, action="append", help="runs in flight (repeatable; 10 and 100)"
    )
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per model call")
    parser.add_argument(
        "--storage", nargs="+", choices=STORAGES, default=list(STORAGES), help="the service's"
    )
    parser.add_argument(
        "--src", action="append", help="NAME=TREE: a source tree to measure (repeatable)"
    )
    parser.add_argument(
        "--floor-client",
        choices=["httpx", "httpx2"],
        default="httpx2",
        help="the HTTP client of the httpx-floor contender",
    )
    parser.add_argument(
        "--aiohttp",
        action="append",
        metavar="NAME",
        help="the --src tree NAME's service sends its model requests through aiohttp "
        "(model.transport: aiohttp; repeatable)",
    )
    parser.add_argument(
        "--inline-tool",
        action="append",
        metavar="NAME",
        help="the --src tree NAME's service declares its tool inline (execution_mode: inline: "
        "called on the event loop, no thread hop; repeatable)",
    )
    parser.add_argument(
        "--callgrind",
        action="store_true",
        help="count each contender's instructions per run under valgrind's callgrind "
        "(its CPU columns then measure valgrind)",
    )
    parser.add_argument("--json", type=Path, help="also write the report here")
    # A contender's own process: this file with --serve KIND.
    parser.add_argument("--serve", choices=["hermes", *BASELINES], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--model-url", help=argparse.SUPPRESS)
    parser.add_argument("--storage-url", default="", help=argparse.SUPPRESS)
    parser.add_argument("--in-flight", type=int, default=200, help=argparse.SUPPRESS)
    parser.add_argument("--transport", default="", help=argparse.SUPPRESS)
    parser.add_argument("--tool-mode", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(
            args.serve,
            args.port,
            args.model_url,
            args.storage_url,
            args.in_flight,
            args.floor_client,
            args.transport,
            args.tool_mode,
        )
        return
    args.concurrency = args.concurrency or [10, 100]
    report = asyncio.run(run(args))
    print_table(report["summary"])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    if not all(row["all_correct"] for row in report["summary"]):
        sys.exit("some runs failed or answered wrong (see the rows)")


if __name__ == "__main__":
    main()
