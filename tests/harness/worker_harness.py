"""Real Celery workers for the scale-out tests: a fresh PostgreSQL database, a broker queue of
the test's own (Redis or RabbitMQ), the step model on loopback, and ``hermes-agent worker``
processes that a test may SIGKILL.

The workers' tool ``step`` writes its effect to a side table, keyed by its stable call id
(``current_call()``), and counts every execution in another: so a test can tell an effect
that happened once from a call that ran twice.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from hermes_agent import current_call
from hermes_agent.testing import tool_call as call
from hermes_agent.types import Message

if TYPE_CHECKING:
    import httpx

    from hermes_agent.worker.store import RunStore
from server_harness import free_port as free_port  # one definition, shared
from server_harness import serve, wait_for
from step_model import running_step_model
from storage_backends import _url

REDIS = "redis://127.0.0.1:6379/0"
RABBITMQ = "amqp://guest:guest@127.0.0.1:5672//"

TOOLS = '''
import os
import time

import psycopg

from hermes_agent import current_call, tool

DB = os.environ["EFFECTS_DB"]


@tool
def step(tag: str, n: int) -> str:
    """Do step n of job tag.

    Args:
        tag: the job.
        n: the step number.
    """
    key = current_call()
    call_key = key.id if key else f"none-{tag}-{n}"
    with psycopg.connect(DB, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO executions(call_key, tag, n, pid, at) "
            "VALUES (%s, %s, %s, %s, clock_timestamp())",
            (call_key, tag, n, os.getpid()),
        )
        # The tool's work: a worker can be killed inside it.
        time.sleep(float(os.environ.get("STEP_SLEEP", "0.05")))
        # The effect, once per call id whatever happens (the idempotency key at work).
        conn.execute(
            "INSERT INTO effects(call_key, tag, n) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
            (call_key, tag, n),
        )
    return f"step {n} of {tag} done"
'''


def broker_up(url: str) -> bool:
    host, port = ("127.0.0.1", 6379) if url.startswith("redis") else ("127.0.0.1", 5672)
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def psycopg_url(sqlalchemy_url: str) -> str:
    return sqlalchemy_url.replace("postgresql+psycopg://", "postgresql://")


@dataclass
class Cluster:
    """Workers on one broker queue, one database and one model."""

    root: Path
    db_url: str
    broker: str
    model_url: str
    queue_name: str = field(default_factory=lambda: f"hermes-test-{uuid.uuid4().hex[:10]}")
    lease_ttl: float = 2.0
    max_redeliveries: int = 3
    step_sleep: float = 0.05
    step_requires_approval: bool = False
    """Every call of ``step`` waits for its owner's approval (the run is set aside meanwhile)."""
    step_idempotent: bool = True
    """``step`` is declared idempotent (a call interrupted by a death runs again)."""
    task_events: bool = False
    """Celery's task events (``queue.task_events``), off as by default."""
    transport: str = "auto"
    """The model's HTTP client (``model.transport``; ``auto``, the default, is aiohttp in a
    worker)."""
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def write_config(self) -> Path:
        config = self.root / "config.yaml"
        approval = "\n    requires_approval: true" if self.step_requires_approval else ""
        config.write_text(
            f"""
model:
  provider: openai
  model_name: step-model
  base_url: {self.model_url}
  api_key: none
  mode: native
  max_retries: 0
  transport: {self.transport}
agent:
  max_iterations: 6
tools:
  step:
    idempotent: {str(self.step_idempotent).lower()}{approval}
storage:
  url: {self.db_url}
queue:
  broker: {self.broker}
  queue_name: {self.queue_name}
  lease_ttl: {self.lease_ttl}
  sweep_interval: 0.5
  max_redeliveries: {self.max_redeliveries}
  task_events: {str(self.task_events).lower()}
""",
            encoding="utf-8",
        )
        (self.root / "tools.py").write_text(TOOLS, encoding="utf-8")
        return config

    def prepare_tables(self) -> None:
        import psycopg

        with psycopg.connect(psycopg_url(self.db_url), autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE executions(call_key text, tag text, n int, pid int, at timestamptz)"
            )
            conn.execute("CREATE TABLE effects(call_key text PRIMARY KEY, tag text, n int)")

    def start_worker(self, concurrency: int = 4, pool: str = "threads") -> subprocess.Popen[bytes]:
        index = len(self.workers)
        env = {
            **os.environ,
            "EFFECTS_DB": self.effects_dsn(),
            "STEP_SLEEP": str(self.step_sleep),
            "HOME": str(self.root),
        }
        log = (self.root / f"worker{index}.log").open("wb")
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hermes_agent",
                "worker",
                "--config",
                str(self.root / "config.yaml"),
                "--tools",
                str(self.root / "tools.py"),
                "--concurrency",
                str(concurrency),
                "--pool",
                pool,
                "--name",
                f"w{index}-{self.queue_name}@%h",
            ],
            cwd=self.root,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.workers.append(process)
        return process

    def effects_dsn(self) -> str:
        """Where the ``step`` tool writes its effects (the workers' database)."""
        return psycopg_url(self.db_url)

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        for index, process in enumerate(self.workers):
            log = self.root / f"worker{index}.log"
            while b" ready." not in log.read_bytes():
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"worker {index} did not start:\n{self.log(index)}")
                time.sleep(0.1)  # the polling pace, bounded by the deadline above

    def log(self, index: int) -> str:
        return (self.root / f"worker{index}.log").read_text(errors="replace")[-4000:]

    def kill(self, process: subprocess.Popen[bytes]) -> None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)

    def stop(self) -> None:
        for process in self.workers:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.workers:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        self.drop_queue()

    def drop_queue(self) -> None:
        drop_queue(self.broker, self.queue_name)

    def effects_db(self) -> Any:
        import psycopg

        return psycopg.connect(psycopg_url(self.db_url), autocommit=True)


def drop_queue(broker: str, name: str) -> None:
    """Delete a test's queue, and on Redis the binding keys kombu keeps beside it."""
    from hermes_agent.config import QueueConfig
    from hermes_agent.worker.app import make_celery

    app = make_celery(QueueConfig(broker=broker, queue_name=name))
    try:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(name)
    except Exception:
        pass
    if broker.startswith("redis"):
        import redis

        client = redis.Redis.from_url(broker)
        try:
            client.delete(f"_kombu.binding.{name}", f"_kombu.binding_permanent.{name}")
        finally:
            client.close()


@contextmanager
def cluster(
    root: Path, db_url: str, broker: str, model_url: str, **options: Any
) -> Iterator[Cluster]:
    if not broker_up(broker):
        pytest.skip(f"no broker at {broker}")
    made = Cluster(root, db_url, broker, model_url, **options)
    made.write_config()
    made.prepare_tables()
    try:
        yield made
    finally:
        made.stop()


def wait_finished(store: RunStore, ids: Sequence[str], timeout: float) -> None:
    """Wait until every run of ``ids`` has finished (whatever its status); past ``timeout``,
    fail naming the runs left and where each stood."""

    def left() -> str:
        states = [s for s in (store.get(rid) for rid in ids) if s is not None]
        statuses = Counter(s.status for s in states)
        stuck = [
            (s.request_id, s.session_id, s.status, s.claims, s.redeliveries, s.lease_owner)
            for s in states
            if not s.finished
        ]
        missing = len(ids) - len(states)
        return (
            f"all {len(ids)} runs finished: {dict(statuses)}, {missing} not in the store; "
            f"unfinished {stuck}"
        )

    def finished() -> bool:
        return all((s := store.get(rid)) is not None and s.finished for rid in ids)

    wait_for(finished, timeout, left, pace=0.2)  # a pace the store can bear under faults


# -- the service in front of a cluster: PostgreSQL, workers on Redis, API keys ---------------


@dataclass
class QueuedService:
    """A service (``hermes-agent serve``'s app on uvicorn) on a cluster's database and
    config, with an API key per user."""

    url: str
    keys: dict[str, str]
    cluster: Cluster
    db_url: str

    def client(self, user: str) -> httpx.Client:
        import httpx

        auth = {"Authorization": f"Bearer {self.keys[user]}"}
        return httpx.Client(base_url=self.url, headers=auth, timeout=60)

    def executions(self, tag: str) -> int:
        """How many times ``step`` ran for job ``tag``."""
        with self.cluster.effects_db() as conn:
            row = conn.execute("SELECT count(*) FROM executions WHERE tag = %s", (tag,)).fetchone()
        return int(row[0]) if row else 0


@contextmanager
def queued_service(
    root: Path,
    model_url: str,
    *,
    mode: str = "queue",
    users: Sequence[str] = ("alice",),
    concurrency: int = 2,
    model_mode: str = "native",
    settings: dict[str, Any] | None = None,
    **cluster_options: Any,
) -> Iterator[QueuedService]:
    """A fresh PostgreSQL database, a ``Cluster`` config for the model at ``model_url``
    (``model_mode``: ``native`` or ``hermes``), ``hermes-agent worker`` processes on Redis when
    ``mode`` is ``queue`` (none for ``in_process``: the service runs the same config itself),
    an API key for each of ``users``, and the service with ``execution: mode``, ``auth: keys``
    and ``settings``. Skipped when no Redis answers."""
    from hermes_agent.runs.keys import SqlKeyStore
    from hermes_agent.server import ServiceSettings, create_app

    if not broker_up(REDIS):
        pytest.skip(f"no broker at {REDIS}")
    root.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        db_url = stack.enter_context(contextmanager(_url)("postgresql", root))
        made = Cluster(root, db_url, REDIS, model_url, **cluster_options)
        config = made.write_config()
        if model_mode != "native":
            text = config.read_text(encoding="utf-8")
            config.write_text(text.replace("mode: native", f"mode: {model_mode}"), "utf-8")
        made.prepare_tables()
        stack.callback(made.stop)
        if mode == "queue":
            made.start_worker(concurrency=concurrency)
            made.wait_ready()
        # The tools file, loaded in the service too, reads where to write and how long to sleep.
        patch = stack.enter_context(pytest.MonkeyPatch.context())
        patch.setenv("EFFECTS_DB", made.effects_dsn())
        patch.setenv("STEP_SLEEP", str(made.step_sleep))
        store = SqlKeyStore(db_url)
        try:
            keys = {user: store.create(user) for user in users}
        finally:
            store.close()
        service = ServiceSettings(execution=mode, auth="keys", **(settings or {}))
        app = create_app(config, tools_files=[root / "tools.py"], settings=service)
        url = stack.enter_context(serve(app))
        yield QueuedService(url, keys, made, db_url)


STEP_SLEEP = 0.4
"""Seconds each ``step`` call takes in ``step_world``: long enough to cancel a run or hold its
slot."""


@contextmanager
def step_world(
    root: Path, mode: str, *, approvals: bool, **settings: Any
) -> Iterator[QueuedService]:
    """The run matrix's world, in process or queued (``mode``): the step model on loopback and
    its ``step`` tool (which needs an approval when ``approvals``), users alice and bob, and
    carol whose daily quota is spent; approvals wait, one run in flight per user. ``settings``
    adds to the service's (a door's own)."""
    quotas = {"users": {"carol": {"runs_per_day": 0}}}
    with ExitStack() as stack:
        model_url = stack.enter_context(running_step_model(free_port(), latency=0.02))
        service = {
            "keepalive_s": 0.2,
            "approval_policy": "wait",
            "max_runs_in_flight_per_user": 1,
            "quotas": quotas,
            **settings,
        }
        yield stack.enter_context(
            queued_service(
                root,
                model_url,
                mode=mode,
                users=("alice", "bob", "carol"),
                concurrency=4,
                settings=service,
                step_sleep=STEP_SLEEP,
                step_requires_approval=approvals,
            )
        )


# -- a tool with a side effect and a model that calls it, for the in-process tests --------


class Ledger:
    """A tool with a side effect, counting its executions and the call ids it saw."""

    def __init__(self) -> None:
        self.calls: list[str | None] = []

    def charge(self, cents: int) -> str:
        """Charge an amount.

        Args:
            cents: the amount.
        """
        key = current_call()
        self.calls.append(key.id if key else None)
        return f"charged {cents}"


def charge_script(messages: Sequence[Message], _tools: Sequence[dict[str, Any]]) -> str:
    """``charge N``: one call of ``charge`` with cents=N, then an answer quoting the result."""
    user = next(m for m in reversed(messages) if m.role == "user")
    after = messages[messages.index(user) :]
    results = [m for m in after if m.role == "tool"]
    if not results:
        return call("charge", cents=int(str(user.content).split()[-1]))
    return f"answer: {json.dumps(results[-1].tool_results[0].content)}"


def expire(store: RunStore, request_id: str) -> None:
    """As if the lease holder died: its lease runs out."""
    from sqlalchemy import update

    from hermes_agent.worker.store import runs_table

    with store.storage.transaction(write=True) as conn:
        conn.execute(
            update(runs_table)
            .where(runs_table.c.request_id == request_id)
            .values(lease_expires_ns=time.time_ns() - 1)
        )
