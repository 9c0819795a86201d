"""What a queued run's store calls cost on PostgreSQL, alone: CPU ms per run in the calling
process and in its PostgreSQL backend, and the wall time, with no model, no Celery and no event
loop around them (the queue benchmark's noise hides a change of a millisecond or two here).

One run's calls, as a worker makes them for a run of one tool call: the submitter's ``add``,
the ``claim``, the session's ``load`` (skipped where the claim says the session holds no
message yet, as the worker does), the model turn's ``write_batch`` (two journal entries,
three events) and the ``finish`` (two entries, three events and the last one, eight trail
records and the answer's, the session turn of four messages): the rows a worker writes for
the queue benchmark's run. One thread, one pooled connection, a throwaway database per
contender. Each ``--src`` tree runs in a process of its own (``PYTHONPATH=TREE/src``); rounds
alternate the trees (the order flips each round), and the summary holds the medians over the
rounds.

With ``--storage sqlite``, a service's writes for such a run on a SQLite file instead: the
run's accepted record, the turn of four messages appended to a new session (both on the
service's event loop), and the trail's burst of the run's nine records (on the writer's
thread), each in its own transaction, as the service makes them.

    python benchmarks/bench_store_calls.py --src before=OLD_TREE --src after=NEW_TREE
    python benchmarks/bench_store_calls.py --rounds 5 --runs 500 --json store_calls.json
    python benchmarks/bench_store_calls.py --storage sqlite --src before=OLD --src after=NEW
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import ROOT, code_version, cpu_ticks, pg_database

BENCHMARKS = Path(__file__).resolve().parent

# Run in the measured tree's process: prints one JSON line.
CALLS = """
import json, os, resource, sys, time
from _common import cpu_ticks
from hermes_agent.audit.records import AuditRecord
from hermes_agent.storage.sql import SqlStorage
from hermes_agent.types import Message, ToolCall
from hermes_agent.worker.store import Batch, RunStore
try:  # a tree from before the request crossed the queue as itself
    from hermes_agent.worker.store import request_payload
except ImportError:
    from hermes_agent.runs.request import QueuedRequest as _Queued
    def request_payload(message):
        return _Queued(message=message)

url, runs = sys.argv[1], int(sys.argv[2])
storage = SqlStorage(url)
store = RunStore(storage)
with storage.engine.connect() as conn:
    backend = int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())



def record(rid, session, step, stage, role, seq):
    return AuditRecord(
        request_id=rid, session_id=session, step=step, stage=stage, role=role,
        content='{"text": "' + "z" * 120 + '"}', timestamp_ns=time.time_ns(), latency_ms=1.5,
        status="ok", status_code=200, model_name="step-model", system_prompt_sha256="0" * 64,
        seq=seq,
    )


STAGES = [
    ("InputParser", "user"), ("ThoughtGenerator", "assistant"), ("ToolSelector", "selection"),
    ("ToolExecutor", "tool"), ("ThoughtGenerator", "assistant"), ("ToolSelector", "selection"),
    ("OutputRenderer", "output"), ("Worker", "usage"),
]


def one(tag):
    session = f"s-{tag}"
    rid = store.add(session, request_payload("hello"))
    claim = store.claim(rid, "bench", 30.0)
    assert claim.outcome == "claimed", claim.outcome
    if getattr(claim, "history", True):  # older trees' claims do not say: they read it
        storage.sessions.load(session)
    turn = Batch()
    turn.entries["turn/0"] = ("done", {"text": "x" * 300})
    turn.entries["call/0/0"] = ("started", {"tool": "step", "arguments": {"n": 1}})
    turn.events.extend([(1, {"kind": "input"}), (2, {"kind": "model"}), (3, {"kind": "call"})])
    store.write_batch(rid, claim.token, turn)
    last = Batch()
    last.entries["turn/1"] = ("done", {"text": "y" * 300})
    last.entries["call/0/0"] = ("done", {"value": "ok", "status_code": 200, "error": None})
    last.events.extend(
        [(4, {"kind": "call_result"}), (5, {"kind": "model"}), (6, {"kind": "output"})]
    )
    last.records.extend(
        record(rid, session, n // 4, stage, role, n + 1) for n, (stage, role) in enumerate(STAGES)
    )
    call = ToolCall("step", {"n": 1}, id="call_1")
    store.finish(
        rid, claim.token, "completed", result={"output": "ok"},
        turn=[
            Message("user", "hello"), Message("assistant", "", tool_calls=[call]),
            Message("tool", "step 1 done"), Message("assistant", "ok"),
        ],
        output=record(rid, session, 1, "OutputRenderer", "answer", 0),
        event={"kind": "result"}, batch=last,
    )


for n in range(30):
    one(f"warm{n}")
usage = resource.getrusage(resource.RUSAGE_SELF)
cpu, server, wall = usage.ru_utime + usage.ru_stime, cpu_ticks(backend), time.perf_counter()
for n in range(runs):
    one(str(n))
usage = resource.getrusage(resource.RUSAGE_SELF)
hz = os.sysconf("SC_CLK_TCK")
print(json.dumps({
    "client_cpu_ms_per_run": round((usage.ru_utime + usage.ru_stime - cpu) / runs * 1000, 3),
    "server_cpu_ms_per_run": round((cpu_ticks(backend) - server) / hz / runs * 1000, 3),
    "wall_ms_per_run": round((time.perf_counter() - wall) / runs * 1000, 3),
}))
storage.close()
"""


# The service's writes for one run on a SQLite file (``--storage sqlite``): prints one JSON line.
SQLITE_CALLS = """
import json, resource, sys, time
from hermes_agent.audit.records import AuditRecord
from hermes_agent.storage.sql import SqlAuditSink, SqlStorage
from hermes_agent.types import Message, ToolCall

url, runs = sys.argv[1], int(sys.argv[2])
storage = SqlStorage(url)
sink = SqlAuditSink(storage)  # as the service writes: the accepted record, the writer's bursts
STAGES = [
    ("RunManager", "accepted"), ("InputParser", "user"), ("ThoughtGenerator", "assistant"),
    ("ToolSelector", "selection"), ("ToolExecutor", "tool"), ("ThoughtGenerator", "assistant"),
    ("ToolSelector", "selection"), ("OutputRenderer", "output"), ("OutputRenderer", "answer"),
    ("Usage", "usage"),
]


def record(rid, session, n):
    stage, role = STAGES[n]
    return AuditRecord(
        request_id=rid, session_id=session, step=n // 4, stage=stage, role=role,
        content='{"text": "' + "z" * 120 + '"}', timestamp_ns=time.time_ns(), latency_ms=1.5,
        status="ok", status_code=200, model_name="step-model", system_prompt_sha256="0" * 64,
        seq=n,
    )


def one(tag):
    rid, session = f"r-{tag}", f"s-{tag}"
    sink.write([record(rid, session, 0)])
    call = ToolCall("step", {"n": 1}, id="call_1")
    storage.sessions.append(session, [
        Message("user", "hello"), Message("assistant", "", tool_calls=[call]),
        Message("tool", "step 1 done"), Message("assistant", "ok"),
    ])
    sink.write([record(rid, session, n) for n in range(1, len(STAGES))])


for n in range(30):
    one(f"warm{n}")
usage = resource.getrusage(resource.RUSAGE_SELF)
cpu, wall = usage.ru_utime + usage.ru_stime, time.perf_counter()
for n in range(runs):
    one(str(n))
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({
    "client_cpu_ms_per_run": round((usage.ru_utime + usage.ru_stime - cpu) / runs * 1000, 3),
    "server_cpu_ms_per_run": 0.0,
    "wall_ms_per_run": round((time.perf_counter() - wall) / runs * 1000, 3),
}))
storage.close()
"""


def measure(src: Path, runs: int, storage: str = "postgresql") -> dict[str, Any]:
    if storage == "sqlite":
        folder = tempfile.TemporaryDirectory(prefix="hermes-bench-")
        url, script, drop = f"sqlite:///{folder.name}/state.db", SQLITE_CALLS, folder.cleanup
    else:
        url, _name, drop = pg_database()
        script = CALLS
    try:
        done = subprocess.run(
            [sys.executable, "-c", script, url, str(runs)],
            # The measured tree's code, and this folder's helpers (``_common``).
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(src / "src"), str(BENCHMARKS)])},
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
    finally:
        drop()
    if done.returncode != 0:
        raise RuntimeError(f"the store calls failed in {src}:\n{done.stderr[-3000:]}")
    row: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    row["total_cpu_ms_per_run"] = round(
        row["client_cpu_ms_per_run"] + row["server_cpu_ms_per_run"], 3
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument(
        "--src", action="append", default=[], help="NAME=TREE: a source tree (repeatable)"
    )
    parser.add_argument(
        "--storage",
        choices=("postgresql", "sqlite"),
        default="postgresql",
        help="a queued run's calls on PostgreSQL, or a service's writes on a SQLite file",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sources = dict(item.split("=", 1) for item in args.src) or {"hermes": str(ROOT)}
    assert cpu_ticks(os.getpid()) is not None, "needs /proc"
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in sources}
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    for round_ in range(args.rounds):
        order = list(sources) if round_ % 2 == 0 else list(reversed(sources))
        for name in order:
            row = measure(Path(sources[name]), args.runs, args.storage) | {"round": round_}
            rows[name].append(row)
            print(json.dumps({name: row}), flush=True)
    keys = ("client_cpu_ms_per_run", "server_cpu_ms_per_run", "total_cpu_ms_per_run")
    summary = {
        name: {
            key: round(statistics.median(r[key] for r in found), 3)
            for key in (*keys, "wall_ms_per_run")
        }
        for name, found in rows.items()
    }
    report = {
        "benchmark": "store_calls",
        "command": "python " + " ".join(sys.argv),
        "machine": f"{os.cpu_count()} CPUs (shared), CPython {platform.python_version()}",
        "when": started,
        "code": code_version(),
        "runs": args.runs,
        "storage": args.storage,
        "summary": summary,
        "rows": rows,
    }
    print(json.dumps(report["summary"], indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
