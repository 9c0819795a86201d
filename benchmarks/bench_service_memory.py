"""Does the service's memory stay flat? RSS after 100,000 single-turn runs on distinct sessions
against RSS after 10,000 (target: within 10%).

The whole app — middleware, routes, ``RunManager``, the agent, a SQLite store in a temporary
folder — runs in this process, and the runs go through it over HTTP semantics with
``httpx.ASGITransport`` (no socket: a real uvicorn would put the same requests through the same
app, at several times the CPU cost per run on this machine). The model is a ``ScriptedModel``
that answers at once (the list of requests it records for tests is cleared as the runs go, so
what is measured is the service). ``--concurrency`` runs are in flight at any time; every run
names a new session id.

After each ``--every`` runs: a full garbage collection, then the resident set (``VmRSS``) and
the sizes of the service's own tables (finished runs kept for reconnecting clients, pending
approvals, per-session locks, cached history summaries). ``--trace`` also diffs ``tracemalloc``
snapshots between the first checkpoint and the last (slower: use it with fewer runs) to name
what grows.

    python benchmarks/bench_service_memory.py                      # 100,000 runs
    python benchmarks/bench_service_memory.py --runs 20000 --every 2000 --trace
    python benchmarks/bench_service_memory.py --json benchmarks/results/service_memory.json
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import httpx

# Helpers the benchmarks share (this folder is on sys.path when run as a script).
from _common import code_version

from hermes_agent import Agent, ScriptedModel
from hermes_agent.server import ServiceSettings, create_app


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def answer(_messages: object, _tools: object) -> str:
    return "Hello!"


def tables(app: Any, agent: Agent) -> dict[str, int]:
    """How many entries the long-lived tables hold now."""
    manager = app.state.manager
    sessions = app.state.storage.sessions
    served = app.state.agent
    return {
        "runs_in_memory": len(manager.runs),
        "runs_live": len(manager._live),
        "approvals": len(manager.approvals._items),
        "session_locks": len(getattr(sessions, "_locks", ())),
        "history_summaries": len(served.history._summaries),
    }


async def bench(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    model = ScriptedModel(answer, chunk_size=16)
    storage = "memory://" if args.storage == "memory" else f"sqlite:///{folder / 'state.db'}"
    agent = Agent(model=model, storage=storage)
    settings = ServiceSettings(
        auth="none",
        keys_url="memory://",
        max_runs_in_flight=max(64, args.concurrency * 2),
        max_runs_in_flight_per_user=max(64, args.concurrency * 2),
    )
    app = create_app(agent=agent, settings=settings)
    checkpoints: list[dict[str, Any]] = []
    failures = 0
    first_snapshot: tracemalloc.Snapshot | None = None
    growth: list[str] = []
    started = time.perf_counter()

    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            counter = iter(range(args.runs))
            done = 0

            async def worker(stop: int) -> None:
                nonlocal failures, done
                for index in counter:
                    body = {"message": f"hello {index}", "session_id": f"s{index}"}
                    response = await client.post("/v1/runs", json=body)
                    if response.status_code != 200 or response.json()["output"] != "Hello!":
                        failures += 1
                        if failures <= 3:
                            print(f"  run failed: {response.status_code} {response.text[:200]}")
                    done += 1
                    if done >= stop:
                        return

            while done < args.runs:
                stop = min(args.runs, done + args.every)
                await asyncio.gather(*(worker(stop) for _ in range(args.concurrency)))
                model.requests.clear()  # the scripted model's record, kept for tests
                gc.collect()
                point = {
                    "runs": done,
                    "rss_mib": round(rss_bytes() / 2**20, 2),
                    "elapsed_s": round(time.perf_counter() - started, 1),
                    **tables(app, agent),
                }
                checkpoints.append(point)
                print(json.dumps(point), flush=True)
                if args.trace and first_snapshot is None:
                    first_snapshot = tracemalloc.take_snapshot()
            if args.trace and first_snapshot is not None:
                last = tracemalloc.take_snapshot()
                for stat in last.compare_to(first_snapshot, "traceback")[:15]:
                    where = " <- ".join(str(frame) for frame in stat.traceback[:4])
                    size = f"{stat.size_diff / 1024:+.1f} KiB, {stat.count_diff:+d} blocks"
                    growth.append(f"{size}: {where}")
    agent.close()
    base = checkpoints[0]
    final = checkpoints[-1]
    return {
        "benchmark": "service_memory",
        "storage": args.storage,
        "runs": args.runs,
        "concurrency": args.concurrency,
        "failures": failures,
        "transport": "httpx.ASGITransport (in-process HTTP, no socket)",
        "command": " ".join(["python", "benchmarks/bench_service_memory.py", *sys.argv[1:]]),
        "rss_first_mib": base["rss_mib"],
        "rss_last_mib": final["rss_mib"],
        "ratio": round(final["rss_mib"] / base["rss_mib"], 4),
        "runs_per_s": round(args.runs / (time.perf_counter() - started), 1),
        "machine": f"{os.cpu_count()} CPUs (shared), {platform.python_implementation()} "
        f"{platform.python_version()}, {platform.machine()}",
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "code": code_version(),
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "checkpoints": checkpoints,
        "tracemalloc_growth": growth,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--every", type=int, default=10_000, help="runs between checkpoints")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--storage", choices=["sqlite", "memory"], default="sqlite")
    parser.add_argument("--trace", action="store_true", help="diff tracemalloc snapshots")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args()
    if args.trace:
        tracemalloc.start(8)
    with tempfile.TemporaryDirectory(prefix="hermes-bench-") as folder:
        report = asyncio.run(bench(args, Path(folder)))
    print(
        f"\nRSS after {report['checkpoints'][0]['runs']:,} runs: {report['rss_first_mib']} MiB; "
        f"after {report['runs']:,}: {report['rss_last_mib']} MiB; ratio {report['ratio']} "
        f"({report['failures']} failures, {report['runs_per_s']} runs/s)"
    )
    for line in report["tracemalloc_growth"]:
        print("  " + line)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    sys.exit(1 if report["failures"] else 0)


if __name__ == "__main__":
    main()
