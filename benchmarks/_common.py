"""Helpers the benchmark scripts share: the commit a result came from, a free loopback port, and
a throwaway PostgreSQL database. Nothing here is measured.

The scripts run as ``python benchmarks/<script>.py``, so this folder is on ``sys.path`` and they
import this module as ``_common``.
"""

from __future__ import annotations

import socket
import subprocess
import uuid
from collections.abc import Callable
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
