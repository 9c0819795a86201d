"""Scale-out on workers: runs per second with 1, 2 and 4 ``hermes-agent worker`` processes, and
the latency a run gains by going through the queue instead of running in process.

Processes on loopback:

- the step model (``tests/harness/step_model.py`` in its own process): an OpenAI-compatible endpoint
  that answers each call after ``--latency`` seconds; ``job <tag> steps=2`` makes it call the
  tool ``step`` twice, one call per turn, then answer — 3 model calls, so a run takes at least
  ``3 × latency`` (600 ms at the default 200 ms);
- the workers: ``hermes-agent worker --config config.yaml --tools tools.py --concurrency C``,
  each in its own process (Celery's thread pool), taking runs from a Redis queue of this
  benchmark's own (deleted at the end), keeping the runs' state, sessions and audit trail in a
  throwaway PostgreSQL database (dropped at the end); the tool ``step`` only returns a string;
- this process: it submits the runs (``submit(agent, ...)`` on distinct sessions), and runs the
  same config in process for the comparison.

Measured:

1. **Throughput**: for each worker count, ``--runs`` runs submitted back to back (after a
   warm-up of ``2 × workers × C`` runs); runs/s = completed runs / (last completion − first
   submit), against the ideal ``workers × C / (3 × latency)``. Each run's latency is its
   submit-to-completion time as the store recorded it (``created_ns`` → the final
   ``updated_ns``), split into the wait in the queue (→ the claim) and the execution
   (claim → completion). Workers are added between rows (1, then one more, then two more).
2. **Queue vs in process**, one run at a time with one idle worker: ``await agent.arun(...)``
   in this process, and ``submit(agent, ...)`` + ``handle.result(poll=5 ms)``, alternated
   (``--latency-runs`` of each, after 5 of each to warm up), on the same store and model.

CPU per process group (workers, the step model, this process, PostgreSQL's backends for this
benchmark's database, other PostgreSQL backends, Redis, everything else on the machine) is read
from ``/proc`` over each measurement, with the machine's busy share of all its cores.

    python benchmarks/bench_worker_scale.py --json benchmarks/results/worker_scale.json
    python benchmarks/bench_worker_scale.py --workers 1 2 --runs 100 --latency-runs 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

# Helpers the benchmarks share (this folder is on sys.path when run as a script).
from _common import ROOT, code_version, free_port, pg_database
from _common import stop_group as stop

from hermes_agent.worker import submit

FINISHED = ("completed", "failed", "dead", "cancelled")

TOOLS = '''
from hermes_agent import tool


@tool
def step(tag: str, n: int) -> str:
    """Do step n of job tag.

    Args:
        tag: the job.
        n: the step number.
    """
    return f"step {n} of {tag} done"
'''


def write_files(folder: Path, model_url: str, db_url: str, broker: str, queue: str) -> Path:
    config = folder / "config.yaml"
    config.write_text(
        f"""
model:
  provider: openai
  model_name: step-model
  base_url: {model_url}
  api_key: none
  mode: native
  max_retries: 0
  timeout: 120
agent:
  max_iterations: 6
tools:
  step:
    idempotent: true
storage:
  url: {db_url}
queue:
  broker: {broker}
  queue_name: {queue}
  lease_ttl: 60
""",
        encoding="utf-8",
    )
    (folder / "tools.py").write_text(TOOLS, encoding="utf-8")
    return config


# -- processes ------------------------------------------------------------------------------


def wait_for_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on port {port}") from None
            time.sleep(0.1)


class Workers:
    """``hermes-agent worker`` processes on one config, each in a process group of its own."""

    def __init__(self, folder: Path, config: Path, concurrency: int) -> None:
        self.folder = folder
        self.config = config
        self.concurrency = concurrency
        self.processes: list[subprocess.Popen[bytes]] = []

    def add(self, count: int) -> None:
        started = []
        for _ in range(count):
            index = len(self.processes)
            with (self.folder / f"worker{index}.log").open("wb") as output:
                process = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "hermes_agent",
                        "worker",
                        "--config",
                        str(self.config),
                        "--tools",
                        str(self.folder / "tools.py"),
                        "--concurrency",
                        str(self.concurrency),
                        "--name",
                        f"bench{index}-{uuid.uuid4().hex[:6]}@%h",
                    ],
                    cwd=self.folder,
                    env={**os.environ, "HOME": str(self.folder)},
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self.processes.append(process)
            started.append(index)
        deadline = time.monotonic() + 120
        for index in started:
            log = self.folder / f"worker{index}.log"
            while b" ready." not in log.read_bytes():
                if self.processes[index].poll() is not None or time.monotonic() > deadline:
                    tail = log.read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"worker {index} did not start:\n{tail}")
                time.sleep(0.1)

    @property
    def groups(self) -> set[int]:
        return {process.pid for process in self.processes}

    def stop(self) -> None:
        for process in self.processes:
            stop(process)


def delete_queue(broker: str, queue: str) -> None:
    from hermes_agent.config import QueueConfig
    from hermes_agent.worker.app import make_celery

    app = make_celery(QueueConfig(broker=broker, queue_name=queue))
    with app.connection_for_write() as conn:
        conn.default_channel.queue_delete(queue)
    if broker.startswith("redis"):  # kombu leaves the queue's exchange bindings behind
        import redis

        client = redis.Redis.from_url(broker)
        client.delete(f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")
        client.close()


# -- CPU accounting from /proc -----------------------------------------------------------------


def machine_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of all cores since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal
    return total - idle, total


def process_ticks() -> dict[int, tuple[str, int, int]]:
    """pid → (name, process group, user + system ticks) for every process now alive."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(entry.path, "stat").read_text()
            name = raw[raw.index("(") + 1 : raw.rindex(")")]
            fields = raw[raw.rindex(")") + 2 :].split()
            if name == "postgres":
                command = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ")
                name = f"postgres:{command.decode(errors='replace')}"
        except (OSError, ValueError):
            continue
        found[int(entry.name)] = (name, int(fields[2]), int(fields[11]) + int(fields[12]))
    return found


class CpuMeter:
    """CPU seconds per group of processes between ``start`` and ``stop``."""

    def __init__(self, workers: Workers, model_pid: int, database: str) -> None:
        self.workers = workers
        self.model_pid = model_pid
        self.database = database

    def group(self, pid: int, name: str, pgrp: int) -> str:
        if pgrp in self.workers.groups:
            return "workers"
        if pgrp == self.model_pid:
            return "step_model"
        if pid == os.getpid():
            return "benchmark"
        if name.startswith("postgres:"):
            return "postgres_this_db" if f" {self.database} " in name else "postgres_other"
        if name.startswith("redis-server"):
            return "redis"
        return "other"

    def start(self) -> None:
        self.before = process_ticks()
        self.machine_before = machine_ticks()
        self.started = time.perf_counter()

    def stop(self, runs: int) -> dict[str, Any]:
        wall = time.perf_counter() - self.started
        after = process_ticks()
        busy_after, total_after = machine_ticks()
        hz = os.sysconf("SC_CLK_TCK")
        spent: dict[str, float] = {}
        others: dict[str, float] = {}
        for pid, (name, pgrp, ticks) in after.items():
            earlier = self.before.get(pid)
            used = (ticks - (earlier[2] if earlier and earlier[0] == name else 0)) / hz
            key = self.group(pid, name, pgrp)
            spent[key] = spent.get(key, 0.0) + used
            if key == "other":
                others[name] = others.get(name, 0.0) + used
        busiest = sorted(others.items(), key=lambda item: -item[1])[:4]
        busy = busy_after - self.machine_before[0]
        total = total_after - self.machine_before[1]
        return {
            "machine_busy_share": round(busy / total, 3) if total else None,
            "cores_used": {key: round(value / wall, 2) for key, value in sorted(spent.items())},
            "cpu_ms_per_run": {
                key: round(value * 1000 / max(1, runs), 1) for key, value in sorted(spent.items())
            },
            "other_busiest_cores": {name: round(value / wall, 2) for name, value in busiest},
        }


# -- measuring ---------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (of 50 values, p99 is the largest)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def fetch_runs(conninfo: str, ids: list[str]) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(conninfo) as conn:
        return conn.execute(
            "SELECT request_id, status, created_ns, heartbeat_ns, updated_ns, claims, result "
            "FROM hermes_runs WHERE request_id = ANY(%s)",
            (ids,),
        ).fetchall()


def wait_finished(conninfo: str, ids: list[str], timeout: float) -> None:
    import psycopg

    deadline = time.monotonic() + timeout
    with psycopg.connect(conninfo, autocommit=True) as conn:
        while True:
            done = conn.execute(
                "SELECT count(*) FROM hermes_runs WHERE request_id = ANY(%s) AND status = ANY(%s)",
                (ids, list(FINISHED)),
            ).fetchone()
            if done is not None and done[0] == len(ids):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{len(ids) - (done or [0])[0]} runs unfinished after {timeout} s"
                )
            time.sleep(0.1)


def check_outputs(rows: list[tuple[Any, ...]], steps: int) -> int:
    """How many runs completed with the step model's answer after ``steps`` tool calls."""
    good = 0
    for _, status, *_rest, result in rows:
        if status != "completed" or result is None:
            continue
        output = json.loads(result).get("output", "")
        good += f" after {steps} steps" in output and output.startswith("done ")
    return good


def throughput_row(
    agent: Any,
    conninfo: str,
    meter: CpuMeter,
    workers: int,
    concurrency: int,
    runs: int,
    steps: int,
    latency: float,
) -> dict[str, Any]:
    label = uuid.uuid4().hex[:6]
    warm = [
        submit(agent, f"job w{label}{i} steps={steps}", session_id=f"warm-{label}-{i}").request_id
        for i in range(2 * workers * concurrency)
    ]
    wait_finished(conninfo, warm, timeout=300)
    meter.start()
    first_submit_ns = time.time_ns()
    ids = [
        submit(agent, f"job r{label}{i} steps={steps}", session_id=f"run-{label}-{i}").request_id
        for i in range(runs)
    ]
    submitted_s = (time.time_ns() - first_submit_ns) / 1e9
    wait_finished(conninfo, ids, timeout=600)
    rows = fetch_runs(conninfo, ids)
    cpu = meter.stop(runs)
    completed = [r for r in rows if r[1] == "completed"]
    wall = (max(r[4] for r in rows) - first_submit_ns) / 1e9
    total = [(r[4] - r[2]) / 1e9 for r in completed]
    waited = [(r[3] - r[2]) / 1e9 for r in completed]
    executed = [(r[4] - r[3]) / 1e9 for r in completed]
    ideal = workers * concurrency / (latency * (steps + 1))
    row = {
        "workers": workers,
        "concurrency_per_worker": concurrency,
        "runs": runs,
        "completed": len(completed),
        "correct_outputs": check_outputs(rows, steps),
        "taken_over": sum(1 for r in rows if r[5] > 1),
        "submit_s": round(submitted_s, 2),
        "wall_s": round(wall, 2),
        "runs_per_s": round(len(completed) / wall, 2),
        "ideal_runs_per_s": round(ideal, 2),
        "fraction_of_ideal": round(len(completed) / wall / ideal, 3),
        "latency_p50_ms": ms(pct(total, 0.5)),
        "latency_p99_ms": ms(pct(total, 0.99)),
        "queue_wait_p50_ms": ms(pct(waited, 0.5)),
        "queue_wait_p99_ms": ms(pct(waited, 0.99)),
        "execution_p50_ms": ms(pct(executed, 0.5)),
        "execution_p99_ms": ms(pct(executed, 0.99)),
        **cpu,
    }
    return row


def queue_vs_in_process(
    agent: Any, conninfo: str, meter: CpuMeter, runs: int, steps: int
) -> dict[str, Any]:
    """One run at a time, alternating in process and through the queue (one idle worker)."""
    label = uuid.uuid4().hex[:6]
    inline: list[float] = []
    caller: list[float] = []
    ids: list[str] = []
    with asyncio.Runner() as runner:  # one loop: the model client stays bound to it
        for i in range(5 + runs):
            message = f"job {label}{i} steps={steps}"
            started = time.perf_counter()
            result = runner.run(agent.arun(message, session_id=f"inline-{label}-{i}"))
            took = time.perf_counter() - started
            if not result.output.startswith("done "):
                raise RuntimeError(f"unexpected in-process output: {result.output!r}")
            if i == 5:
                meter.start()
            if i >= 5:
                inline.append(took)
            started = time.perf_counter()
            handle = submit(agent, message, session_id=f"queued-{label}-{i}")
            queued = handle.result(timeout=60, poll=0.005)
            took = time.perf_counter() - started
            if not queued.output.startswith("done "):
                raise RuntimeError(f"unexpected queued output: {queued.output!r}")
            if i >= 5:
                caller.append(took)
                ids.append(handle.request_id)
    cpu = meter.stop(2 * runs)
    rows = fetch_runs(conninfo, ids)
    stored = [(r[4] - r[2]) / 1e9 for r in rows]
    waited = [(r[3] - r[2]) / 1e9 for r in rows]
    executed = [(r[4] - r[3]) / 1e9 for r in rows]

    def stats(values: list[float]) -> dict[str, float]:
        return {"p50_ms": ms(pct(values, 0.5)), "p99_ms": ms(pct(values, 0.99))}

    return {
        "runs_each": runs,
        "in_process": stats(inline),
        "queued_caller": stats(caller),
        "queued_store": stats(stored),
        "queued_wait_to_claim": stats(waited),
        "queued_execution": stats(executed),
        "added_p50_ms": ms(pct(caller, 0.5) - pct(inline, 0.5)),
        "added_p99_ms": ms(pct(caller, 0.99) - pct(inline, 0.99)),
        "added_store_p50_ms": ms(pct(stored, 0.5) - pct(inline, 0.5)),
        "in_process_mean_ms": ms(statistics.fmean(inline)),
        "queued_caller_mean_ms": ms(statistics.fmean(caller)),
        **cpu,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from hermes_agent import build_agent

    started = time.monotonic()
    queue = f"hermes-bench-{uuid.uuid4().hex[:10]}"
    model_port = free_port()
    model = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "tests" / "harness" / "step_model.py"),
            "--port",
            str(model_port),
            "--latency",
            str(args.latency),
        ],
        start_new_session=True,
    )
    db_url, db_name, drop = pg_database()
    conninfo = db_url.replace("postgresql+psycopg://", "postgresql://")
    rows: list[dict[str, Any]] = []
    compared: dict[str, Any] = {}
    try:
        wait_for_port(model_port)
        with tempfile.TemporaryDirectory(prefix="hermes-bench-") as folder:
            config = write_files(
                Path(folder), f"http://127.0.0.1:{model_port}/v1", db_url, args.broker, queue
            )
            agent = build_agent(config, tools_files=[Path(folder) / "tools.py"])
            workers = Workers(Path(folder), config, args.concurrency)
            meter = CpuMeter(workers, model.pid, db_name)
            try:
                workers.add(1)
                if args.latency_runs:
                    compared = queue_vs_in_process(
                        agent, conninfo, meter, args.latency_runs, args.steps
                    )
                    print(json.dumps({"queue_vs_in_process": compared}), flush=True)
                for count in args.workers:
                    if count > len(workers.processes):
                        workers.add(count - len(workers.processes))
                    row = throughput_row(
                        agent,
                        conninfo,
                        meter,
                        count,
                        args.concurrency,
                        args.runs,
                        args.steps,
                        args.latency,
                    )
                    print(json.dumps(row), flush=True)
                    rows.append(row)
            finally:
                workers.stop()
                agent.close()
                delete_queue(args.broker, queue)
    finally:
        stop(model)
        drop()
    return {
        "benchmark": "worker_scale",
        "model_latency_s": args.latency,
        "steps": args.steps,
        "model_calls_per_run": args.steps + 1,
        "ideal_run_s": round(args.latency * (args.steps + 1), 3),
        "concurrency_per_worker": args.concurrency,
        "pool": "threads",
        "broker": "redis",
        "store": "postgresql",
        "command": " ".join(["python", "benchmarks/bench_worker_scale.py", *sys.argv[1:]]),
        "machine": f"{os.cpu_count()} CPUs (shared), {platform.python_implementation()} "
        f"{platform.python_version()}, {platform.machine()}",
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "code": code_version(),
        "duration_s": round(time.monotonic() - started, 1),
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "rows": rows,
        "queue_vs_in_process": compared,
    }


def print_report(report: dict[str, Any]) -> None:
    print("\n| workers | runs | runs/s | ideal | fraction | p50 | p99 | execution p50 | busy |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in report["rows"]:
        print(
            f"| {row['workers']} | {row['completed']}/{row['runs']} | {row['runs_per_s']} "
            f"| {row['ideal_runs_per_s']} | {row['fraction_of_ideal'] * 100:.1f}% "
            f"| {row['latency_p50_ms']} ms | {row['latency_p99_ms']} ms "
            f"| {row['execution_p50_ms']} ms | {row['machine_busy_share'] * 100:.0f}% |"
        )
    compared = report["queue_vs_in_process"]
    if compared:
        inline, queued = compared["in_process"], compared["queued_caller"]
        print(
            f"\nin process p50/p99 {inline['p50_ms']}/{inline['p99_ms']} ms; queued "
            f"{queued['p50_ms']}/{queued['p99_ms']} ms; added {compared['added_p50_ms']}/"
            f"{compared['added_p99_ms']} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--concurrency", type=int, default=8, help="runs per worker at a time")
    parser.add_argument("--runs", type=int, default=400, help="runs per worker count")
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per model call")
    parser.add_argument("--steps", type=int, default=2, help="tool calls per run")
    parser.add_argument(
        "--latency-runs", type=int, default=50, help="runs of each kind, queue vs in process"
    )
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args()
    if sorted(args.workers) != args.workers:
        parser.error("--workers must be in increasing order (workers are added between rows)")
    report = run(args)
    print_report(report)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
