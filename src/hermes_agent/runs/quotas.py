"""Per-user daily quotas: runs per day and model tokens per day.

    service:
      quotas:
        runs_per_day: 200
        tokens_per_day: 500000
        users:
          alice: {runs_per_day: 1000}

A quota belongs to the stable user id an API key is bound to (``Principal.user_id``) — never
to a session id or a request id, so a client that makes up a new session for every message
still spends one user's quota. Days are UTC days. The run layer's gate asks ``Quotas.admit``
before every run, whichever endpoint started it; a refused run gets ``429`` with
``Retry-After`` set to the seconds left until the day resets.

Tokens are reserved, then settled: a run admitted under ``tokens_per_day`` adds
``tokens_reserved_per_run`` to the day at once, and ``Quotas.settle`` replaces that
reservation with what the run's model turns spent when it ends, however it ends. A run is
admitted only while the day's tokens — spent, plus reserved by the runs in flight — are under
the limit, so runs started together cannot each spend the day's last tokens: the day overshoots
by at most one run's spend beyond what was left (one reservation, for runs that stay within it).

The counts live in the key store's database (a table ``hermes_quota_usage``, one row per user
and day), so they survive a restart and are shared by every process on that database; with keys
in memory they are kept in memory (today's only). A queued run (``execution: queue``) runs on a
worker: its tokens are added by the first service process that sees its result, once (a table
``hermes_quota_runs`` names the runs counted).
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal, Protocol

import sqlalchemy as sa

from hermes_agent.runs.keys import KeyStore
from hermes_agent.runs.settings import QuotaLimits, QuotaSettings
from hermes_agent.storage.engine import WRITE, shared_engine
from hermes_agent.storage.schema import quota_runs as quota_runs
from hermes_agent.storage.schema import quota_usage as quota_usage
from hermes_agent.storage.schema import upgrade

QuotaName = Literal["runs_per_day", "tokens_per_day"]


@dataclass(frozen=True, slots=True)
class DailyUsage:
    """What one user used on one day."""

    runs: int = 0
    tokens: int = 0


class QuotaStore(Protocol):
    """Where the daily counts are kept. Every method is safe to call from several threads
    (and, for a database, several processes) at once."""

    def admit(
        self, user_id: str, day: str, limits: QuotaLimits, reserve: int = 0
    ) -> tuple[bool, DailyUsage]:
        """Count one run of ``user_id`` on ``day`` and add ``reserve`` tokens if the user is
        under both limits, in one step (two runs at once cannot both take the last one);
        returns whether it was counted and the usage after it."""
        ...

    def refund(self, user_id: str, day: str, reserve: int = 0) -> None:
        """Uncount one run and its reservation (it was refused before it started)."""
        ...

    def add_tokens(self, user_id: str, day: str, tokens: int) -> None:
        """Add ``tokens`` (negative: a reservation given back; the day never goes below 0)."""
        ...

    def add_run_tokens(self, user_id: str, day: str, request_id: str, tokens: int) -> bool:
        """``add_tokens`` for run ``request_id`` unless it was done already (by any process on
        this store); returns whether it was done now."""
        ...

    def usage(self, user_id: str, day: str) -> DailyUsage:
        """What ``user_id`` used on ``day``."""
        ...


class MemoryQuotaStore:
    """Counts in this process, for keys in memory; only the current day is kept, so the
    store holds one entry per user active today."""

    def __init__(self) -> None:
        self._counts: dict[str, list[int]] = {}
        self._day = ""
        self._lock = threading.Lock()
        self._counted_runs: OrderedDict[str, None] = OrderedDict()
        """Runs whose tokens were added (``add_run_tokens``), the oldest forgotten first."""

    def _entry(self, user_id: str, day: str) -> list[int]:
        if day != self._day:
            if day < self._day:  # a late call about a day already gone: not kept
                return [0, 0]
            self._counts.clear()
            self._day = day
        return self._counts.setdefault(user_id, [0, 0])

    def admit(
        self, user_id: str, day: str, limits: QuotaLimits, reserve: int = 0
    ) -> tuple[bool, DailyUsage]:
        with self._lock:
            entry = self._entry(user_id, day)
            admitted = _under(limits, entry[0], entry[1])
            if admitted:
                entry[0] += 1
                entry[1] += reserve
            return admitted, DailyUsage(entry[0], entry[1])

    def refund(self, user_id: str, day: str, reserve: int = 0) -> None:
        with self._lock:
            entry = self._entry(user_id, day)
            entry[0] = max(0, entry[0] - 1)
            entry[1] = max(0, entry[1] - reserve)

    def add_tokens(self, user_id: str, day: str, tokens: int) -> None:
        with self._lock:
            entry = self._entry(user_id, day)
            entry[1] = max(0, entry[1] + tokens)

    def add_run_tokens(self, user_id: str, day: str, request_id: str, tokens: int) -> bool:
        with self._lock:
            if request_id in self._counted_runs:
                return False
            self._counted_runs[request_id] = None
            while len(self._counted_runs) > _MAX_COUNTED_RUNS:
                self._counted_runs.popitem(last=False)
            entry = self._entry(user_id, day)
            entry[1] = max(0, entry[1] + tokens)
            return True

    def usage(self, user_id: str, day: str) -> DailyUsage:
        with self._lock:
            found = self._counts.get(user_id) if day == self._day else None
            return DailyUsage(*found) if found else DailyUsage()


_MAX_COUNTED_RUNS = 100_000


class SqlQuotaStore:
    """Counts in ``hermes_quota_usage`` (SQLite or PostgreSQL), on the key store's engine.

    ``admit`` is one conditional ``UPDATE ... WHERE runs < limit``: SQLite's write lock, or
    PostgreSQL's row lock, makes concurrent admissions take turns, so a quota is never
    overrun by runs that start at the same moment, even from several processes.
    """

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        upgrade(engine)  # one read when the key store opened the database already

    def _begin(self) -> sa.engine.Connection:
        # SQLite: take the write lock up front (see storage.sql), so the read after the write
        # cannot fail on a lock another writer took meanwhile.
        return self.engine.connect().execution_options(**WRITE)

    def admit(
        self, user_id: str, day: str, limits: QuotaLimits, reserve: int = 0
    ) -> tuple[bool, DailyUsage]:
        q = quota_usage.c
        counted = (
            sa.update(quota_usage)
            .where(q.user_id == user_id, q.day == day)
            .values(runs=q.runs + 1, tokens=q.tokens + reserve)
        )
        if limits.runs_per_day is not None:
            counted = counted.where(q.runs < limits.runs_per_day)
        if limits.tokens_per_day is not None:
            counted = counted.where(q.tokens < limits.tokens_per_day)
        with self._begin() as conn, conn.begin():
            _insert_if_missing(conn, user_id, day)
            admitted = conn.execute(counted).rowcount == 1
            row = conn.execute(
                sa.select(q.runs, q.tokens).where(q.user_id == user_id, q.day == day)
            ).one()
        return admitted, DailyUsage(row.runs, row.tokens)

    def refund(self, user_id: str, day: str, reserve: int = 0) -> None:
        q = quota_usage.c
        with self._begin() as conn, conn.begin():
            conn.execute(
                sa.update(quota_usage)
                .where(q.user_id == user_id, q.day == day, q.runs > 0)
                .values(runs=q.runs - 1, tokens=_added(q.tokens, -reserve))
            )

    def add_tokens(self, user_id: str, day: str, tokens: int) -> None:
        q = quota_usage.c
        with self._begin() as conn, conn.begin():
            _insert_if_missing(conn, user_id, day)
            conn.execute(
                sa.update(quota_usage)
                .where(q.user_id == user_id, q.day == day)
                .values(tokens=_added(q.tokens, tokens))
            )

    def add_run_tokens(self, user_id: str, day: str, request_id: str, tokens: int) -> bool:
        q, r = quota_usage.c, quota_runs.c
        with self._begin() as conn, conn.begin():
            values = {"request_id": request_id, "user_id": user_id, "day": day}
            if _insert_if_missing_row(conn, quota_runs, values, r.request_id == request_id) != 1:
                return False
            _insert_if_missing(conn, user_id, day)
            conn.execute(
                sa.update(quota_usage)
                .where(q.user_id == user_id, q.day == day)
                .values(tokens=_added(q.tokens, tokens))
            )
        return True

    def usage(self, user_id: str, day: str) -> DailyUsage:
        q = quota_usage.c
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(q.runs, q.tokens).where(q.user_id == user_id, q.day == day)
            ).first()
        return DailyUsage(row.runs, row.tokens) if row is not None else DailyUsage()


def _insert_if_missing(conn: sa.engine.Connection, user_id: str, day: str) -> None:
    values = {"user_id": user_id, "day": day, "runs": 0, "tokens": 0}
    q = quota_usage.c
    _insert_if_missing_row(conn, quota_usage, values, (q.user_id == user_id) & (q.day == day))


def _insert_if_missing_row(
    conn: sa.engine.Connection,
    table: sa.Table,
    values: Mapping[str, object],
    key: sa.ColumnElement[bool],
) -> int:
    """Insert ``values`` unless a row matching ``key`` is there; returns the rows inserted."""
    dialect = conn.dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        # psycopg reports no row count for it (-1): what it returns says whether it inserted.
        key_column = next(iter(table.primary_key.columns))
        inserted = pg_insert(table).values(values).on_conflict_do_nothing()
        return len(conn.execute(inserted.returning(key_column)).all())
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return conn.execute(sqlite_insert(table).values(values).on_conflict_do_nothing()).rowcount
    if conn.execute(sa.select(sa.literal(1)).select_from(table).where(key)).first() is not None:
        return 0
    return conn.execute(sa.insert(table).values(values)).rowcount


def _added(column: sa.ColumnElement[int], tokens: int) -> sa.ColumnElement[int]:
    """``column + tokens``, never below 0 (a reservation given back on a day that was reset)."""
    if tokens >= 0:
        return column + tokens
    return sa.case((column + tokens < 0, 0), else_=column + tokens)


def _under(limits: QuotaLimits, runs: int, tokens: int) -> bool:
    return (limits.runs_per_day is None or runs < limits.runs_per_day) and (
        limits.tokens_per_day is None or tokens < limits.tokens_per_day
    )


@dataclass(frozen=True, slots=True)
class QuotaExceeded:
    """Why a run was refused: which quota, the usage and limit, and when the day resets."""

    quota: QuotaName
    used: int
    limit: int
    retry_after: int
    """Seconds until the next UTC day."""

    @property
    def message(self) -> str:
        hours, minutes = divmod(math.ceil(self.retry_after / 60), 60)
        what = (
            "runs started"
            if self.quota == "runs_per_day"
            else "tokens used by your runs or reserved by those in flight"
        )
        return (
            f"daily quota reached: {self.used:,} of {self.limit:,} {what} today "
            f"(quota {self.quota}); it resets at 00:00 UTC, in {hours} h {minutes} min "
            f"(Retry-After: {self.retry_after} s)"
        )


class Quotas:
    """The quotas the settings set, counted in a ``QuotaStore``.

    ``clock`` gives the time in seconds since the epoch (tests move it to another day).
    """

    def __init__(
        self,
        settings: QuotaSettings,
        store: QuotaStore,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.store = store
        self.clock = clock

    def applies_to(self, user_id: str) -> bool:
        """Whether ``user_id`` has any limit (a user without one is not counted at all)."""
        limits = self.settings.limits_for(user_id)
        return limits.runs_per_day is not None or limits.tokens_per_day is not None

    def today(self) -> str:
        """The current UTC day, ``YYYY-MM-DD``."""
        return datetime.fromtimestamp(self.clock(), UTC).date().isoformat()

    def seconds_to_reset(self) -> int:
        """Whole seconds until the next UTC day begins (at least 1)."""
        now = datetime.fromtimestamp(self.clock(), UTC)
        midnight = datetime.combine(now.date() + timedelta(days=1), datetime.min.time(), UTC)
        return max(1, math.ceil((midnight - now).total_seconds()))

    def reservation(self, user_id: str) -> int:
        """The tokens a run of ``user_id`` reserves when it is admitted (``0`` for a user
        without ``tokens_per_day``: nothing to hold back)."""
        if self.settings.limits_for(user_id).tokens_per_day is None:
            return 0
        return self.settings.tokens_reserved_per_run

    def admit(self, user_id: str) -> tuple[str, QuotaExceeded | None]:
        """Count one run of ``user_id`` today and reserve its tokens; returns the day it was
        counted on, and why it was refused (``None`` when it was counted)."""
        day = self.today()
        limits = self.settings.limits_for(user_id)
        admitted, usage = self.store.admit(user_id, day, limits, self.reservation(user_id))
        if admitted:
            return day, None
        retry = self.seconds_to_reset()
        if limits.runs_per_day is not None and usage.runs >= limits.runs_per_day:
            return day, QuotaExceeded("runs_per_day", usage.runs, limits.runs_per_day, retry)
        assert limits.tokens_per_day is not None
        return day, QuotaExceeded("tokens_per_day", usage.tokens, limits.tokens_per_day, retry)

    def refund(self, user_id: str, day: str, reserved: int) -> None:
        """Uncount a run ``admit`` counted on ``day`` that never started, and its
        reservation."""
        self.store.refund(user_id, day, reserved)

    def settle(
        self, user_id: str, day: str, reserved: int, tokens: int, request_id: str | None = None
    ) -> bool:
        """Replace the ``reserved`` tokens a run took on ``day`` by the ``tokens`` it spent
        (counted today); with ``request_id``, only once for that run, whichever process
        settles it first. Returns whether it was settled now."""
        today = self.today()
        # One update when the run ends on the day it began: the day never shows the
        # reservation gone and the spend not yet there.
        delta = tokens - reserved if day == today else tokens
        if request_id is not None:
            if not self.store.add_run_tokens(user_id, today, request_id, delta):
                return False
        elif delta:
            self.store.add_tokens(user_id, today, delta)
        if day != today and reserved:
            self.store.add_tokens(user_id, day, -reserved)
        return True

    def usage(self, user_id: str) -> DailyUsage:
        """What ``user_id`` used today."""
        return self.store.usage(user_id, self.today())


def quota_store_for(keys: KeyStore) -> QuotaStore:
    """Where the counts of a key store's users go: the same database (``SqlKeyStore`` on a
    file or a server), else this process's memory."""
    engine = shared_engine(keys)
    return SqlQuotaStore(engine) if engine is not None else MemoryQuotaStore()
