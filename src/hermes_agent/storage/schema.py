"""Every table the project keeps in SQL, in one ``MetaData``, and the one chain of migrations that
brings any database up to it, on SQLite and PostgreSQL.

    from hermes_agent.storage.schema import upgrade
    upgrade(make_engine(url))     # what `hermes-agent db upgrade` and every store's start-up do

The tables:

- ``sessions``, ``messages``, ``audit_records`` — conversations and the audit trail
  (``storage.sql``); ``hermes_session_locks`` — which process runs a turn of a session now
  (``storage.session_lease``);
- ``hermes_api_keys``, ``hermes_quota_usage``, ``hermes_quota_runs``, ``hermes_stream_tokens`` —
  the service's keys, quota counts and stream tokens (``server.auth``, ``server.quotas``,
  ``server.stream_tokens``);
- ``hermes_channel_dead_letters``, ``hermes_channel_log``, ``hermes_channel_signatures`` —
  what channels keep (``channels.store``);
- ``hermes_runs``, ``hermes_run_journal``, ``hermes_run_events``, ``hermes_run_approvals`` —
  queued runs (``worker.store``);
- ``schema_version`` — one row per migration applied.

A database holds the whole schema whichever store opened it first: the key store's database has
(empty) session tables when it is not the agent's, and the agent's has the key tables. Each store
applies the chain when it opens (a database already at ``LATEST_VERSION`` costs one read), so
nothing needs running by hand; ``hermes-agent db upgrade`` applies it ahead of a deployment.

Every migration newer than the database's latest ``schema_version`` row runs in order, in one
transaction, under a lock — SQLite's write lock (``BEGIN IMMEDIATE``), a PostgreSQL advisory
lock — so processes opening one database at once take turns, and opening it again is a no-op.
A database newer than this package is refused. A database made before the chain covered every
table (releases whose key, quota, stream-token, channel and run tables were each made apart,
with no version of their own) upgrades in place: a migration creates only the tables that are
missing and adds only the columns that are missing, so rows already there stay.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Connection,
    Double,
    Engine,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    func,
    insert,
    inspect,
    select,
    text,
)
from sqlalchemy.exc import OperationalError

from hermes_agent.storage.base import MAX_ID_LENGTH, StorageError
from hermes_agent.storage.engine import WRITE

logger = logging.getLogger("hermes_agent")

MAX_KEY_NAME_CHARS = 100
"""The longest name an API key may have (``hermes_api_keys.name``)."""

metadata = MetaData()

schema_version = Table(
    "schema_version",
    metadata,
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("applied_ns", BigInteger, nullable=False),
)

# -- sessions and the audit trail (storage.sql) -----------------------------------------

sessions_table = Table(
    "sessions",
    metadata,
    Column("id", String(MAX_ID_LENGTH), primary_key=True),
    Column("created_ns", BigInteger, nullable=False),
    Column("updated_ns", BigInteger, nullable=False),
    Column("turns", Integer, nullable=False, default=0),
    Column("messages", Integer, nullable=False, default=0),
)

messages_table = Table(
    "messages",
    metadata,
    Column("session_id", String(MAX_ID_LENGTH), primary_key=True),
    Column("position", Integer, primary_key=True, autoincrement=False),
    Column("role", String(16), nullable=False),
    Column("content", Text, nullable=False),
    Column("tool_calls", Text, nullable=True),
    Column("tool_results", Text, nullable=True),
    Column("scratch_pad", Text, nullable=True),
    Column("raw", Text, nullable=True),
)

audit_table = Table(
    "audit_records",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("request_id", String(64), nullable=False),
    Column("session_id", String(MAX_ID_LENGTH), nullable=False),
    Column("step", Integer, nullable=False),
    Column("stage", String(32), nullable=False),
    Column("role", String(16), nullable=False),
    Column("content", Text, nullable=False),
    Column("timestamp_ns", BigInteger, nullable=False),
    Column("latency_ms", Double, nullable=False),
    Column("status", String(16), nullable=False),
    Column("status_code", Integer, nullable=False),
    Column("model_name", String(255), nullable=False),
    Column("system_prompt_sha256", String(64), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("sanitized", Text, nullable=True),
    Index("ix_audit_request_seq", "request_id", "seq"),
    Index("ix_audit_session", "session_id"),
    Index("ix_audit_time", "timestamp_ns"),
)

# -- keys, quotas, stream tokens (server.auth, server.quotas, server.stream_tokens) -------

api_keys = Table(
    "hermes_api_keys",
    metadata,
    Column("key_id", String(32), primary_key=True),
    Column("key_sha256", String(64), nullable=False),
    Column("user_id", String(64), nullable=False, index=True),
    Column("admin", Boolean, nullable=False, default=False),
    Column("created", String(40), nullable=False),
    Column("revoked", Boolean, nullable=False, default=False),
    Column("name", String(MAX_KEY_NAME_CHARS), nullable=True),
)

quota_usage = Table(
    "hermes_quota_usage",
    metadata,
    Column("user_id", String(64), primary_key=True),
    Column("day", String(10), primary_key=True),
    Column("runs", Integer, nullable=False, default=0),
    Column("tokens", BigInteger, nullable=False, default=0),
)

quota_runs = Table(
    "hermes_quota_runs",
    metadata,
    Column("request_id", String(64), primary_key=True),
    Column("user_id", String(64), nullable=False),
    Column("day", String(10), nullable=False),
)
"""The runs whose tokens were added by ``add_run_tokens`` (queued runs: the service that first
sees one's result adds its tokens, once whichever process sees it)."""

stream_tokens = Table(
    "hermes_stream_tokens",
    metadata,
    Column("token_id", String(32), primary_key=True),
    Column("token_sha256", String(64), nullable=False),
    Column("request_id", String(64), nullable=False),
    Column("user_id", String(200), nullable=False),
    Column("admin", Boolean, nullable=False, default=False),
    Column("key_id", String(32), nullable=True),
    Column("expires", Float, nullable=False, index=True),
)

# -- channels (channels.store) ----------------------------------------------------------

dead_letters = Table(
    "hermes_channel_dead_letters",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("channel", String(64), nullable=False, index=True),
    Column("created", Float, nullable=False),
    Column("kind", String(16), nullable=False),
    Column("user_id", String(200), nullable=True),
    Column("request_id", String(64), nullable=True),
    Column("status", String(16), nullable=False, index=True),
    Column("attempts", Integer, nullable=False),
    Column("error", Text, nullable=False),
    Column("delivered", Float, nullable=True),
    Column("parts", Text, nullable=False),
)

channel_log = Table(
    "hermes_channel_log",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("time", Float, nullable=False, index=True),
    Column("channel", String(64), nullable=False),
    Column("event", String(32), nullable=False),
    Column("user_id", String(200), nullable=True),
    Column("request_id", String(64), nullable=True),
    Column("detail", Text, nullable=False),
)

seen_signatures = Table(
    "hermes_channel_signatures",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("expires", Float, nullable=False, index=True),
)

# -- who runs a turn of a session now (storage.session_lease) ---------------------------

session_locks = Table(
    "hermes_session_locks",
    metadata,
    Column("session_id", String(MAX_ID_LENGTH), primary_key=True),
    Column("owner", String(64), nullable=False),
    Column("expires_ns", BigInteger, nullable=False),
)

# -- queued runs (worker.store) ---------------------------------------------------------

runs_table = Table(
    "hermes_runs",
    metadata,
    Column("request_id", String(64), primary_key=True),
    Column("session_id", String(MAX_ID_LENGTH), nullable=False),
    Column("owner", String(255), nullable=False, default=""),
    Column("request", Text, nullable=False),
    Column("status", String(24), nullable=False),
    Column("created_ns", BigInteger, nullable=False),
    Column("updated_ns", BigInteger, nullable=False),
    Column("parked", Boolean, nullable=False, default=False),
    Column("claims", Integer, nullable=False, default=0),
    Column("redeliveries", Integer, nullable=False, default=0),
    Column("lease_token", Integer, nullable=False, default=0),
    Column("lease_owner", String(255), nullable=True),
    Column("lease_expires_ns", BigInteger, nullable=True),
    Column("heartbeat_ns", BigInteger, nullable=True),
    Column("requeued_ns", BigInteger, nullable=True),
    Column("delivered_ns", BigInteger, nullable=True),
    Column("turn_saved", Boolean, nullable=False, default=False),
    Column("result", Text, nullable=True),
    Column("error", Text, nullable=True),
    Index("ix_hermes_runs_session", "session_id", "created_ns"),
    Index("ix_hermes_runs_status", "status"),
)

journal_table = Table(
    "hermes_run_journal",
    metadata,
    Column("request_id", String(64), primary_key=True),
    Column("key", String(64), primary_key=True),
    Column("state", String(16), nullable=False),
    Column("payload", Text, nullable=False),
    Column("token", Integer, nullable=False),
    Column("updated_ns", BigInteger, nullable=False),
)

events_table = Table(
    "hermes_run_events",
    metadata,
    Column("request_id", String(64), primary_key=True),
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("payload", Text, nullable=False),
)

approvals_table = Table(
    "hermes_run_approvals",
    metadata,
    Column("request_id", String(64), primary_key=True),
    Column("key", String(128), primary_key=True),
    Column("tool", String(255), nullable=False),
    Column("arguments", Text, nullable=False),
    Column("status", String(16), nullable=False),
    Column("reason", Text, nullable=True),
    Column("updated_ns", BigInteger, nullable=False),
)

# -- migrations -------------------------------------------------------------------------

Migration = Callable[[Connection], None]


def _create_missing(conn: Connection, *tables: Table) -> None:
    for table in tables:
        table.create(conn, checkfirst=True)


def _columns(conn: Connection, table: Table) -> set[str]:
    return {column["name"] for column in inspect(conn).get_columns(table.name)}


def _v1_initial(conn: Connection) -> None:
    _create_missing(conn, sessions_table, messages_table, audit_table)


def _v2_sanitized_note(conn: Connection) -> None:
    # A database made by version 1 lacks the column; one made since has it from the start.
    if "sanitized" not in _columns(conn, audit_table):
        conn.execute(text("ALTER TABLE audit_records ADD COLUMN sanitized TEXT"))


def _v3_keys_quotas_stream_tokens(conn: Connection) -> None:
    # Earlier releases made these apart from the chain, when the key store first opened; a
    # key table made before keys had names lacks the column (nullable: old keys have none).
    _create_missing(conn, api_keys, quota_usage, quota_runs, stream_tokens)
    if "name" not in _columns(conn, api_keys):
        conn.execute(
            text(f"ALTER TABLE hermes_api_keys ADD COLUMN name VARCHAR({MAX_KEY_NAME_CHARS})")
        )


def _v4_channels(conn: Connection) -> None:
    _create_missing(conn, dead_letters, channel_log, seen_signatures)


def _v5_queued_runs(conn: Connection) -> None:
    _create_missing(conn, runs_table, journal_table, events_table, approvals_table)


def _v6_session_locks(conn: Connection) -> None:
    _create_missing(conn, session_locks)


MIGRATIONS: dict[int, Migration] = {
    1: _v1_initial,
    2: _v2_sanitized_note,
    3: _v3_keys_quotas_stream_tokens,
    4: _v4_channels,
    5: _v5_queued_runs,
    6: _v6_session_locks,
}
"""Schema version → the step that brings a database from the version before up to it. A schema
change is a new entry that looks at what is there (as version 2 does); released entries never
change."""

LATEST_VERSION = max(MIGRATIONS)

MIGRATION_LOCK_KEY = 0x48_45_52_4D  # "HERM"
"""The PostgreSQL advisory lock that serialises migrations across processes."""


def current_version(conn: Connection) -> int:
    """The database's schema version: its latest ``schema_version`` row, ``0`` when it has
    none (an empty database, or one made before the table existed). Changes nothing."""
    if not inspect(conn).has_table(schema_version.name):
        return 0
    return int(conn.execute(select(func.max(schema_version.c.version))).scalar() or 0)


def migrate(conn: Connection) -> int:
    """Apply the migrations the database lacks inside the caller's transaction (open it with
    ``storage.engine.WRITE`` on SQLite), under the PostgreSQL advisory lock; returns the
    version reached. ``StorageError`` for a database newer than this package."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
    # A database with none of our tables is being made, not upgraded: that is no news, so it
    # logs nothing (a first `hermes-agent run --debug` shows the run, not the schema's steps).
    fresh = not set(inspect(conn).get_table_names()) & set(metadata.tables)
    schema_version.create(conn, checkfirst=True)
    current = int(conn.execute(select(func.max(schema_version.c.version))).scalar() or 0)
    if current > LATEST_VERSION:
        where = conn.engine.url.render_as_string(hide_password=True)
        raise StorageError(
            f"the database {where} has schema version {current}, newer than this "
            f"hermes-agent understands ({LATEST_VERSION}); upgrade hermes-agent-core"
        )
    missing = sorted(v for v in MIGRATIONS if v > current)
    for version in missing:
        MIGRATIONS[version](conn)
        conn.execute(insert(schema_version).values(version=version, applied_ns=time.time_ns()))
    if missing and not fresh:  # one line for an upgrade, however many steps it took
        logger.info(
            "storage: upgraded %s from schema version %d to %d",
            conn.engine.url.render_as_string(hide_password=True),
            current,
            missing[-1],
        )
    return max(current, LATEST_VERSION)


def upgrade(engine: Engine) -> int:
    """Bring the database up to ``LATEST_VERSION`` (see the module docstring); returns it. One
    read when it is there already; else ``migrate`` in one write transaction."""
    for pause in (0.05, 0.1, 0.2, 0.5, 1.0, 2.0):
        try:
            return _upgrade_once(engine)
        except OperationalError as exc:
            # A new SQLite file that several processes open at once can answer "database is
            # locked" without waiting its busy timeout (a read turning into a write): the
            # chain is one transaction, so trying it again is safe.
            if engine.dialect.name != "sqlite" or "locked" not in str(exc):
                raise
            time.sleep(pause)
    return _upgrade_once(engine)


def _upgrade_once(engine: Engine) -> int:
    with engine.connect() as conn, conn.begin():
        if current_version(conn) == LATEST_VERSION:
            return LATEST_VERSION
    with engine.connect() as conn:
        conn = conn.execution_options(**WRITE)
        with conn.begin():
            return migrate(conn)


def database_version(engine: Engine) -> int:
    """The database's schema version (``current_version``), read in a transaction of its own."""
    with engine.connect() as conn, conn.begin():
        return current_version(conn)
