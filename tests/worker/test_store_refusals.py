"""A queued run's write that the store refuses for good — out of memory or disk, a value too
large, data it cannot take — is not a store outage: it is not tried again, and the run ends
``failed`` with the reason, instead of going back to the queue to meet the same refusal (and
re-send its work to the model) for ever. Only a store that was away is waited for.

The refusals come from the real databases: a trigger on the journal's table makes PostgreSQL
answer with a given SQLSTATE, and SQLite with a given message."""

from __future__ import annotations

import logging
import sqlite3
from typing import Any

import psycopg
import pytest
import sqlalchemy.exc
from sqlalchemy import text

from hermes_agent import Agent, ScriptedModel
from hermes_agent.errors import StoreUnavailable
from hermes_agent.runs.request import QueuedRequest
from hermes_agent.storage.sql import SqlStorage
from hermes_agent.testing import tool_call as call
from hermes_agent.worker.attempt import transient
from hermes_agent.worker.runner import RunWorker
from hermes_agent.worker.store import RunStore

RETRIED = "trying again"  # what a write that is tried again logs


def noop() -> str:
    """Do nothing."""
    return "ok"


def worker_on(url: str, cleanup: list[Any]) -> tuple[RunStore, RunWorker, Agent]:
    agent = Agent(ScriptedModel([call("noop"), "done"]), storage=url, tools=[noop])
    assert isinstance(agent.storage, SqlStorage)
    store = RunStore(agent.storage, max_redeliveries=1)
    # A short lease: a write that is tried again gives up after half a second.
    worker = RunWorker(agent, store, lambda _rid: None, name="w:1", lease_ttl=1.0)
    cleanup.extend([agent, worker])
    return store, worker, agent


def refuse_journal_writes(storage: SqlStorage, sqlstate: str, message: str) -> None:
    """Every write of a journal entry is answered by the database with this error."""
    if storage.engine.dialect.name == "postgresql":
        body = f"BEGIN RAISE EXCEPTION '{message}' USING ERRCODE = '{sqlstate}'; END;"
        statements = [
            f"CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ {body} $$",
            "CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON hermes_run_journal "
            "FOR EACH ROW EXECUTE FUNCTION refuse()",
        ]
    else:
        statements = [
            "CREATE TRIGGER refuse BEFORE INSERT ON hermes_run_journal "
            f"BEGIN SELECT RAISE(ABORT, '{message}'); END"
        ]
    with storage.engine.begin() as conn:
        for statement in statements:
            conn.execute(text(statement))


def test_a_write_the_store_refuses_for_good_fails_the_run_at_once(
    url: str, cleanup: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    store, worker, agent = worker_on(url, cleanup)
    assert isinstance(agent.storage, SqlStorage)
    refuse_journal_writes(agent.storage, "53200", "out of memory")
    rid = store.add("s1", QueuedRequest(message="go"))
    with caplog.at_level(logging.WARNING):
        assert worker.execute(rid) == "failed"
    run = store.get(rid)
    assert run is not None and run.status == "failed"
    assert run.error is not None and "the store refused the journal" in run.error
    assert "out of memory" in run.error
    assert RETRIED not in caplog.text  # not taken for an outage: asked once
    assert agent.sessions.load("s1") == []


def test_a_store_that_is_away_is_still_waited_for(
    url: str, cleanup: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """A conflict worth retrying (PostgreSQL's 40001) is tried again until the budget is spent,
    then the attempt ends with no ending, to resume when the store is back — as before."""
    store, worker, agent = worker_on(url, cleanup)
    assert isinstance(agent.storage, SqlStorage)
    if agent.storage.engine.dialect.name != "postgresql":
        pytest.skip("a trigger can raise a retryable SQLSTATE on PostgreSQL only")
    refuse_journal_writes(agent.storage, "40001", "could not serialize access")
    rid = store.add("s1", QueuedRequest(message="go"))
    with caplog.at_level(logging.WARNING), pytest.raises(StoreUnavailable):
        worker.execute(rid)
    assert RETRIED in caplog.text
    run = store.get(rid)
    assert run is not None and run.status != "failed"


def _wrapped(orig: BaseException, kind: type[sqlalchemy.exc.DBAPIError]) -> BaseException:
    return kind("INSERT INTO t VALUES (:v)", {"v": "too large " * 3}, orig)


def _psycopg(sqlstate: str | None, message: str) -> psycopg.Error:
    kind = psycopg.errors.lookup(sqlstate) if sqlstate else psycopg.OperationalError
    return kind(message)  # type: ignore[no-any-return]


def _sqlite(name: str, message: str) -> sqlite3.Error:
    error = sqlite3.OperationalError(message)
    error.sqlite_errorname = name
    return error


def _name(error: BaseException) -> str:
    said = getattr(error, "orig", None) or error
    code = getattr(said, "sqlstate", None) or getattr(said, "sqlite_errorname", None)
    return f"{type(said).__name__}-{code or ''}-{str(said)[:24]}".replace(" ", "_")


@pytest.mark.parametrize(
    ("error", "retried"),
    [
        # PostgreSQL: away, restarting, a conflict, a lock, too many connections: wait.
        (
            _wrapped(_psycopg(None, "connection failed: refused"), sqlalchemy.exc.OperationalError),
            True,
        ),
        (_wrapped(_psycopg("08006", "connection failure"), sqlalchemy.exc.OperationalError), True),
        (
            _wrapped(_psycopg("57P01", "terminating connection"), sqlalchemy.exc.OperationalError),
            True,
        ),
        (_wrapped(_psycopg("40001", "could not serialize"), sqlalchemy.exc.OperationalError), True),
        (_wrapped(_psycopg("40P01", "deadlock detected"), sqlalchemy.exc.OperationalError), True),
        (
            _wrapped(_psycopg("53300", "too many connections"), sqlalchemy.exc.OperationalError),
            True,
        ),
        # ... out of memory or disk, a program limit, bad data, a constraint: do not.
        (_wrapped(_psycopg("53200", "out of memory"), sqlalchemy.exc.OperationalError), False),
        (
            _wrapped(_psycopg("53100", "could not extend file"), sqlalchemy.exc.OperationalError),
            False,
        ),
        (_wrapped(_psycopg("54000", "row is too big"), sqlalchemy.exc.OperationalError), False),
        (
            _wrapped(_psycopg("22P05", "unsupported Unicode escape"), sqlalchemy.exc.DataError),
            False,
        ),
        (_wrapped(_psycopg("23505", "duplicate key"), sqlalchemy.exc.IntegrityError), False),
        (
            _wrapped(
                _psycopg(None, "sending query failed: Cannot allocate memory"),
                sqlalchemy.exc.OperationalError,
            ),
            False,
        ),
        # SQLite: busy or locked: wait; full, too big: do not.
        (
            _wrapped(_sqlite("SQLITE_BUSY", "database is locked"), sqlalchemy.exc.OperationalError),
            True,
        ),
        (
            _wrapped(
                _sqlite("SQLITE_FULL", "database or disk is full"), sqlalchemy.exc.OperationalError
            ),
            False,
        ),
        (
            _wrapped(_sqlite("SQLITE_TOOBIG", "string or blob too big"), sqlalchemy.exc.DataError),
            False,
        ),
        # Raised in the process itself, under the store's error or not.
        (MemoryError(), False),
        (StoreUnavailable("the store did not answer"), True),
        (sqlalchemy.exc.TimeoutError("QueuePool limit reached"), True),
    ],
    ids=lambda value: _name(value) if isinstance(value, BaseException) else str(value),
)
def test_only_a_store_that_was_away_is_tried_again(error: BaseException, retried: bool) -> None:
    assert transient(error) is retried


def test_the_statements_own_values_do_not_decide() -> None:
    """What a run wrote (a value saying "too large") is in SQLAlchemy's text of the error, not
    the driver's: a lost connection is still an outage."""
    lost = _wrapped(_psycopg(None, "server closed the connection"), sqlalchemy.exc.OperationalError)
    assert "too large" in str(lost) and transient(lost)
