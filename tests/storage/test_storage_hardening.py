"""Attacks on the storage boundary, each performed on every store (in memory, SQLite,
PostgreSQL): text no database can hold, a record the database refuses, a store that fails after
the tools ran, over-long session ids, two tenants on one store, secrets hidden in keys or behind
JSON escapes. Then the storage seam itself: ``open_storage``, ``Agent.fork``, migrations."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import inspect, text

from hermes_agent import Agent, HermesAgentError, Message, ScriptedModel
from hermes_agent.audit.records import AuditRecord, Role
from hermes_agent.stages import StageName
from hermes_agent.storage import (
    LATEST_VERSION,
    MAX_ID_LENGTH,
    InMemoryStorage,
    SessionIdError,
    SqlStorage,
    Storage,
    StorageError,
    open_storage,
)
from hermes_agent.testing import tool_call as call
from server_harness import wait_for
from storage_backends import database_url, sql_database_url  # noqa: F401  (the fixtures)

LONE = "\ud800"
NUL = "\x00"


def everything_stored(storage: Storage, session_ids: Sequence[str]) -> str:
    """Every text the store holds for these sessions, messages and audit records alike."""
    parts: list[str] = []
    for session_id in session_ids:
        for message in storage.sessions.load(session_id):
            parts.append(repr(message))
        for request_id in storage.session_requests(session_id):
            parts.extend(record.content for record in storage.records(request_id))
    return "\n".join(parts)


# -- issue: text the database cannot store ------------------------------------------------


def test_unstorable_text_in_arguments_output_and_errors_is_escaped_not_fatal(db_url: str) -> None:
    runs: list[str] = []

    def echo(text: str) -> str:
        """Fails on purpose, naming its input."""
        runs.append(text)
        raise RuntimeError(f"cannot handle {text}")

    model = ScriptedModel([call("echo", text=f"a{LONE}b{NUL}c"), f"done {LONE} and {NUL}"])
    with open_storage(db_url) as storage:
        agent = Agent(model=model, tools=[echo], storage=storage)
        result = agent.run("go", session_id="s")
        assert runs == [f"a{LONE}b{NUL}c"]  # the tool got the text as the model sent it
        assert result.status == 200 and result.output == f"done {LONE} and {NUL}"
        assert any("\\uXXXX" in warning for warning in result.warnings)

        records = storage.records(result.request_id)
        assert [r.role for r in records] == [
            "user",
            "prompt",
            "completion",
            "selection",
            "tool",
            "tool_calls",
            "prompt_added",
            "completion",
            "output",
        ]
        for record in records:
            assert LONE not in record.content and NUL not in record.content
        tool = next(r for r in records if r.role == "tool")
        assert "\\ud800" in tool.content and tool.sanitized is not None
        output = records[-1]
        assert output.content == "done \\ud800 and \\u0000"
        assert output.sanitized is not None and "2 characters" in output.sanitized
        assert records[0].sanitized is None  # untouched records say nothing

        stored = storage.sessions.load("s")
        # Text columns hold the escape; in JSON columns it is JSON's own, so it reads back as
        # it was; the in-memory store holds any text.
        in_memory = isinstance(storage, InMemoryStorage)
        assert stored[-1].content == (output.content if not in_memory else result.output)
        assert stored[1].tool_calls[0].arguments == {"text": f"a{LONE}b{NUL}c"}
        assert f"cannot handle a{LONE}b{NUL}c" in (stored[2].tool_results[0].error or "")
        # The session goes on: the next turn loads what was stored.
        agent._model = ScriptedModel(["still fine"])
        assert agent.run("again", session_id="s").status == 200
        agent.close()


def test_a_record_the_database_refuses_costs_only_itself(
    sql_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    def record(session_id: str, seq: int, content: Any = "fine") -> AuditRecord:
        return AuditRecord(
            request_id=f"req-{session_id}",
            session_id=session_id,
            step=0,
            stage="InputParser",
            role="user",
            content=content,
            timestamp_ns=1_000 + seq,
            latency_ms=0.1,
            status="ok",
            status_code=200,
            model_name="m",
            system_prompt_sha256="0" * 64,
            seq=seq,
        )

    with SqlStorage(sql_url) as storage, caplog.at_level(logging.ERROR, "hermes_agent"):
        poisoned = record("b", 1, content=None)  # NOT NULL: refused by every SQL database
        # Three sessions' steps queued together: one burst, one transaction, until it fails.
        storage.audit.write([record("a", 0), record("a", 1)])
        storage.audit.write([record("b", 0), poisoned, record("b", 2)])
        storage.audit.write([record("c", 0)])
        storage.audit.flush()
        assert [r.seq for r in storage.records("req-a")] == [0, 1]
        assert [r.seq for r in storage.records("req-c")] == [0]
        assert [r.seq for r in storage.records("req-b")] == [0, 2]
        assert storage.audit.dropped == 1
        assert [refused for refused, _ in storage.audit.quarantined] == [poisoned]
        assert "1 of 3 records of request req-b" in caplog.text


def test_a_store_that_fails_after_the_tools_ran_is_reported_not_raised(db_url: str) -> None:
    ran: list[int] = []

    class BrokenSessions:
        """Loads fine; cannot save (a full disk, a dropped connection)."""

        def __init__(self, inner: Storage) -> None:
            self.inner = inner

        def load(self, session_id: str) -> list[Message]:
            return self.inner.sessions.load(session_id)

        def append(self, session_id: str, messages: Sequence[Message]) -> None:
            raise OSError("disk full")

        def lock(self, session_id: str) -> threading.Lock:
            return self.inner.sessions.lock(session_id)

    with open_storage(db_url) as storage:

        def pay(amount: int) -> str:
            """Pays, and then the trail can no longer be written."""
            ran.append(amount)
            storage.audit.close()  # type: ignore[attr-defined]
            return "paid"

        agent = Agent(
            model=ScriptedModel([call("pay", amount=5), "Paid."]),
            tools=[pay],
            storage=storage,
            session_store=BrokenSessions(storage),
        )
        result = agent.run("pay 5", session_id="s")
        assert ran == [5]
        assert result.status == 200 and result.output == "Paid."
        assert any("not saved to session 's'" in w and "disk full" in w for w in result.warnings)
        assert any(w.startswith("audit:") for w in result.warnings)
        agent.close()


def test_a_session_id_the_store_cannot_hold_is_refused_before_anything_runs(db_url: str) -> None:
    ran: list[int] = []

    def act(n: int) -> int:
        """Has a side effect."""
        ran.append(n)
        return n

    with open_storage(db_url) as storage:
        model = ScriptedModel([call("act", n=1), "done"])
        agent = Agent(model=model, tools=[act], storage=storage)
        with pytest.raises(SessionIdError, match=f"256 characters long.*at most {MAX_ID_LENGTH}"):
            agent.run("go", session_id="x" * (MAX_ID_LENGTH + 1))
        for bad in (f"tenant{NUL}", f"tenant{LONE}"):
            with pytest.raises(SessionIdError, match="characters no store can keep") as refused:
                agent.run("go", session_id=bad)
            assert isinstance(refused.value, HermesAgentError)
        assert ran == [] and model.requests == []
        assert storage.sessions.list_sessions() == [] and storage.requests() == []
        longest = "y" * MAX_ID_LENGTH  # the limit itself fits, on PostgreSQL too
        result = agent.run("go", session_id=longest)
        assert result.status == 200 and ran == [1]
        assert storage.sessions.load(longest)[0] == Message("user", "go")
        assert storage.records(result.request_id)[0].session_id == longest
        agent.close()


# -- issue: two tenants on one store -------------------------------------------------------


def test_two_agents_sharing_a_store_each_keep_their_own_secrets(db_url: str) -> None:
    key_a, key_b = "sk-tenant-a-0123456789", "sk-tenant-b-9876543210"

    def agent_for(key: str, storage: Storage) -> Agent:
        def account(token: str) -> dict[str, str]:
            """Look an account up by token."""
            return {"owner": "someone", "token": token}

        model = ScriptedModel([call("account", token=key), f"Your token is {key}."])
        return Agent(model=model, tools=[account], storage=storage, secrets=[key])

    with open_storage(db_url) as storage:
        first = agent_for(key_a, storage)
        second = agent_for(key_b, storage)  # created last: it used to win the store's redactor
        assert first.run(f"my token is {key_a}", session_id="a").status == 200
        assert second.run(f"my token is {key_b}", session_id="b").status == 200
        stored = everything_stored(storage, ["a", "b"])
        assert "[REDACTED]" in stored
        assert key_a not in stored and key_b not in stored
        first.close()
        second.close()


# -- issue: redaction gaps -------------------------------------------------------------------


def test_a_secret_used_as_a_dictionary_key_is_redacted(db_url: str) -> None:
    secret = "sk-key-as-key-5551234"

    def lookup() -> dict[str, Any]:
        """Returns the secret as a key, at two depths."""
        return {secret: "valid", "nested": [{secret: 1}]}

    with open_storage(db_url) as storage:
        model = ScriptedModel([call("lookup"), "ok"])
        agent = Agent(model=model, tools=[lookup], storage=storage, secrets=[secret])
        agent.run("check", session_id="s")
        stored = everything_stored(storage, ["s"])
        assert secret not in stored
        result = storage.sessions.load("s")[2].tool_results[0].content
        assert result["data"] == {"[REDACTED]": "valid", "nested": [{"[REDACTED]": 1}]}
        agent.close()


@pytest.mark.parametrize(
    "secret",
    ['pa"ss\\word-1234', "clé-secrète-42", 'a\\"b\\\\c"-token'],
    ids=["quote-and-backslash", "non-ascii", "escaped-twice"],
)
def test_a_secret_is_redacted_in_its_json_escaped_forms(db_url: str, secret: str) -> None:
    forms = {
        secret,
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
        json.dumps(json.dumps(secret)[1:-1])[1:-1],
    }
    assert len(forms) > 1  # the secret does change when serialised

    def login(password: str) -> dict[str, str]:
        """Logs in."""
        return {"echo": password}

    with open_storage(db_url) as storage:
        model = ScriptedModel([call("login", password=secret), "Logged in."])
        agent = Agent(model=model, tools=[login], storage=storage, secrets=[secret])
        result = agent.run("log me in", session_id="s")
        assert result.status == 200
        records = storage.records(result.request_id)
        stored = everything_stored(storage, ["s"])
        for form in forms:
            assert form not in stored, f"{form!r} stored in clear"
        selection = json.loads(next(r.content for r in records if r.role == "selection"))
        assert selection["planned"][0]["arguments"] == {"password": "[REDACTED]"}
        agent.close()


def test_an_agent_without_a_store_keeps_no_secret_in_its_sessions() -> None:
    agent = Agent(model=ScriptedModel(["noted"]), secrets=["sk-memory-only-12345"])
    agent.run("remember sk-memory-only-12345", session_id="s")
    assert agent.sessions.load("s")[0].content == "remember [REDACTED]"


# -- the seam ---------------------------------------------------------------------------------


def test_open_storage_picks_the_backend_by_scheme(tmp_path: Path) -> None:
    with open_storage("memory://") as memory:
        assert isinstance(memory, InMemoryStorage)
    with open_storage(f"sqlite:///{tmp_path / 'state.db'}") as sql:
        assert isinstance(sql, SqlStorage)
    for bad in ("redis://localhost/0", "state.db"):
        with pytest.raises(StorageError, match="memory://"):
            open_storage(bad)
    agent = Agent(model=ScriptedModel(["hi"]), storage="memory://")
    result = agent.run("hello", session_id="s")
    assert agent.storage is not None and agent.storage.records(result.request_id)
    agent.close()
    assert agent.storage is None  # opened from a URL by the agent, so closed by it


def test_fork_shares_tools_and_hooks_and_replaces_what_it_is_given(db_url: str) -> None:
    seen: list[str] = []

    def double(x: int) -> int:
        """Twice x."""
        return 2 * x

    with open_storage(db_url) as storage:
        agent = Agent(model=ScriptedModel(["original"]), tools=[double], storage=storage)
        agent.add_hook("pre_execution", lambda ctx: seen.append("hook"))
        twin = agent.fork(
            model=ScriptedModel([call("double", x=2), call("triple", x=2), "done"]),
            storage="memory://",
            approver=lambda call, tool: True,
        )

        @agent.tool  # registered after the fork: the registry is shared
        def triple(x: int) -> int:
            """Three times x."""
            return 3 * x

        result = twin.run("go", session_id="t")
        assert [c.result for c in result.tool_calls] == [4, 6]
        assert seen == ["hook", "hook"]
        assert isinstance(twin.storage, InMemoryStorage) and twin.storage.requests()
        assert storage.requests() == [] and storage.sessions.load("t") == []
        assert twin.runtime is not agent.runtime and twin.history is not agent.history
        assert twin.approver is not None and agent.approver is None
        twin.close()
        assert agent.storage is storage  # the fork's close left the original's store alone
        assert agent.run("hello", session_id="u").output == "original"
        kept = agent.fork()
        assert kept.storage is storage and kept.sessions is agent.sessions
        assert agent.fork(storage=None).storage is None
        agent.close()


def test_a_version_1_database_is_migrated_and_keeps_its_records(sql_url: str) -> None:
    with SqlStorage(sql_url) as storage:  # made by today's code, then taken back to version 1
        agent = Agent(model=ScriptedModel(["hi"]), storage=storage)
        request_id = agent.run("hello", session_id="s").request_id
        agent.close()
        with storage.engine.begin() as conn:
            conn.execute(text("ALTER TABLE audit_records DROP COLUMN sanitized"))
            conn.execute(text("DELETE FROM schema_version WHERE version > 1"))
    with SqlStorage(sql_url) as storage:
        assert storage.schema_version == LATEST_VERSION >= 2
        with storage.engine.connect() as conn:
            columns = {c["name"] for c in inspect(conn).get_columns("audit_records")}
        assert "sanitized" in columns
        records = storage.records(request_id)
        assert records[0].content == "hello" and records[0].sanitized is None
        marked = dataclasses.replace(records[0], request_id="new", content=f"x{LONE}")
        storage.audit.write([marked])
        assert storage.records("new")[0].content == "x\\ud800"
        assert storage.records("new")[0].sanitized is not None


# -- many rows in one statement (storage.statements) -------------------------------------------

HARD_TEXTS = [
    'quotes " and \' and \\ backslashes \\u0041 and {"json": [1]}',
    "lines\nand\ttabs\r\n",
    "中文 and emoji 🙂 and \u2028 separators",
    "an escape someone wrote: \\u0000 (text, not a NUL)",
    "",
]


def test_many_rows_in_one_statement_read_back_exactly(sql_url: str) -> None:
    """``insert_rows`` (on PostgreSQL one statement with the rows as JSON): every value reads
    back as it was given, whatever its text, with numbers, ``None`` and the text of a str enum
    (a record's stage and role) kept."""
    from hermes_agent.storage.schema import audit_table
    from hermes_agent.storage.statements import insert_rows

    storage = SqlStorage(sql_url)
    try:
        records = [
            AuditRecord(
                request_id="r1",
                session_id="s1",
                step=n,
                stage=StageName.TOOL_EXECUTOR,  # a str enum, as the pipeline's records hold
                role=Role.TOOL,
                content=content,
                timestamp_ns=1_780_000_000_000_000_000 + n,
                latency_ms=0.1 + n / 3,
                status="ok",
                status_code=200,
                model_name="m",
                system_prompt_sha256="0" * 64,
                seq=n,
                sanitized=None if n % 2 else "a note",
            )
            for n, content in enumerate(HARD_TEXTS)
        ]
        with statements_of(storage) as sent, storage.transaction(write=True) as conn:
            insert_rows(conn, audit_table, [dataclasses.asdict(r) for r in records])
        assert storage.records("r1") == records
        inserts = [(text_, many) for text_, many in sent if text_.startswith("INSERT")]
        if sql_url.startswith("postgresql"):  # one statement, the rows as JSON
            assert len(inserts) == 1 and "json_populate_recordset" in inserts[0][0], inserts
            assert not inserts[0][1]
        else:  # row by row: no round trip to save in process
            assert len(inserts) == 1 and inserts[0][1], inserts
    finally:
        storage.close()


@contextlib.contextmanager
def statements_of(storage: SqlStorage) -> Iterator[list[tuple[str, bool]]]:
    """The statements ``storage`` sends while the block runs: (text, whether executemany)."""
    from sqlalchemy import event

    sent: list[tuple[str, bool]] = []

    def note(_conn: Any, _cursor: Any, statement: str, _params: Any, _ctx: Any, many: bool) -> None:
        sent.append((statement.lstrip(), many))

    event.listen(storage.engine, "before_cursor_execute", note)
    try:
        yield sent
    finally:
        event.remove(storage.engine, "before_cursor_execute", note)


def test_values_json_would_read_otherwise_are_stored_as_a_parameter_stores_them(
    sql_url: str,
) -> None:
    """A boolean or a whole float given for an integer column is stored as a parameter stores
    it (PostgreSQL's JSON conversion would refuse them as they are), in the one statement."""
    from hermes_agent.storage.schema import audit_table
    from hermes_agent.storage.statements import insert_rows

    storage = SqlStorage(sql_url)
    try:
        row = dataclasses.asdict(
            AuditRecord("r3", "s3", 0, "Worker", "usage", "{}", 1, 2.5, "ok", 200, "m", "0" * 64)
        )
        rows = [{**row, "step": 1.0}, {**row, "seq": 1, "status_code": True}]
        with statements_of(storage) as sent, storage.transaction(write=True) as conn:
            insert_rows(conn, audit_table, rows)
        assert [(r.step, r.status_code) for r in storage.records("r3")] == [(1, 200), (0, 1)]
        inserts = [text_ for text_, _ in sent if text_.startswith("INSERT")]
        assert len(inserts) == 1
        if sql_url.startswith("postgresql"):
            assert "json_populate_recordset" in inserts[0]
    finally:
        storage.close()


def test_many_rows_replace_those_of_the_same_key(sql_url: str) -> None:
    """A journal entry whose key is stored replaces it, and of two rows with one key in a
    batch the last stays (one PostgreSQL statement may not change a row twice)."""
    from hermes_agent.storage.schema import journal_table
    from hermes_agent.storage.statements import insert_rows

    storage = SqlStorage(sql_url)

    def entry(key: str, state: str, token: int) -> dict[str, Any]:
        return {
            "request_id": "r1",
            "key": key,
            "state": state,
            "payload": json.dumps({"key": key, "text": HARD_TEXTS[0]}),
            "token": token,
            "updated_ns": 2**62 + token,
        }

    try:
        with storage.transaction(write=True) as conn:
            insert_rows(conn, journal_table, [entry("a", "started", 1), entry("b", "started", 1)])
        with storage.transaction(write=True) as conn:
            again = [entry("b", "waiting", 2), entry("b", "done", 2), entry("c", "done", 2)]
            insert_rows(conn, journal_table, again)  # b twice: the last stays
        with storage.transaction() as conn:
            rows = conn.execute(
                text(
                    "SELECT key, state, payload, token, updated_ns FROM hermes_run_journal "
                    "ORDER BY key"
                )
            ).all()
        assert [tuple(row) for row in rows] == [
            ("a", "started", entry("a", "", 1)["payload"], 1, 2**62 + 1),
            ("b", "done", entry("b", "", 2)["payload"], 2, 2**62 + 2),
            ("c", "done", entry("c", "", 2)["payload"], 2, 2**62 + 2),
        ]
    finally:
        storage.close()


def test_a_float_json_cannot_say_is_stored_all_the_same(sql_url: str) -> None:
    """A latency that is not finite, which JSON has no number for, travels as the text
    PostgreSQL reads it from, and is stored as a parameter stores it."""
    from hermes_agent.storage.schema import audit_table
    from hermes_agent.storage.statements import insert_rows

    storage = SqlStorage(sql_url)
    try:
        rows = [
            dataclasses.asdict(
                AuditRecord(
                    "r2", "s2", 0, "Worker", "usage", "{}", 1, latency, "ok", 200, "m", "0" * 64
                )
            )
            for latency in (float("inf"), float("-inf"), 2.5)
        ]
        with storage.transaction(write=True) as conn:
            insert_rows(conn, audit_table, rows)
        assert [r.latency_ms for r in storage.records("r2")] == [float("inf"), float("-inf"), 2.5]
    finally:
        storage.close()


# -- the written-behind trail: one wake a linger, not one a step ------------------------------


def _trail_record(index: int) -> AuditRecord:
    return AuditRecord(
        "written-behind", "s", index, "Worker", "usage", "{}", index, 1.0, "ok", 200, "m", "0" * 64
    )


def _voluntary_switches(native_id: int) -> int:
    """How often the thread ``native_id`` of this process has gone to sleep (Linux)."""
    status = Path(f"/proc/self/task/{native_id}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("voluntary_ctxt"))
    return int(line.split()[1])


def _noting_bursts(sink: Any) -> list[tuple[float, int]]:
    """When each burst the writer hands its store was written, and how many records it held
    (the list fills as the writer stores)."""
    bursts: list[tuple[float, int]] = []
    store = sink.target.write

    def noting(records: Any) -> None:
        bursts.append((time.monotonic(), len(records)))
        store(records)

    sink.target.write = noting
    return bursts


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")
def test_the_trail_writer_sleeps_its_linger_out_instead_of_waking_at_each_step(
    tmp_path: Path,
) -> None:
    """Steps queued while the writer lingers do not wake it: a service queues one every few
    milliseconds, and a writer woken by each took the GIL from the runs as often. They are
    stored all the same, in the order they came, in one burst or a few."""
    storage = SqlStorage(f"sqlite:///{tmp_path / 'trail.db'}")
    sink = storage.audit
    sink.LINGER_S, sink.MAX_DELAY_S = 1.0, 30.0  # one linger covers the steps below
    try:
        sink.write([_trail_record(0)])
        wait_for(sink._queue.empty, what="the writer taking the first step (it lingers)")
        writer = sink._thread
        assert writer is not None and writer.native_id is not None
        before = _voluntary_switches(writer.native_id)
        for index in range(1, 101):
            sink.write([_trail_record(index)])
            time.sleep(0.001)  # a stream's pace: a step every millisecond
        woken = _voluntary_switches(writer.native_id) - before
        sink.flush()
        assert [r.step for r in storage.records("written-behind")] == list(range(101))
        # Lingering on the queue, it went back to sleep after each of the 100 steps.
        assert woken < 40, woken
    finally:
        storage.close()


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")
def test_under_steady_steps_each_linger_is_twice_the_last(tmp_path: Path) -> None:
    """Steps that keep coming (one every 2 ms, as a busy service queues them) no longer wake
    the writer once a linger only for it to see that more came: each linger is twice the last
    (up to 80 ms), so a 10 ms linger wakes it about ten times before the burst's bound, where
    it woke sixty. Every step is stored all the same, in order."""
    storage = SqlStorage(f"sqlite:///{tmp_path / 'trail.db'}")
    sink = storage.audit
    sink.LINGER_S, sink.MAX_DELAY_S = 0.01, 0.64
    try:
        sink.write([_trail_record(0)])
        wait_for(sink._queue.empty, what="the writer taking the first step (it lingers)")
        writer = sink._thread
        assert writer is not None and writer.native_id is not None
        before, started = _voluntary_switches(writer.native_id), time.monotonic()
        index = 0
        while time.monotonic() - started < 0.6:
            index += 1
            sink.write([_trail_record(index)])
            time.sleep(0.002)  # a stream's pace: a step every two milliseconds
        woken = _voluntary_switches(writer.native_id) - before
        sink.flush()
        assert [r.step for r in storage.records("written-behind")] == list(range(index + 1))
        assert woken < 25, woken
    finally:
        storage.close()


def test_the_steps_before_a_pause_are_stored_within_the_longest_linger(tmp_path: Path) -> None:
    """Lingers double while steps keep coming, but never past ``MAX_LINGER_S``, and the first
    wake that finds the stream paused writes the burst: the steps before a pause (a run's
    ending, which a kill would otherwise lose) wait for one capped linger, not for a doubled
    one of a third of a second."""
    storage = SqlStorage(f"sqlite:///{tmp_path / 'trail.db'}")
    sink = storage.audit
    sink.LINGER_S, sink.MAX_LINGER_S, sink.MAX_DELAY_S = 0.01, 0.04, 30.0
    bursts, lingers = _noting_bursts(sink), []
    wait = sink._hurry.wait

    def lingering(timeout: float | None = None) -> bool:
        lingers.append(timeout)
        return wait(timeout)

    sink._hurry.wait = lingering  # type: ignore[method-assign]
    try:
        index = 0
        started = time.monotonic()
        while time.monotonic() - started < 0.4:  # uncapped, the lingers would reach 0.32 s
            sink.write([_trail_record(index)])
            index += 1
            time.sleep(0.002)  # a stream's pace: a step every two milliseconds
        last = time.monotonic()
        # No flush: it would end the linger.
        wait_for(lambda: sum(count for _, count in bursts) >= index, 5, "every step stored")
        assert sum(count for _, count in bursts) == index
        assert max(lingers) == pytest.approx(0.04), lingers  # doubled, then capped
        assert bursts[-1][0] - last < 0.25, bursts[-1][0] - last  # one capped linger or two
        assert [r.step for r in storage.records("written-behind")] == list(range(index))
    finally:
        storage.close()


def test_a_burst_that_reaches_max_records_is_written_without_another_linger(
    tmp_path: Path,
) -> None:
    """Once a burst holds ``MAX_RECORDS`` it is written at once: the writer does not sleep one
    more (doubled) linger first. Steps queued during its first linger fill the burst."""
    storage = SqlStorage(f"sqlite:///{tmp_path / 'trail.db'}")
    sink = storage.audit
    sink.LINGER_S, sink.MAX_DELAY_S, sink.MAX_RECORDS = 0.5, 30.0, 50
    bursts = _noting_bursts(sink)
    try:
        started = time.monotonic()
        sink.write([_trail_record(0)])
        # The writer has taken it and lingers; the rest come meanwhile.
        wait_for(sink._queue.empty, what="the writer taking the first step")
        for index in range(1, 60):
            sink.write([_trail_record(index)])
        wait_for(lambda: bursts, 5, "the first burst")  # no flush: it ends lingers
        # Written when its first linger ended (0.5 s), not after a second one (1.0 s more).
        assert bursts and bursts[0][0] - started < 1.2, bursts
        sink.flush()
        assert [count for _, count in bursts] == [50, 10]
        assert [r.step for r in storage.records("written-behind")] == list(range(60))
    finally:
        storage.close()


def _ends_within(call: Any, seconds: float) -> None:
    ended = threading.Thread(target=call, daemon=True)
    ended.start()
    ended.join(seconds)
    assert not ended.is_alive(), f"{call.__name__} waited for the writer's linger"


def test_a_flush_queued_while_the_writer_stores_does_not_wait_for_its_next_linger(
    tmp_path: Path,
) -> None:
    """The writer is busy storing a burst when a step and a flush are queued: once done, it
    takes the step and must not sleep a linger before the flush's turn comes."""
    from hermes_agent.storage.writer import WriteBehindSink

    storage = SqlStorage(f"sqlite:///{tmp_path / 'trail.db'}")
    target = storage.audit.target
    storing, go = threading.Event(), threading.Event()

    class Held:
        def write(self, records: Sequence[AuditRecord]) -> None:
            storing.set()
            assert go.wait(20)
            target.write(records)

        def flush(self) -> None:
            target.flush()

    sink = WriteBehindSink(Held())
    sink.LINGER_S, sink.MAX_DELAY_S = 60.0, 120.0
    first = threading.Thread(target=sink.flush, daemon=True)  # returns once step 0 is stored
    second = threading.Thread(target=sink.flush, daemon=True)
    try:
        sink.write([_trail_record(0)])
        first.start()  # wakes the writer out of its first linger: it stores, and is held there
        assert storing.wait(20)
        sink.write([_trail_record(1)])
        second.start()
        # The second flush has queued its turn behind step 1 (a step is a list, a turn is not).
        queued = sink._queue.queue
        wait_for(lambda: queued and not isinstance(queued[-1], list), what="the second flush")
    finally:
        go.set()
    first.join(20)
    second.join(20)
    try:
        assert not first.is_alive() and not second.is_alive(), "a flush waited for a linger"
        assert [r.step for r in storage.records("written-behind")] == [0, 1]
        assert not sink._hurry.is_set()  # no flush left waiting: the next linger is slept
    finally:
        sink.close()
        storage.close()


@pytest.mark.parametrize("ending", ["flush", "close"])
def test_flush_and_close_cut_the_writers_linger_short(tmp_path: Path, ending: str) -> None:
    """A writer sleeping out a long linger is woken by ``flush`` or ``close``, which return
    once what was queued is stored, not once the linger is over."""
    storage = SqlStorage(f"sqlite:///{tmp_path / 'trail.db'}")
    sink = storage.audit
    sink.LINGER_S, sink.MAX_DELAY_S = 60.0, 120.0
    try:
        sink.write([_trail_record(0)])
        wait_for(sink._queue.empty, what="the writer taking step 0 (lingering now)")
        sink.write([_trail_record(1)])
        _ends_within(getattr(sink, ending), 20)
        assert [r.step for r in storage.records("written-behind")] == [0, 1]
        if ending == "flush":
            assert not sink._hurry.is_set()  # the flush was served: the next linger is slept
            # Again, right after a write (the writer may not have run yet).
            for index in range(2, 6):
                sink.write([_trail_record(index)])
                _ends_within(sink.flush, 20)
            assert len(storage.records("written-behind")) == 6
    finally:
        storage.close()
