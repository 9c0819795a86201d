"""What the SQL store costs: per-step overhead with sessions + audit on vs off, and the memory of
a process holding many sessions.

Per-step: ScriptedModel + a trivial tool, N=10 and N=200 tool-calling steps per run (medians);
"off" is the in-memory session store with no audit trail, "on" a SQLite file (WAL) holding the
session and the audit trail (write-behind; the flush after each run is not timed, as a caller
does not wait for it). Memory: the resident set of a fresh process after 1,000 sessions of 50
turns each were written through an Agent (SQL store) or held in the in-memory store.

    python benchmarks/bench_store.py                 # markdown tables
    python benchmarks/bench_store.py --runs 10 --sessions 200
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The scripted agent of the overhead benchmark (this folder is on sys.path when run as a script).
from bench_overhead import Script, echo

from hermes_agent import Agent, Memory, ScriptedModel
from hermes_agent.storage import SqlStorage
from hermes_agent.types import Message


def per_step(steps: int, runs: int, storage: SqlStorage | None) -> float:
    """Median seconds per step over ``runs`` runs, each in a fresh session."""
    script = Script()
    agent = Agent(
        model=ScriptedModel(script), tools=[echo], max_iterations=steps + 1, storage=storage
    )
    samples = []
    for _ in range(runs):
        script.remaining = steps
        gc.collect()
        started = time.perf_counter()
        result = agent.run("go")
        elapsed = time.perf_counter() - started
        assert result.status == 200 and len(result.tool_calls) == steps, result.output
        samples.append(elapsed / steps)
        if storage is not None:
            storage.audit.flush()  # the next run starts with an empty queue
    agent.close()
    return statistics.median(samples)


def overhead(runs: int) -> dict[str, dict[int, float]]:
    folder = Path(tempfile.mkdtemp(prefix="hermes-bench-"))
    per_step(10, 5, None)  # warm up imports and the event loop
    results: dict[str, dict[int, float]] = {"off": {}, "on": {}}
    for steps in (10, 200):
        count = runs if steps == 10 else max(5, runs // 4)
        results["off"][steps] = per_step(steps, count, None)
        with SqlStorage(f"sqlite:///{folder / f'bench-{steps}.db'}") as storage:
            per_step(steps, 2, storage)  # warm the connection pool and the writer thread
            results["on"][steps] = per_step(steps, count, storage)
    return results


# -- memory (each measurement in a fresh process) -----------------------------------------


def _rss_kib() -> int:
    """The resident set now (Linux), else the peak so far."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * resource.getpagesize() // 1024
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _fill(kind: str, sessions: int, turns: int, path: str) -> None:
    """Child process: hold ``sessions`` x ``turns`` turns; print RSS before and after (KiB)."""
    gc.collect()
    before = _rss_kib()
    model = ScriptedModel(lambda messages, tools: "an answer of a typical short length, ok")
    storage = SqlStorage(f"sqlite:///{path}") if kind == "sql" else None
    agent = Agent(model=model, storage=storage, audit=False, memory=Memory(history_window=turns))
    started = time.perf_counter()
    # Through the store's own append, one transaction per turn, as an Agent writes them.
    for s in range(sessions):
        for t in range(turns):
            agent.sessions.append(
                f"session-{s}",
                [Message("user", f"question {t} of session {s}"), Message("assistant", "ok")],
            )
    # One real run per 100 sessions, to have the agent's own state in the measurement.
    for s in range(0, sessions, 100):
        agent.run("one more", session_id=f"session-{s}")
    elapsed = time.perf_counter() - started
    gc.collect()
    after = _rss_kib()
    print(json.dumps({"before_kib": before, "after_kib": after, "seconds": elapsed}))


def memory(sessions: int, turns: int) -> dict[str, dict[str, float]]:
    folder = Path(tempfile.mkdtemp(prefix="hermes-bench-mem-"))
    out: dict[str, dict[str, float]] = {}
    for kind in ("memory", "sql"):
        done = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                kind,
                str(sessions),
                str(turns),
                str(folder / "sessions.db"),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        data = json.loads(done.stdout.strip().splitlines()[-1])
        db_size = sum(p.stat().st_size for p in folder.glob("sessions.db*")) if kind == "sql" else 0
        out[kind] = {
            "rss_mib": data["after_kib"] / 1024,
            "added_mib": (data["after_kib"] - data["before_kib"]) / 1024,
            "seconds": data["seconds"],
            "db_mib": db_size / 2**20,
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=30, help="runs per size (median taken)")
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--json", action="store_true", help="print JSON instead of markdown")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        kind, sessions, turns, path = options.child
        _fill(kind, int(sessions), int(turns), path)
        return
    timing = overhead(options.runs)
    mem = memory(options.sessions, options.turns)
    if options.json:
        print(json.dumps({"per_step_s": timing, "memory": mem}))
        return
    print("| steps per run | store off (µs/step) | SQLite on (µs/step) | added (µs/step) |")
    print("|---|---|---|---|")
    for steps in (10, 200):
        off, on = timing["off"][steps] * 1e6, timing["on"][steps] * 1e6
        print(f"| {steps} | {off:.1f} | {on:.1f} | {on - off:+.1f} |")
    ratio = timing["on"][200] / timing["on"][10]
    print(f"\nWith the store on, N=200 / N=10 per-step ratio: {ratio:.2f} (target ≤ 1.5); ")
    print("target: ≤ 1000 µs added per step.\n")
    print(f"| {options.sessions} sessions × {options.turns} turns | RSS (MiB) | added (MiB) |")
    print("|---|---|---|")
    labels = {"memory": "in-memory store", "sql": "SQLite store (via Agent)"}
    for kind, row in mem.items():
        print(f"| {labels[kind]} | {row['rss_mib']:.1f} | {row['added_mib']:.1f} |")
    print(f"\nSQLite file: {mem['sql']['db_mib']:.1f} MiB; filled in {mem['sql']['seconds']:.1f} s")


if __name__ == "__main__":
    main()
