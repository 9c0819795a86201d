"""One schema and one migration chain for every table: old databases upgrade in place with their
rows, concurrent first opens are safe, ``hermes-agent db upgrade`` applies the chain, and no
store makes its tables on its own."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from hermes_agent.channels.store import SqlChannelStore
from hermes_agent.cli.app import app as cli
from hermes_agent.runs.keys import SqlKeyStore
from hermes_agent.runs.request import QueuedRequest
from hermes_agent.storage.base import StorageError
from hermes_agent.storage.engine import make_engine
from hermes_agent.storage.schema import (
    LATEST_VERSION,
    MIGRATIONS,
    database_version,
    metadata,
    schema_version,
)
from hermes_agent.storage.sql import SqlStorage
from hermes_agent.types import Message
from hermes_agent.worker.store import RunStore
from storage_backends import sql_database_url  # noqa: F401  (the sql_url fixture)

SRC = Path(__file__).resolve().parents[2] / "src" / "hermes_agent"

# The tables releases before the chain covered them made with create_all, as they made them:
# the key table from before keys had names has no ``name`` column.
_APART = [
    "hermes_quota_usage",
    "hermes_quota_runs",
    "hermes_stream_tokens",
    "hermes_channel_dead_letters",
    "hermes_channel_log",
    "hermes_channel_signatures",
    "hermes_runs",
    "hermes_run_journal",
    "hermes_run_events",
    "hermes_run_approvals",
]


def _old_database(url: str, *, with_sessions: bool = True) -> None:
    """A database as the previous releases left it: sessions and audit at schema version 2 (the
    chain then), every other table made apart by create_all, with a row in each."""
    old = sa.MetaData()
    keys = sa.Table(
        "hermes_api_keys",
        old,
        *(
            sa.Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable)
            for c in metadata.tables["hermes_api_keys"].columns
            if c.name != "name"
        ),
    )
    for name in _APART:
        metadata.tables[name].to_metadata(old)
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            if with_sessions:
                schema_version.to_metadata(old).create(conn)
                for version in (1, 2):
                    MIGRATIONS[version](conn)
                    conn.execute(
                        sa.insert(old.tables["schema_version"]).values(
                            version=version, applied_ns=version
                        )
                    )
                conn.execute(
                    sa.text(
                        "INSERT INTO sessions (id, created_ns, updated_ns, turns, messages) "
                        "VALUES ('old-session', 1, 1, 1, 1)"
                    )
                )
                conn.execute(
                    sa.text(
                        "INSERT INTO messages (session_id, position, role, content) "
                        "VALUES ('old-session', 0, 'user', 'from before')"
                    )
                )
            old.create_all(conn, tables=[t for n, t in old.tables.items() if n != "schema_version"])
            conn.execute(
                keys.insert().values(
                    key_id="0123456789abcdef",
                    key_sha256="0" * 64,
                    user_id="alice",
                    admin=False,
                    created="2026-01-01T00:00:00+00:00",
                    revoked=False,
                )
            )
            conn.execute(
                old.tables["hermes_quota_usage"]
                .insert()
                .values(user_id="alice", day="2026-01-01", runs=3, tokens=40)
            )
            conn.execute(
                old.tables["hermes_channel_log"]
                .insert()
                .values(time=1.0, channel="hook", event="delivered", detail="kept")
            )
            conn.execute(
                old.tables["hermes_runs"]
                .insert()
                .values(
                    request_id="old-run",
                    session_id="old-session",
                    owner="alice",
                    request="{}",
                    status="completed",
                    created_ns=1,
                    updated_ns=2,
                    parked=False,
                    claims=1,
                    redeliveries=0,
                    lease_token=1,
                    turn_saved=True,
                )
            )
    finally:
        engine.dispose()


def _versions(engine: sa.Engine) -> list[int]:
    with engine.connect() as conn:
        return [row[0] for row in conn.execute(sa.select(schema_version.c.version))]


def test_a_database_from_before_the_chain_covered_every_table_upgrades_with_its_rows(
    sql_url: str,
) -> None:
    _old_database(sql_url)
    with SqlStorage(sql_url) as storage:
        assert storage.schema_version == LATEST_VERSION
        assert _versions(storage.engine) == list(range(1, LATEST_VERSION + 1))
        with storage.engine.connect() as conn:
            key_columns = {c["name"] for c in sa.inspect(conn).get_columns("hermes_api_keys")}
            tables = set(sa.inspect(conn).get_table_names())
        assert "name" in key_columns and tables == set(metadata.tables)
        assert storage.sessions.load("old-session") == [Message("user", "from before")]
        runs = RunStore(storage)
        old_run = runs.get("old-run")
        assert old_run is not None and old_run.status == "completed"
        assert runs.add("old-session", QueuedRequest(message="new")) != "old-run"
    keys = SqlKeyStore(sql_url)
    try:
        assert [(k.key_id, k.user_id, k.name) for k in keys.list()] == [
            ("0123456789abcdef", "alice", None)
        ]
        keys.create("bob", name="named since")  # the column the migration added
        assert {k.name for k in keys.list()} == {None, "named since"}
        engine = keys.shared_engine
        assert engine is not None
        channels = SqlChannelStore(engine)
        assert [e.detail for e in channels.entries()] == ["kept"]
        with engine.connect() as conn:
            quota = conn.execute(sa.text("SELECT runs, tokens FROM hermes_quota_usage")).one()
        assert tuple(quota) == (3, 40)
    finally:
        keys.close()


def test_a_key_store_database_apart_from_the_storage_upgrades_too(sql_url: str) -> None:
    # service.keys_url on a database of its own: it had no schema_version table at all.
    _old_database(sql_url, with_sessions=False)
    keys = SqlKeyStore(sql_url)
    try:
        assert database_version(keys.engine) == LATEST_VERSION
        assert [k.user_id for k in keys.list()] == ["alice"]
    finally:
        keys.close()


def test_every_store_refuses_a_database_newer_than_the_package(sql_url: str) -> None:
    SqlStorage(sql_url).close()
    engine = make_engine(sql_url)
    with engine.begin() as conn:
        conn.execute(sa.insert(schema_version).values(version=LATEST_VERSION + 1, applied_ns=0))
    try:
        with pytest.raises(StorageError, match="newer than"):
            SqlKeyStore(sql_url)
        with pytest.raises(StorageError, match="newer than"):
            SqlChannelStore(engine)
        with pytest.raises(StorageError, match="newer than"):
            SqlStorage(sql_url)
    finally:
        engine.dispose()


_OPEN_ONE = """
import sys
from hermes_agent.channels.store import SqlChannelStore
from hermes_agent.runs.keys import SqlKeyStore
from hermes_agent.storage.sql import SqlStorage

url, which = sys.argv[1], int(sys.argv[2])
if which % 3 == 0:
    SqlStorage(url).close()
elif which % 3 == 1:
    SqlKeyStore(url).close()
else:
    SqlChannelStore.open(url).close()
"""


def test_processes_opening_a_new_database_at_once_apply_the_chain_once(sql_url: str) -> None:
    script = textwrap.dedent(_OPEN_ONE)
    started = [
        subprocess.Popen(
            [sys.executable, "-c", script, sql_url, str(n)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(6)
    ]
    failures = [p.communicate(timeout=120)[1] for p in started if p.wait(timeout=120) != 0]
    assert failures == []
    engine = make_engine(sql_url)
    try:
        assert _versions(engine) == list(range(1, LATEST_VERSION + 1))
        with engine.connect() as conn:
            assert set(sa.inspect(conn).get_table_names()) == set(metadata.tables)
    finally:
        engine.dispose()


def test_db_upgrade_applies_the_chain_and_db_version_reads_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    runner = CliRunner()
    before = runner.invoke(cli, ["db", "version", "--db", url])
    assert before.exit_code == 0 and "schema version 0 of" in before.output
    assert not (tmp_path / "state.db").exists()  # reading the version made nothing
    _old_database(url)
    shown = runner.invoke(cli, ["db", "version", "--db", url])
    assert f"schema version 2 of {LATEST_VERSION}" in shown.output
    done = runner.invoke(cli, ["db", "upgrade", "--db", url])
    assert done.exit_code == 0, done.output
    assert f"schema version {LATEST_VERSION} (was 2)" in done.output
    again = runner.invoke(cli, ["db", "upgrade", "--db", url])
    assert "already up to date" in again.output
    with SqlStorage(url) as storage:
        assert storage.sessions.load("old-session") == [Message("user", "from before")]


def test_db_upgrade_of_memory_says_it_keeps_no_schema() -> None:
    result = CliRunner().invoke(cli, ["db", "upgrade", "--db", "memory://"])
    assert result.exit_code != 0
    assert "memory://, which keeps no schema" in result.output
    assert "Traceback" not in result.output and "plugin" not in result.output


def test_db_upgrade_takes_the_config_storage_and_key_store_urls(tmp_path: Path) -> None:
    config = tmp_path / "hermes.yaml"
    config.write_text(
        f"storage:\n  url: sqlite:///{tmp_path / 'state.db'}\n"
        f"service:\n  keys_url: sqlite:///{tmp_path / 'keys.db'}\n"
    )
    result = CliRunner().invoke(cli, ["db", "upgrade", "--config", str(config)])
    assert result.exit_code == 0, result.output
    assert result.output.count(f"schema version {LATEST_VERSION} (was 0)") == 2
    for name in ("state.db", "keys.db"):
        engine = make_engine(f"sqlite:///{tmp_path / name}")
        try:
            assert database_version(engine) == LATEST_VERSION
        finally:
            engine.dispose()


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
    return found


def test_tables_are_made_only_by_the_schema_module() -> None:
    makers = sorted(
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        if "create_all(" in path.read_text() or "MetaData(" in path.read_text()
    )
    assert makers == ["storage/schema.py"]


def test_no_module_imports_a_private_name_of_another() -> None:
    private = [
        f"{path.relative_to(SRC)}: {module}.{name}"
        for path in SRC.rglob("*.py")
        for module, names in _imports(path)
        if module.startswith("hermes_agent")
        for name in names
        if name.startswith("_") and not name.startswith("__")
    ]
    assert private == []


def test_a_new_database_is_made_quietly_and_an_upgrade_is_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``--debug`` on a first run shows the run, not the schema's steps; upgrading a database
    an older release left is news, said once, from the version it had to the one it has."""
    caplog.set_level("DEBUG", logger="hermes_agent")
    with SqlStorage(f"sqlite:///{tmp_path / 'new.db'}") as storage:
        assert storage.schema_version == LATEST_VERSION
    assert [r.getMessage() for r in caplog.records if "schema" in r.getMessage()] == []

    old = f"sqlite:///{tmp_path / 'old.db'}"
    _old_database(old)
    engine = make_engine(old)
    was = database_version(engine)  # what the old release left
    engine.dispose()
    assert 0 < was < LATEST_VERSION
    caplog.clear()
    with SqlStorage(old) as storage:
        assert storage.schema_version == LATEST_VERSION
    lines = [r.getMessage() for r in caplog.records if "schema" in r.getMessage()]
    assert lines == [f"storage: upgraded {old} from schema version {was} to {LATEST_VERSION}"], (
        lines
    )
    caplog.clear()
    with SqlStorage(old):  # already there: nothing to say
        pass
    assert [r.getMessage() for r in caplog.records if "schema" in r.getMessage()] == []
