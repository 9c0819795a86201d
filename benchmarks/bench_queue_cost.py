"""What a queued run costs: CPU ms per run in the worker process and in the PostgreSQL backends
serving it, against a bare Celery task making the same model calls with the openai SDK.

The workload (the step model, ``tests/harness/step_model.py``, in its own process on loopback): a
run is model call → the tool ``step`` → model call → answer (``job <tag> steps=1``), each model
reply after ``--latency`` seconds. Contenders, each a Celery worker of its own (thread pool,
``--concurrency``, default 10) on a Redis queue of this benchmark's own, fed ``--runs`` runs at
once:

- ``hermes`` (one per ``--src`` tree, so that two versions of the code can be measured in one
  sitting): ``hermes-agent worker`` with its runs, journal, events, sessions and trail in a
  throwaway PostgreSQL database; runs are submitted with ``submit(...)`` and read back from
  the store;
- ``celery+openai``: a bare Celery task that runs the same loop with the openai SDK (a sync
  client per worker thread, the tool a plain function), its return value in Redis; its worker
  logs at INFO, as `hermes-agent worker` does (Celery's two lines a task).

CPU is read from ``/proc``: the worker's process group between the first and the last run, and
the PostgreSQL backends serving the worker (every backend of the benchmark's database except
the submitter's and the one that waits for the runs to finish, which connect with an
``application_name`` each of their own), sampled every 20 ms so that a backend that exits in
the window still counts (up to its last sample); ``postgres_system_ms_per_run`` is the
kernel's part of it. Also counted:
the PostgreSQL backends the worker started in the window (each a fork of the server: a pool
that closes and opens connections), and the transactions the server counted in the database
per run (``pg_stat_database``; less the submitter's insert and the wait's counts), and the
worker's context switches per run (every thread's, voluntary and not:
``worker_switches_per_run``, the wake-ups a run costs the worker). Rounds alternate the contenders
(the order flips each round). ``--profile DIR`` runs each worker under py-spy (folded stacks
of the thread holding the GIL, one file per worker; its own CPU inflates that round's figures).
``--callgrind`` runs each worker under valgrind's callgrind instead, instrumented only while
the measured runs go (``callgrind_control -i on``/``off``), and counts its instructions per run
(``worker_instructions_m_per_run``, millions; user space only, so a wake-up's kernel work and
PostgreSQL's are not in it). The count repeats from round to round where CPU time on a shared
machine does not; callgrind runs one thread at a time, about fifty times slower, so its CPU
and runs/s figures are not comparable with an uninstrumented round's.

    python benchmarks/bench_queue_cost.py --rounds 2 --runs 300 --json queue_cost.json
    python benchmarks/bench_queue_cost.py --src before=OLD_TREE --src after=NEW_TREE
    python benchmarks/bench_queue_cost.py --src on=TREE --src off=TREE --task-events-off off
    python benchmarks/bench_queue_cost.py --src httpx=. --src aiohttp=. --aiohttp aiohttp
    python benchmarks/bench_queue_cost.py --rounds 1 --runs 1000 --profile profiles/
    python benchmarks/bench_queue_cost.py --callgrind --rounds 2 --runs 150 --src after=TREE
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from _common import (
    PG,
    ROOT,
    callgrind_count,
    callgrind_instrument,
    code_version,
    cpu_and_system_ticks,
    find_postmaster,
    free_port,
    group_switches,
    group_system_ticks,
    group_ticks,
    pg_database,
    start_process,
    stop_group,
)

SUBMITTER = "hermes-bench-submitter"
WATCHER = "hermes-bench-watcher"
"""The benchmark's own connection that waits for the runs to finish: its backend is not the
worker's, and its transactions are not the worker's either."""

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

# The bare Celery task: the same two model calls and the same tool, with the openai SDK.
BARE = """
import json
import os
import threading

import openai
from celery import Celery

app = Celery("bare", broker=os.environ["BROKER"], backend=os.environ["BROKER"])
app.conf.update(task_acks_late=True, worker_prefetch_multiplier=1,
                task_default_queue=os.environ["QUEUE"], result_expires=600)
_local = threading.local()
TOOLS = [{"type": "function", "function": {"name": "step", "description": "Do step n of job tag.",
          "parameters": {"type": "object", "properties": {"tag": {"type": "string"},
          "n": {"type": "integer"}}, "required": ["tag", "n"], "additionalProperties": False}}}]


def step(tag, n):
    return f"step {n} of {tag} done"


@app.task(name="bare.run")
def run(message):
    client = getattr(_local, "client", None)
    if client is None:
        client = _local.client = openai.OpenAI(base_url=os.environ["MODEL_URL"], api_key="none",
                                               max_retries=0)
    messages = [{"role": "user", "content": message}]
    for _ in range(6):
        reply = client.chat.completions.create(model="step-model", messages=messages, tools=TOOLS)
        choice = reply.choices[0].message
        if not choice.tool_calls:
            return choice.content
        messages.append(choice.model_dump(exclude_none=True))
        for call in choice.tool_calls:
            result = step(**json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return None
"""


def write_hermes(
    folder: Path,
    model_url: str,
    db_url: str,
    broker: str,
    queue: str,
    *,
    task_events: bool,
    aiohttp: bool = False,
) -> Path:
    config = folder / "config.yaml"
    # Written either way: the default changed (on until issue 29's fifth round, off since).
    events = f"  task_events: {'true' if task_events else 'false'}\n"
    # Only for the trees named by --aiohttp (an older tree does not know the key).
    transport = "  transport: aiohttp\n" if aiohttp else ""
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
{transport}agent:
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
{events}""",
        encoding="utf-8",
    )
    (folder / "tools.py").write_text(TOOLS, encoding="utf-8")
    return config


class BackendMeter:
    """CPU ticks of the backends of one database, sampled every 20 ms: the submitter's (its
    ``application_name``) apart from the others (the worker's); this meter's own connection
    is left out."""

    def __init__(self, database: str, conninfo: str) -> None:
        import psycopg

        self.database = database.encode()
        self.parent = find_postmaster()
        # Connected to another database: its queries are not counted as the worker's
        # transactions (``transactions``).
        self.conn = psycopg.connect(conninfo, dbname=PG["dbname"], autocommit=True)
        own = self.conn.execute("SELECT pg_backend_pid()").fetchone()
        self.own = int(own[0]) if own else -1
        self.kind: dict[int, str] = {}  # pid -> "worker" | "submitter" | "other"
        # pid -> (CPU ticks, of them the kernel's), at the first and the last sample
        self.first: dict[int, tuple[int, int]] = {}
        self.last: dict[int, tuple[int, int]] = {}
        self.system_s = 0.0  # of the worker's backends' CPU, the kernel's
        self.submitter_s = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _children(self) -> list[int]:
        try:
            text = Path(f"/proc/{self.parent}/task/{self.parent}/children").read_text()
        except OSError:
            return []
        return [int(pid) for pid in text.split()]

    def _classify(self, pid: int) -> str | None:
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return None
        if b" " + self.database + b" " not in title or pid == self.own:
            return "other"
        row = self.conn.execute(
            "SELECT application_name FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()
        if row is None:
            return None  # not through its startup yet: asked again at the next sample
        if row[0] == WATCHER:
            return "other"  # the benchmark's own wait for the runs
        return "submitter" if row[0] == SUBMITTER else "worker"

    def _sample(self, first: bool) -> None:
        for pid in self._children():
            if pid not in self.kind:
                kind = self._classify(pid)
                if kind is None:
                    kind = "pending"
                if kind != "pending":
                    self.kind[pid] = kind
            kind = self.kind.get(pid, "worker")
            if kind == "other":  # a backend of another database (once its title says so)
                self.first.pop(pid, None)
                self.last.pop(pid, None)
                continue
            found = cpu_and_system_ticks(pid)
            if found is None:
                continue
            self.last[pid] = found
            # A backend born in the window counts from zero.
            self.first.setdefault(pid, found if first else (0, 0))

    def start(self) -> None:
        self.first, self.last = {}, {}
        self._sample(first=True)
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.02):
            self._sample(first=False)

    def stop(self) -> tuple[float, int]:
        """(CPU seconds of the worker's backends, backends started in the window)."""
        self._stop.set()
        assert self._thread is not None
        self._thread.join()
        self._sample(first=False)
        hz = os.sysconf("SC_CLK_TCK")
        used = {"worker": 0, "submitter": 0}
        system = 0
        born = 0
        for pid, (last, last_system) in self.last.items():
            kind = self.kind.get(pid, "worker")
            if kind == "other":
                continue
            start, start_system = self.first[pid]
            used[kind] += last - start
            if kind == "worker":
                system += last_system - start_system
            born += kind == "worker" and start == 0
        self.submitter_s = used["submitter"] / hz
        self.system_s = system / hz
        self.conn.close()
        return used["worker"] / hz, born


def transactions(conninfo: str, database: str) -> int:
    """Transactions the server counted in ``database`` so far, committed and rolled back (a
    backend publishes its counts when it exits, or once it has been idle for 10 s)."""
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
            (database,),
        ).fetchone()
    return int(row[0]) if row else 0


def callgrind(command: list[str], folder: Path) -> list[str]:
    """``command`` under callgrind, counting nothing until ``callgrind_instrument(pid, "on")``."""
    output = f"--callgrind-out-file={folder / f'callgrind-{uuid.uuid4().hex[:6]}.out'}"
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no", output, *command]


def wait_ready(process: Any, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while b" ready." not in log.read_bytes():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"worker did not start:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.1)


def stop(process: Any, *, profiled: bool = False, timeout: float = 20.0) -> None:
    if profiled and process.poll() is None:
        # py-spy writes its profile once the worker it started has exited: stop the worker
        # only, and let py-spy end by itself.
        children = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text()
        for pid in children.split():
            os.kill(int(pid), signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        return
    stop_group(process, timeout=timeout)


def wait_finished(
    conninfo: str, ids: list[str], timeout: float
) -> tuple[list[tuple[Any, ...]], int]:
    """The runs ``ids`` once all have finished, and the transactions this wait took (a count
    every 50 ms, then one read of the rows: its backend, named ``WATCHER``, is left out of
    the worker's CPU, and its transactions out of the worker's)."""
    import psycopg

    deadline = time.monotonic() + timeout
    finished = (
        "FROM hermes_runs WHERE request_id = ANY(%s) AND status IN "
        "('completed','failed','dead','cancelled','timed_out')"
    )
    taken = 0
    with psycopg.connect(conninfo, autocommit=True, application_name=WATCHER) as conn:
        while True:
            row = conn.execute(f"SELECT count(*) {finished}", (ids,)).fetchone()
            taken += 1
            if row is not None and row[0] == len(ids):
                rows = conn.execute(
                    f"SELECT request_id, status, result, created_ns, updated_ns {finished}",
                    (ids,),
                ).fetchall()
                return rows, taken + 1
            if time.monotonic() > deadline:
                done = row[0] if row is not None else 0
                raise RuntimeError(f"{len(ids) - done} runs unfinished after {timeout} s")
            time.sleep(0.05)


SUBMIT = """
import sys
from hermes_agent import build_agent
from hermes_agent.worker import submit

config, tools, url, prefix, count = sys.argv[1:6]
agent = build_agent(config, tools_files=[tools], storage=url)
print("ready", flush=True)
sys.stdin.readline()  # measured from here
for i in range(int(count)):
    print(submit(agent, f"job {prefix}{i} steps=1", session_id=f"{prefix}{i}").request_id)
agent.close()
"""


class Submitter:
    """A process with the code of ``src`` (the request's shape is that tree's) that submits
    ``count`` runs when told to, once its imports and its agent are ready."""

    def __init__(self, src: Path, config: Path, folder: Path, url: str, prefix: str, count: int):
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                SUBMIT,
                str(config),
                str(folder / "tools.py"),
                url,
                prefix,
                str(count),
            ],
            env={**os.environ, "PYTHONPATH": str(src / "src"), "HOME": str(folder)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None and self.process.stdin is not None
        if self.process.stdout.readline().strip() != "ready":
            raise RuntimeError("the submitter did not start")

    def go(self) -> list[str]:
        assert self.process.stdout is not None and self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()
        ids = self.process.stdout.read().split()
        self.process.wait(timeout=60)
        return ids


def submit_runs(
    src: Path, config: Path, folder: Path, url: str, prefix: str, count: int
) -> list[str]:
    return Submitter(src, config, folder, url, prefix, count).go()


def measure_hermes(
    args: argparse.Namespace,
    folder: Path,
    src_name: str,
    src: Path,
    db_url: str,
    db_name: str,
    queue: str,
    model_url: str,
) -> dict[str, Any]:
    conninfo = db_url.replace("postgresql+psycopg://", "postgresql://")
    quiet = src_name in (args.task_events_off or [])
    config = write_hermes(
        folder,
        model_url,
        db_url,
        args.broker,
        queue,
        task_events=not quiet,
        aiohttp=src_name in (args.aiohttp or []),
    )
    log = f"hermes-{uuid.uuid4().hex[:6]}.log"
    profiler: list[str] = []
    if args.profile is not None:
        # py-spy samples the worker (its CPU only: idle threads are left out) into a file of
        # folded stacks per round; the CPU it adds to the worker is counted, so a profiled
        # round is for the profile, not for the table.
        args.profile.mkdir(parents=True, exist_ok=True)
        out = args.profile / f"{src.name}-{uuid.uuid4().hex[:6]}.folded"
        # --gil: the thread holding the GIL only (this machine's idle-thread detection
        # counted threads waiting on a lock as busy).
        sampling = ["--format", "raw", "--rate", "250", "--gil"]
        profiler = ["py-spy", "record", *sampling, "-o", str(out), "--"]
    command = [
        *profiler,
        sys.executable,
        "-m",
        "hermes_agent",
        "worker",
        "--config",
        str(config),
        "--tools",
        str(folder / "tools.py"),
        "--concurrency",
        str(args.concurrency),
        "--name",
        f"bench-{uuid.uuid4().hex[:6]}@%h",
    ]
    slow = 10 if args.callgrind else 1  # how much longer starting and stopping take
    if args.callgrind:
        command = callgrind(command, folder)
    worker = start_process(command, folder, log, {"PYTHONPATH": str(src / "src")})
    submit_url = f"{db_url}?application_name={SUBMITTER}"
    meter = BackendMeter(db_name, conninfo)
    try:
        wait_ready(worker, folder / log, 120 * slow)
        label = uuid.uuid4().hex[:6]
        warm = submit_runs(src, config, folder, submit_url, f"w{label}", 2 * args.concurrency)
        wait_finished(conninfo, warm, 120 * slow)
        # The submitter's backend comes and goes with it: backends seen while no run is in
        # flight and no submitter is connected are the worker's.
        submitter = Submitter(src, config, folder, submit_url, f"r{label}", args.runs)
        time.sleep(11)  # the counts of the warm-up, and of the worker's start, published
        xacts_before = transactions(conninfo, db_name)
        meter.start()
        if args.callgrind:
            callgrind_instrument(worker.pid, "on")
        worker_before, switched = group_ticks(worker.pid), group_switches(worker.pid)
        system_before = group_system_ticks(worker.pid)
        started = time.perf_counter()
        ids = submitter.go()
        rows, watched = wait_finished(conninfo, ids, 600 * slow)
        wall = time.perf_counter() - started
        if args.callgrind:
            callgrind_instrument(worker.pid, "off")
        backend_s, born = meter.stop()
        worker_s = (group_ticks(worker.pid) - worker_before) / os.sysconf("SC_CLK_TCK")
        system_s = (group_system_ticks(worker.pid) - system_before) / os.sysconf("SC_CLK_TCK")
        switched = group_switches(worker.pid) - switched
        submitter_s = meter.submitter_s
        good = sum(
            1
            for _, status, result, *_ in rows
            if status == "completed" and json.loads(result)["output"].startswith("done r")
        )
        latencies = sorted((r[4] - r[3]) / 1e6 for r in rows)
    finally:
        stop(worker, profiled=bool(profiler), timeout=20.0 * slow)
    # The worker's backends have exited, so their counts are in; less the submitter's one
    # transaction per run (its insert), the wait's and the first reading's own.
    xacts = transactions(conninfo, db_name) - xacts_before - args.runs - watched - 1
    return {
        "runs": args.runs,
        "correct": good,
        "wall_s": round(wall, 2),
        "runs_per_s": round(args.runs / wall, 1),
        "worker_cpu_ms_per_run": round(worker_s * 1000 / args.runs, 2),
        "worker_system_ms_per_run": round(system_s * 1000 / args.runs, 2),
        "worker_switches_per_run": round(switched / args.runs, 2),
        "worker_instructions_m_per_run": counted(args, folder / log),
        "postgres_cpu_ms_per_run": round(backend_s * 1000 / args.runs, 2),
        "postgres_system_ms_per_run": round(meter.system_s * 1000 / args.runs, 2),
        "total_cpu_ms_per_run": round((worker_s + backend_s) * 1000 / args.runs, 2),
        "submitter_backend_cpu_ms_per_run": round(submitter_s * 1000 / args.runs, 2),
        "backends_started": born,
        "transactions_per_run": round(xacts / args.runs, 2),
        "latency_p50_ms": round(latencies[len(latencies) // 2], 1),
        "latency_p99_ms": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 1),
    }


def counted(args: argparse.Namespace, log: Path) -> float | None:
    """Millions of instructions per run, from a worker that ran under callgrind and exited."""
    return round(callgrind_count(log) / args.runs / 1e6, 3) if args.callgrind else None


def measure_bare(
    args: argparse.Namespace, folder: Path, queue: str, model_url: str
) -> dict[str, Any]:
    from celery import Celery  # type: ignore[import-untyped]

    (folder / "bare_task.py").write_text(BARE, encoding="utf-8")
    log = f"bare-{uuid.uuid4().hex[:6]}.log"
    env = {"BROKER": args.broker, "QUEUE": queue, "MODEL_URL": model_url, "PYTHONPATH": str(folder)}
    command = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "bare_task",
        "worker",
        "--pool",
        "threads",
        "--concurrency",
        str(args.concurrency),
        "--without-gossip",
        "--without-mingle",
        # At INFO, as `hermes-agent worker` runs: Celery writes the same two lines a task
        # (received, succeeded) for each.
        "--loglevel",
        "INFO",
        "-n",
        f"bare-{uuid.uuid4().hex[:6]}@%h",
    ]
    slow = 10 if args.callgrind else 1
    if args.callgrind:
        command = callgrind(command, folder)
    worker = start_process(command, folder, log, env)
    app = Celery("bare", broker=args.broker, backend=args.broker)
    app.conf.task_default_queue = queue
    try:
        deadline = time.monotonic() + 60 * slow
        while not app.control.ping(timeout=0.5):
            if worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((folder / log).read_text(errors="replace")[-3000:])
        label = uuid.uuid4().hex[:6]
        warm = [app.send_task("bare.run", args=[f"job w{label}{i} steps=1"]) for i in range(20)]
        for result in warm:
            result.get(timeout=60 * slow)
        if args.callgrind:
            callgrind_instrument(worker.pid, "on")
        before, switched = group_ticks(worker.pid), group_switches(worker.pid)
        system_before = group_system_ticks(worker.pid)
        started = time.perf_counter()
        sent = [
            app.send_task("bare.run", args=[f"job r{label}{i} steps=1"]) for i in range(args.runs)
        ]
        answers = [result.get(timeout=600 * slow) for result in sent]
        wall = time.perf_counter() - started
        if args.callgrind:
            callgrind_instrument(worker.pid, "off")
        worker_s = (group_ticks(worker.pid) - before) / os.sysconf("SC_CLK_TCK")
        system_s = (group_system_ticks(worker.pid) - system_before) / os.sysconf("SC_CLK_TCK")
        switched = group_switches(worker.pid) - switched
    finally:
        stop(worker, timeout=20.0 * slow)
        app.close()
    return {
        "runs": args.runs,
        "correct": sum(1 for a in answers if str(a).startswith("done r")),
        "wall_s": round(wall, 2),
        "runs_per_s": round(args.runs / wall, 1),
        "worker_cpu_ms_per_run": round(worker_s * 1000 / args.runs, 2),
        "worker_system_ms_per_run": round(system_s * 1000 / args.runs, 2),
        "worker_switches_per_run": round(switched / args.runs, 2),
        "worker_instructions_m_per_run": counted(args, folder / log),
        "postgres_cpu_ms_per_run": 0.0,
        "postgres_system_ms_per_run": 0.0,
        "total_cpu_ms_per_run": round(worker_s * 1000 / args.runs, 2),
    }


def delete_queue(broker: str, queue: str) -> None:
    import redis

    client = redis.Redis.from_url(broker)
    client.delete(queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")
    client.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    sources = dict(item.split("=", 1) for item in args.src) if args.src else {"hermes": str(ROOT)}
    for option, named in (("--task-events-off", args.task_events_off), ("--aiohttp", args.aiohttp)):
        unknown = set(named or []) - set(sources)
        if unknown:
            raise SystemExit(f"{option} names no --src: {', '.join(sorted(unknown))}")
    if args.callgrind and args.profile is not None:
        raise SystemExit("--callgrind and --profile each run the worker under a tool of their own")
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
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    model_url = f"http://127.0.0.1:{model_port}/v1"
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in [*sources, "celery+openai"]}
    queues: list[str] = []
    started = time.monotonic()
    try:
        time.sleep(2)
        with tempfile.TemporaryDirectory(prefix="hermes-bench-") as tmp:
            for round_ in range(args.rounds):
                order = [*sources, "celery+openai"]
                if round_ % 2:
                    order.reverse()
                for name in order:
                    queue = f"hermes-bench-{uuid.uuid4().hex[:10]}"
                    queues.append(queue)
                    folder = Path(tmp) / f"{name.replace('+', '_')}-{round_}"
                    folder.mkdir()
                    if name == "celery+openai":
                        row = measure_bare(args, folder, queue, model_url)
                    else:
                        db_url, db_name, drop = pg_database()
                        try:
                            row = measure_hermes(
                                args,
                                folder,
                                name,
                                Path(sources[name]).resolve(),
                                db_url,
                                db_name,
                                queue,
                                model_url,
                            )
                        finally:
                            drop()
                    row["round"] = round_
                    print(json.dumps({name: row}), flush=True)
                    results[name].append(row)
    finally:
        stop(model)
        for queue in queues:
            delete_queue(args.broker, queue)
    bare = statistics.median(r["total_cpu_ms_per_run"] for r in results["celery+openai"])
    summary = {
        name: {
            "total_cpu_ms_per_run": [r["total_cpu_ms_per_run"] for r in rows],
            "worker_cpu_ms_per_run": [r["worker_cpu_ms_per_run"] for r in rows],
            "worker_system_ms_per_run": [r["worker_system_ms_per_run"] for r in rows],
            "postgres_cpu_ms_per_run": [r["postgres_cpu_ms_per_run"] for r in rows],
            "postgres_system_ms_per_run": [r["postgres_system_ms_per_run"] for r in rows],
            "worker_switches_per_run": [r["worker_switches_per_run"] for r in rows],
            "worker_instructions_m_per_run": [r["worker_instructions_m_per_run"] for r in rows],
            "runs_per_s": [r["runs_per_s"] for r in rows],
            "x_bare_task_median": round(
                statistics.median(r["total_cpu_ms_per_run"] for r in rows) / bare, 2
            ),
        }
        for name, rows in results.items()
    }
    return {
        "benchmark": "queue_cost",
        "command": " ".join(["python", "benchmarks/bench_queue_cost.py", *sys.argv[1:]]),
        "concurrency": args.concurrency,
        "model_latency_s": args.latency,
        "machine": f"{os.cpu_count()} CPUs (shared), {platform.python_implementation()} "
        f"{platform.python_version()}",
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "code": code_version(),
        "sources": sources,
        "duration_s": round(time.monotonic() - started, 1),
        "summary": summary,
        "rows": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per model call")
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/0")
    parser.add_argument(
        "--src", action="append", help="NAME=TREE: a source tree to measure (repeatable)"
    )
    parser.add_argument(
        "--task-events-off",
        action="append",
        metavar="NAME",
        help="a --src whose workers send no Celery task events (queue.task_events: false)",
    )
    parser.add_argument(
        "--aiohttp",
        action="append",
        metavar="NAME",
        help="a --src whose workers send their model requests through aiohttp "
        "(model.transport: aiohttp)",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--callgrind",
        action="store_true",
        help="count each worker's instructions per run under valgrind's callgrind",
    )
    parser.add_argument(
        "--profile", type=Path, help="DIR: run each worker under py-spy, folded stacks in DIR"
    )
    args = parser.parse_args()
    report = run(args)
    print(json.dumps(report["summary"], indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
