"""Faults for the durable-run tests, each made by the test itself: a PostgreSQL of its own
(initdb in a temporary folder, a free port) that it restarts, a TCP proxy in front of it that
resets and stalls connections, a model endpoint that fails, and a tool whose effects are
fenced by the attempt's token. ``tally`` counts what became of a batch of runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from step_model import _completion, reply_for
from worker_harness import Cluster, free_port

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def _as_postgres(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["runuser", "-u", "postgres", "--", *argv], capture_output=True, text=True, timeout=60
    )


class OwnPostgres:
    """A PostgreSQL server of the test's own: ``restart("fast" | "immediate")``."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="hermes-pg-"))
        shutil.chown(self.root, "postgres", "postgres")
        self.data = self.root / "data"
        self.port = free_port()
        done = _as_postgres(
            str(PG_BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres"
        )
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed: {done.stderr}")
        self.start()

    @staticmethod
    def available() -> bool:
        return (PG_BIN / "initdb").exists() and shutil.which("runuser") is not None

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c max_connections=200 "
            f"-c fsync=off -k {self.root}"
        )
        done = _as_postgres(
            str(PG_BIN / "pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.root / "log"),
            "-w",
            "start",
        )
        if done.returncode != 0:
            raise RuntimeError(f"PostgreSQL did not start: {done.stderr}{self.log()}")

    def stop(self, mode: str) -> None:
        _as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self, mode: str, down_s: float = 1.0) -> None:
        self.stop(mode)
        time.sleep(down_s)  # the fault itself: the database is away this long
        self.start()

    def pids(self) -> list[int]:
        """The postmaster, then every process it started (backends, background workers)."""
        head = (self.data / "postmaster.pid").read_text().split("\n", 1)[0]
        postmaster = int(head)
        children = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == postmaster:
                children.append(int(stat.parent.name))
        return [postmaster, *children]

    def freeze(self) -> list[int]:
        """SIGSTOP the postmaster first (it starts no new backend), then its children: a
        paused VM, a failover or a vacuum stall, as the clients see it. Returns the pids."""
        frozen = []
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
                frozen.append(pid)
        # A backend forked between the listing and the postmaster's stop: stop it too.
        for pid in self.pids():
            if pid not in frozen:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
                    frozen.append(pid)
        return frozen

    def thaw(self, pids: list[int]) -> None:
        for pid in reversed(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def log(self) -> str:
        path = self.root / "log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def close(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


class FaultProxy:
    """A TCP proxy on its own event loop: ``reset()`` kills every open connection with a
    RST; ``stall(seconds)`` forwards nothing, either way, on any connection, for that long
    (new connections are taken and held as well)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._loop = asyncio.new_event_loop()
        self._open: set[asyncio.StreamWriter] = set()
        self._flowing = asyncio.Event()
        started = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(self._loop)
            self._flowing.set()
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._handle, "127.0.0.1", 0)
            )
            self.port = int(self._server.sockets[0].getsockname()[1])
            started.set()
            self._loop.run_forever()

        threading.Thread(target=serve, daemon=True).start()
        if not started.wait(10):
            raise RuntimeError("the proxy did not start")

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._flowing.wait()
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            _abort(writer)
            return
        self._open.update((writer, up_writer))
        await asyncio.gather(
            self._pump(reader, up_writer, writer), self._pump(up_reader, writer, up_writer)
        )

    async def _pump(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, own: asyncio.StreamWriter
    ) -> None:
        try:
            while data := await source.read(65536):
                await self._flowing.wait()
                sink.write(data)
                await sink.drain()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            for writer in (sink, own):
                self._open.discard(writer)
                writer.close()

    def reset(self) -> int:
        async def kill() -> int:
            victims = list(self._open)
            self._open.clear()
            for writer in victims:
                _abort(writer)
            return len(victims) // 2

        return asyncio.run_coroutine_threadsafe(kill(), self._loop).result(10)

    def stall(self, seconds: float) -> None:
        self._loop.call_soon_threadsafe(self._flowing.clear)
        time.sleep(seconds)  # the fault itself: nothing flows this long
        self._loop.call_soon_threadsafe(self._flowing.set)

    def close(self) -> None:
        self.reset()
        self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with a RST (SO_LINGER 0), as a middlebox or a crashed host does."""
    sock = writer.get_extra_info("socket")
    with contextlib.suppress(OSError):
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_0)
    writer.transport.abort()


_LINGER_0 = b"\x01\x00\x00\x00\x00\x00\x00\x00"


# -- a model endpoint that fails ---------------------------------------------------------


class FaultModel:
    """The step model (tests/harness/step_model.py) over plain asyncio HTTP/1.1, with faults chosen
    by the job's tag: ``e500-*`` answers 500, ``reset-*`` resets the connection, ``hang-*`` never
    answers, ``drip-*`` sends its answer one byte a second. Other tags are served normally."""

    def __init__(self, latency: float = 0.02) -> None:
        self.latency = latency
        self.port = free_port()
        self.seen: Counter[str] = Counter()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()
        if not self._ready.wait(10):
            raise RuntimeError("the fault model did not start")
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self.port)
        )
        self._server = server
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.decode("latin-1").split("\r\n"):
                    if line.lower().startswith("content-length:"):
                        length = int(line.split(":", 1)[1])
                body = json.loads(await reader.readexactly(length)) if length else {}
                users = [m for m in body.get("messages", []) if m.get("role") == "user"]
                found = (
                    re.search(r"job (\S+)", str(users[-1].get("content") or "")) if users else None
                )
                tag = found.group(1) if found else "?"
                self.seen[tag] += 1
                await asyncio.sleep(self.latency)  # a model's pace
                if tag.startswith("hang-"):
                    await asyncio.sleep(3600)  # a model that hangs: the run's deadline ends it
                if tag.startswith("reset-"):
                    _abort(writer)
                    return
                if tag.startswith("e500-"):
                    payload, status = (
                        b'{"error": {"message": "upstream failed"}}',
                        "500 Internal Server Error",
                    )
                else:
                    payload, status = _completion(reply_for(body)), "200 OK"
                headers = (
                    f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
                    f"content-length: {len(payload)}\r\n\r\n"
                ).encode()
                if tag.startswith("drip-"):
                    for byte in headers + payload:
                        writer.write(bytes([byte]))
                        await writer.drain()
                        await asyncio.sleep(1.0)  # a model that drips, a byte a second
                else:
                    writer.write(headers + payload)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    def close(self) -> None:
        async def shut() -> None:
            self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shut(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)


# -- the tool: effects fenced by the attempt's token --------------------------------------

FENCED_TOOLS = '''
import os
import time

import psycopg

from hermes_agent import current_call, tool
from hermes_agent.worker import FencedOut, fence

DB = os.environ["EFFECTS_DB"]


@tool
def step(tag: str, n: int) -> str:
    """Do step n of job tag.

    Args:
        tag: the job.
        n: the step number.
    """
    key = current_call()
    rid = key.request_id
    entered = time.time()  # before the connection: a process frozen from here on entered before
    with psycopg.connect(DB, autocommit=True) as conn:
        held = conn.execute(
            "SELECT lease_token FROM hermes_runs WHERE request_id = %s", (rid,)
        ).fetchone()
        conn.execute(
            "INSERT INTO executions(call_key, tag, n, pid, token, held, at, entered) "
            "VALUES (%s, %s, %s, %s, %s, %s, clock_timestamp(), to_timestamp(%s))",
            (key.id, tag, n, os.getpid(), key.fencing_token, held[0] if held else None, entered),
        )
        time.sleep(float(os.environ.get("STEP_SLEEP", "0.05")))  # the tool's work, to freeze in
        # The fence on the effect (the shipped one): the run's row says which attempt holds
        # it; an older token (a process that froze mid-call and woke after the takeover)
        # changes nothing.
        try:
            with conn.transaction():
                fence(conn)
                conn.execute(
                    "INSERT INTO effects(call_key, tag, n, token) VALUES (%s, %s, %s, %s) "
                    "ON CONFLICT DO NOTHING",
                    (key.id, tag, n, key.fencing_token),
                )
        except FencedOut:
            held = conn.execute(
                "SELECT lease_token FROM hermes_runs WHERE request_id = %s", (rid,)
            ).fetchone()
            conn.execute(
                "INSERT INTO refused(call_key, token, held) VALUES (%s, %s, %s)",
                (key.id, key.fencing_token, held[0] if held else None),
            )
            raise RuntimeError("fenced out: this attempt no longer holds the run") from None
    return f"step {n} of {tag} done"
'''


@dataclass
class FaultCluster(Cluster):
    """Workers whose ``step`` tool fences its effect with the attempt's token; the tool
    reaches PostgreSQL directly (``effects_url``), the workers' store through the proxy."""

    effects_url: str = ""
    model_timeout: float = 60.0
    extra: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def write_config(self) -> Path:
        config = super().write_config()
        text = config.read_text(encoding="utf-8").replace(
            "  max_retries: 0\n", f"  max_retries: 0\n  timeout: {self.model_timeout}\n"
        )
        config.write_text(text, encoding="utf-8")
        (self.root / "tools.py").write_text(FENCED_TOOLS, encoding="utf-8")
        return config

    def effects_dsn(self) -> str:
        return self.effects_url

    def prepare_tables(self) -> None:
        import psycopg

        with psycopg.connect(self.effects_url, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE executions(call_key text, tag text, n int, pid int, token int, "
                "held int, at timestamptz, entered timestamptz)"
            )
            conn.execute(
                "CREATE TABLE effects(call_key text PRIMARY KEY, tag text, n int, token int)"
            )
            conn.execute("CREATE TABLE refused(call_key text, token int, held int)")

    def effects_db(self) -> Any:
        import psycopg

        return psycopg.connect(self.effects_url, autocommit=True)


# -- counting ----------------------------------------------------------------------------

ERROR_MARKS = (
    "could not be completed",
    "failed unexpectedly",
    "OperationalError",
    "DBAPIError",
    "The model failed",
    "StoreUnavailable",
)


@dataclass
class Tally:
    submitted: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    lost: int = 0
    error_answers: int = 0
    bad_trails: list[str] = field(default_factory=list)
    error_turns: int = 0
    past_deadline: int = 0

    def line(self, name: str) -> str:
        return (
            f"{name}: submitted {self.submitted}, completed {self.statuses['completed']}, "
            f"failed {self.statuses['failed']}, timed_out {self.statuses['timed_out']}, "
            f"dead {self.statuses['dead']}, lost {self.lost}; error answers "
            f"{self.error_answers}, trails without exactly one last ending "
            f"{len(self.bad_trails)}, sessions with an error turn {self.error_turns}, past "
            f"deadline {self.past_deadline}; reasons {dict(self.reasons)}"
        )


def tally(store: Any, storage: Any, ids: list[str], grace_s: float = 3.0) -> Tally:
    from hermes_agent.worker.store import DEADLINE_KEY

    found = Tally(submitted=len(ids))
    sessions: set[str] = set()
    now = time.time_ns()
    for rid in ids:
        run = store.get(rid)
        assert run is not None
        sessions.add(run.session_id)
        if not run.finished:
            found.lost += 1
            found.statuses[run.status] += 1
        else:
            found.statuses[run.status] += 1
        if run.status != "completed" and run.error:
            found.reasons[re.sub(r"[0-9a-f-]{36}|\d+(\.\d+)?", "N", run.error)[:70]] += 1
        if run.status == "completed":
            output = str((run.result or {}).get("output", ""))
            if (
                int((run.result or {}).get("status", 200)) >= 400
                or any(mark in output for mark in ERROR_MARKS)
                or not output.startswith("done ")
            ):
                found.error_answers += 1
        limit = store.journal_entry(rid, DEADLINE_KEY)
        if limit is not None:
            at = int(limit[1]["at_ns"])
            ended = run.updated_ns if run.finished else now
            if ended > at + grace_s * 1e9:
                found.past_deadline += 1
        records = storage.records(rid)
        endings = [r for r in records if r.role in ("output", "stopped")]
        ok = len(endings) == 1 and records[-1] is endings[0]
        if ok and run.finished:
            ending = endings[0]
            if run.status == "completed":
                ok = ending.role == "output"
            else:
                ok = ending.role == "stopped" and json.loads(ending.content)["status"] == run.status
        if not ok and run.finished:
            found.bad_trails.append(f"{rid}:{run.status}:{[(r.role, r.seq) for r in endings]}")
    for session in sessions:
        for message in storage.sessions.load(session):
            if message.role == "assistant" and any(m in str(message.content) for m in ERROR_MARKS):
                found.error_turns += 1
    return found


@contextmanager
def own_postgres() -> Iterator[OwnPostgres]:
    server = OwnPostgres()
    try:
        yield server
    finally:
        server.close()
