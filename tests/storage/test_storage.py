"""The stores: sessions on every backend — in memory, SQLite, PostgreSQL — through the same tests
(isolation, locking, listing, deleting), then what only SQL has (migrations, WAL, URLs)."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, select

from hermes_agent import Agent, Memory, ScriptedModel
from hermes_agent.storage import LATEST_VERSION, SqlStorage, StorageError, open_storage
from hermes_agent.storage.sql import messages_table, schema_version
from hermes_agent.types import Message, ToolCall, ToolResult
from storage_backends import database_url, sql_database_url  # noqa: F401  (the fixtures)


def remembers(messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> str:
    """A model that answers with every user message it was shown, in order."""
    return " | ".join(m.content for m in messages if m.role == "user")


def test_messages_round_trip(db_url: str) -> None:
    with open_storage(db_url) as storage:
        turn = [
            Message("user", "Convert 5 km — and 東京?"),
            Message(
                "assistant",
                "",
                tool_calls=[ToolCall("convert", {"value": 5, "unit": "km"}, "call_1")],
                scratch_pad="Goal: convert",
            ),
            Message(
                "tool",
                tool_results=[
                    ToolResult("call_1", "convert", {"miles": 3.1, "ok": None}, 200, None),
                    ToolResult("call_2", "boom", None, 500, "tool 'boom' raised"),
                ],
            ),
            Message("assistant", "3.1 miles", raw="3.1 miles <tool_call>{bad"),
        ]
        storage.sessions.append("s1", turn)
        assert storage.sessions.load("s1") == turn
        assert storage.sessions.load("nobody") == []


def test_two_sessions_interleaved_in_one_process_stay_apart(db_url: str) -> None:
    with open_storage(db_url) as storage:
        agent = Agent(model=ScriptedModel(remembers), storage=storage)
        agent.run("alpha one", session_id="a")
        agent.run("beta one", session_id="b")
        second_a = agent.run("alpha two", session_id="a")
        second_b = agent.run("beta two", session_id="b")
        # The follow-up saw its own earlier turn, and nothing of the other session.
        assert second_a.output == "alpha one | alpha two"
        assert second_b.output == "beta one | beta two"
        assert [m.content for m in storage.sessions.load("a") if m.role == "user"] == [
            "alpha one",
            "alpha two",
        ]
        agent.close()


def test_two_sessions_in_two_threads_never_mix(db_url: str) -> None:
    with open_storage(db_url) as storage:
        agent = Agent(
            model=ScriptedModel(remembers), storage=storage, memory=Memory(history_window=50)
        )
        outputs: dict[str, list[str]] = {"left": [], "right": []}
        failures: list[BaseException] = []

        def chat(session: str) -> None:
            try:
                for turn in range(8):
                    result = agent.run(f"{session}-{turn}", session_id=session)
                    outputs[session].append(result.output)
            except BaseException as exc:  # surfaced below
                failures.append(exc)

        threads = [threading.Thread(target=chat, args=(name,)) for name in outputs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not failures
        for session, seen in outputs.items():
            other = "right" if session == "left" else "left"
            assert all(other not in output for output in seen)
            assert seen[-1] == " | ".join(f"{session}-{turn}" for turn in range(8))
        agent.close()


def test_runs_on_one_session_are_serialised(db_url: str) -> None:
    with open_storage(db_url) as storage:
        active = 0
        most = 0
        guard = threading.Lock()

        def slow(messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> str:
            nonlocal active, most
            with guard:
                active += 1
                most = max(most, active)
            time.sleep(0.05)  # slow work on purpose: calls at once overlap
            with guard:
                active -= 1
            return remembers(messages, tools)

        agent = Agent(model=ScriptedModel(slow), storage=storage)
        threads = [
            threading.Thread(target=agent.run, args=(f"q{n}",), kwargs={"session_id": "same"})
            for n in range(4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert most == 1
        history = storage.sessions.load("same")
        # Whole turns, one after another: user, assistant, user, assistant...
        assert [m.role for m in history] == ["user", "assistant"] * 4
        answers = [m.content for m in history if m.role == "assistant"]
        assert [len(answer.split(" | ")) for answer in answers] == [1, 2, 3, 4]
        agent.close()


def test_concurrent_appends_to_one_session_keep_every_message(db_url: str) -> None:
    # Without the in-process lock (as two processes would): the transaction keeps positions apart.
    with open_storage(db_url) as storage:

        def writer(number: int) -> None:
            for item in range(10):
                storage.sessions.append("shared", [Message("user", f"{number}:{item}")])

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        contents = [m.content for m in storage.sessions.load("shared")]
        assert sorted(contents) == sorted(f"{n}:{i}" for n in range(6) for i in range(10))
        for number in range(6):  # each writer's messages stay in its order
            mine = [c for c in contents if c.startswith(f"{number}:")]
            assert mine == [f"{number}:{i}" for i in range(10)]
        if isinstance(storage, SqlStorage):
            with storage.engine.connect() as conn:
                positions = [row[0] for row in conn.execute(select(messages_table.c.position))]
            assert sorted(positions) == list(range(60))
        assert storage.sessions.list_sessions()[0]["messages"] == 60


def test_a_sqlite_without_returning_appends_with_three_statements_instead(tmp_path: Path) -> None:
    # SQLite before 3.35 has no RETURNING: the session is counted in as it used to be.
    with SqlStorage(f"sqlite:///{tmp_path / 'old.db'}") as storage:
        storage.engine.dialect.insert_returning = False
        storage.sessions.append("s", [Message("user", "a"), Message("assistant", "b")])
        storage.sessions.append("s", [Message("user", "c")])
        assert [m.content for m in storage.sessions.load("s")] == ["a", "b", "c"]
        listed = storage.sessions.list_sessions()[0]
        assert (listed["turns"], listed["messages"]) == (2, 3)


def test_list_and_delete_sessions(db_url: str) -> None:
    with open_storage(db_url) as storage:
        storage.sessions.append("old", [Message("user", "hi"), Message("assistant", "hello")])
        time.sleep(0.01)  # the clock moves on: the sessions' times differ
        storage.sessions.append("new", [Message("user", "hey")])
        listed = storage.sessions.list_sessions()
        assert [s["id"] for s in listed] == ["new", "old"]
        assert listed[1]["turns"] == 1 and listed[1]["messages"] == 2
        assert listed[1]["created"] <= listed[1]["updated"]
        assert storage.sessions.delete("old") is True
        assert storage.sessions.delete("old") is False
        assert storage.sessions.load("old") == []
        assert [s["id"] for s in storage.sessions.list_sessions()] == ["new"]
        assert storage.sessions.load("new") == [Message("user", "hey")]


def test_migrations_are_idempotent_and_safe_to_race(sql_url: str) -> None:
    errors: list[BaseException] = []

    def open_once() -> None:
        try:
            SqlStorage(sql_url).close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_once) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    with SqlStorage(sql_url) as storage:
        storage.sessions.append("kept", [Message("user", "still here")])
    with SqlStorage(sql_url) as storage:
        assert storage.schema_version == LATEST_VERSION
        with storage.engine.connect() as conn:
            versions = [row[0] for row in conn.execute(select(schema_version.c.version))]
        assert versions == list(range(1, LATEST_VERSION + 1))
        assert storage.sessions.load("kept") == [Message("user", "still here")]


def test_a_newer_schema_is_refused(sql_url: str) -> None:
    with SqlStorage(sql_url) as storage, storage.engine.begin() as conn:
        conn.execute(insert(schema_version).values(version=LATEST_VERSION + 1, applied_ns=0))
    with pytest.raises(StorageError, match="newer than"):
        SqlStorage(sql_url)


def test_sqlite_uses_wal_and_creates_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with SqlStorage("sqlite:///.hermes/state.db") as storage:
        storage.sessions.append("s", [Message("user", "hi")])
        with storage.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 1000
    assert (tmp_path / ".hermes" / "state.db").is_file()
    with sqlite3.connect(tmp_path / ".hermes" / "state.db") as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_in_memory_sqlite_works_across_threads() -> None:
    with SqlStorage("sqlite://") as storage:
        threads = [
            threading.Thread(
                target=storage.sessions.append, args=(f"s{n}", [Message("user", str(n))])
            )
            for n in range(4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(s["id"] for s in storage.sessions.list_sessions()) == [
            "s0",
            "s1",
            "s2",
            "s3",
        ]


def test_a_bad_url_is_a_clear_error() -> None:
    with pytest.raises(StorageError, match="not a database URL"):
        SqlStorage("not a url")
