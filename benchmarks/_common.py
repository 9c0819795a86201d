"""Helpers the benchmark scripts share: the commit a result came from, a free loopback port, a
throwaway PostgreSQL database, processes started in groups of their own, and CPU time read from
``/proc``. Nothing here is measured.

The scripts run as ``python benchmarks/<script>.py``, so this folder is on ``sys.path`` and they
import this module as ``_common``.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PG = {"host": "127.0.0.1", "port": 5432, "dbname": "test"}
PG_USERS = ("postgres", "root")


def code_version() -> str:
    """The commit the code came from, and whether the work tree differed from it in src/."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no", "src")
    except OSError:
        return "unknown"
    return f"{head}{' + uncommitted changes in src/' if changed else ''}" if head else "unknown"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def pg_database() -> tuple[str, str, Callable[[], None]]:
    """A throwaway database on the local PostgreSQL server: (URL, name, drop)."""
    import psycopg

    admin: psycopg.Connection[Any] | None = None
    for user in PG_USERS:
        try:
            admin = psycopg.connect(user=user, autocommit=True, connect_timeout=3, **PG)  # type: ignore[arg-type]
            break
        except psycopg.OperationalError:
            continue
    if admin is None:
        raise RuntimeError(f"no PostgreSQL server answers at {PG['host']}:{PG['port']}")
    connection, name = admin, f"hermes_bench_{uuid.uuid4().hex[:12]}"
    connection.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        connection.close()

    url = f"postgresql+psycopg://{connection.info.user}@{PG['host']}:{PG['port']}/{name}"
    return url, name, drop


# -- processes ------------------------------------------------------------------------------


def start_process(
    command: list[str], folder: Path, log: str, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    """``command`` in a process group of its own, in ``folder`` (its ``HOME`` too), with
    ``env`` over this process's environment, its output in ``folder / log``."""
    with (folder / log).open("wb") as output:
        return subprocess.Popen(
            command,
            cwd=folder,
            env={**os.environ, "HOME": str(folder), **env},
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop_group(process: subprocess.Popen[bytes], *, timeout: float = 20.0) -> None:
    """SIGTERM to the process group ``process`` leads; SIGKILL if it lingers past ``timeout``."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


# -- CPU from /proc -------------------------------------------------------------------------


def proc_stat(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (field 3 onwards), or None
    once the process is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2 :].split()


def cpu_ticks(pid: int) -> int | None:
    """utime + stime of one process, in clock ticks (None once it is gone)."""
    found = cpu_and_system_ticks(pid)
    return found[0] if found is not None else None


def cpu_and_system_ticks(pid: int) -> tuple[int, int] | None:
    """(utime + stime, stime) of one process, in clock ticks (None once it is gone)."""
    fields = proc_stat(pid)
    if fields is None:
        return None
    return int(fields[11]) + int(fields[12]), int(fields[12])


def _group(pgrp: int) -> Iterator[tuple[str, list[str]]]:
    """(pid, ``proc_stat`` fields) of every process now in the group ``pgrp``."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = proc_stat(entry.name)
            if fields is not None and int(fields[2]) == pgrp:
                yield entry.name, fields


def group_ticks(pgrp: int) -> int:
    """utime + stime of every process in the group, and of its children that were reaped."""
    return sum(sum(int(value) for value in fields[11:15]) for _, fields in _group(pgrp))


def group_system_ticks(pgrp: int) -> int:
    """The part of ``group_ticks`` spent in the kernel (stime, and reaped children's)."""
    return sum(int(fields[12]) + int(fields[14]) for _, fields in _group(pgrp))


def group_switches(pgrp: int) -> int:
    """Context switches (voluntary and involuntary) so far of every thread of every process
    in the group; threads that ended are not counted (a worker's and a service's live as
    long as the process)."""
    total = 0
    for pid, _ in _group(pgrp):
        for status in Path(f"/proc/{pid}/task").glob("*/status"):
            try:
                for line in status.read_text().splitlines():
                    if line.startswith(("voluntary_ctxt", "nonvoluntary_ctxt")):
                        total += int(line.split()[1])
            except OSError:
                continue
    return total


def find_postmaster() -> int:
    """The pid of the local PostgreSQL server's main process (its backends are its children)."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            argv = Path(entry.path, "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"postgres") and b"-D" in argv:
            return int(entry.name)
    raise RuntimeError("no PostgreSQL server process in /proc: its backends' CPU cannot be read")


def callgrind_instrument(pid: int, switch: str) -> None:
    """Count the instructions of ``pid`` (running under valgrind's callgrind with
    ``--instr-atstart=no``) from now on (``on``), or no longer (``off``)."""
    subprocess.run(["callgrind_control", "-i", switch, str(pid)], check=True, capture_output=True)


def callgrind_count(log: Path) -> int:
    """What callgrind counted in the process whose output is ``log`` (written as it exits)."""
    found = re.findall(r"Collected : (\d+)", log.read_text(errors="replace"))
    if not found:
        raise RuntimeError(f"callgrind wrote no count in {log}")
    return int(found[-1])
