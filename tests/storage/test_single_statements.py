"""Writes that are one statement each on PostgreSQL, in autocommit (storage.statements).

A queued run's fenced writes (worker.run_writes): a model turn's batch and a completed run's
ending store the whole run in one statement each; a token that lost its lease writes nothing,
also when the takeover is in flight while the statement runs; a row that cannot travel as JSON
is refused before anything is sent, and endings other than an answer go the transaction's way;
a batch retried after its reply was lost stores nothing twice. A turn appended to a session:
one statement, writers of one session taking turns."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event, select, text, update

from hermes_agent.audit.records import AuditRecord
from hermes_agent.runs.request import QueuedRequest
from hermes_agent.storage.schema import audit_table, messages_table, runs_table, sessions_table
from hermes_agent.storage.sql import SqlStorage
from hermes_agent.types import Message, ToolCall
from hermes_agent.worker.store import Batch, LeaseLost, RunStore

pytestmark = pytest.mark.parametrize("url", ["postgresql"], indirect=True)


@pytest.fixture
def store(url: str) -> Iterator[RunStore]:
    storage = SqlStorage(url)
    try:
        yield RunStore(storage)
    finally:
        storage.close()


def record(
    rid: str, session: str, seq: int, role: str = "assistant", **changed: Any
) -> AuditRecord:
    fields: dict[str, Any] = {
        "request_id": rid,
        "session_id": session,
        "step": seq // 4,
        "stage": "ThoughtGenerator",
        "role": role,
        "content": '{"text": "step ' + str(seq) + '"}',
        "timestamp_ns": 1_000 + seq,
        "latency_ms": 1.5,
        "status": "ok",
        "status_code": 200,
        "model_name": "m",
        "system_prompt_sha256": "0" * 64,
        "seq": seq,
    }
    fields.update(changed)
    return AuditRecord(**fields)


TURN = [
    Message("user", "charge 5"),
    Message("assistant", "", tool_calls=[ToolCall("charge", {"n": 5}, id="call_1")]),
    Message("tool", "charged 5"),
    Message("assistant", "done"),
]


def run_once(store: RunStore, session: str, **changed: Any) -> str:
    """A run of one tool call, written as a worker writes it: a model turn's batch, then the
    ending with the rest of its events, its records, its turn and its answer's record."""
    rid = store.add(session, QueuedRequest(message="charge 5"))
    claim = store.claim(rid, "w1", 30.0)
    assert claim.outcome == "claimed"
    first = Batch()
    first.entries["turn/0"] = ("done", {"text": "x"})
    first.entries["call/0/0"] = ("started", {"tool": "charge", "arguments": {"n": 5}})
    first.events.extend([(1, {"kind": "input"}), (2, {"kind": "model"})])
    first.records.extend([record(rid, session, 1, "user"), record(rid, session, 2)])
    store.write_batch(rid, claim.token, first)
    last = Batch()
    last.entries["call/0/0"] = ("done", {"value": "charged 5", "status_code": 200})
    last.events.extend([(3, {"kind": "call_result"}), (4, {"kind": "output"})])
    last.records.extend([record(rid, session, 3, "tool"), record(rid, session, 4, **changed)])
    following = store.finish(
        rid,
        claim.token,
        "completed",
        result={"output": "done"},
        turn=TURN,
        output=record(rid, session, 0, "output"),
        event={"kind": "result"},
        batch=last,
    )
    assert following is None
    return rid


def stored(store: RunStore, rid: str, session: str) -> dict[str, Any]:
    """Everything the run's writes left, its own ids left out."""
    a = audit_table.c
    columns = [c for c in audit_table.c if c.name not in ("id", "request_id", "session_id")]
    with store.storage.transaction() as conn:
        records = conn.execute(select(*columns).where(a.request_id == rid).order_by(a.seq)).all()
        counts = conn.execute(
            select(sessions_table.c.turns, sessions_table.c.messages).where(
                sessions_table.c.id == session
            )
        ).one()
    run = store.get(rid)
    assert run is not None
    return {
        "journal": store.journal_entries(rid),
        "events": store.events(rid),
        "records": [dict(row._mapping) for row in records],
        "session": store.storage.sessions.load(session),
        "counts": tuple(counts),
        "run": (run.status, run.result, run.error, run.lease_owner, run.lease_expires_ns),
        "turn_saved": turn_saved(store, rid),
    }


def turn_saved(store: RunStore, rid: str) -> bool:
    with store.storage.transaction() as conn:
        return bool(
            conn.execute(
                select(runs_table.c.turn_saved).where(runs_table.c.request_id == rid)
            ).scalar_one()
        )


def records_of(store: RunStore, rid: str) -> list[int]:
    """The numbers of the run's trail records, in order."""
    a = audit_table.c
    with store.storage.transaction() as conn:
        return list(
            conn.execute(select(a.seq).where(a.request_id == rid).order_by(a.seq)).scalars()
        )


def wait_for_a_lock(store: RunStore) -> None:
    """Until a backend of the store's database waits for a row lock (the write under test)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with store.storage.engine.connect() as conn:
            waiting = conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        if waiting:
            return
        time.sleep(0.02)  # the polling pace, bounded by the deadline above
    raise AssertionError("no write waited for the run's row")


def statements(storage: SqlStorage, alone: list[bool] | None = None) -> list[str]:
    """The statements the storage's engine sends from now on (appended as they go), and in
    ``alone`` whether each ran in autocommit (a transaction of its own: no BEGIN, no COMMIT).
    Those sent straight on the driver's connection (``storage.driver``, PostgreSQL) are
    counted too: they always run in autocommit (tests/storage/test_direct_statements.py)."""
    sent: list[str] = []

    def count(conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        sent.append(statement)
        if alone is not None:
            alone.append(conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT")

    def direct(statement: str, _params: Any) -> None:
        sent.append(statement)
        if alone is not None:
            alone.append(True)

    event.listen(storage.engine, "before_cursor_execute", count)
    if storage.engine.dialect.name == "postgresql":  # sent straight on psycopg
        storage.driver.observers.append(direct)
    return sent


def test_one_statement_each_stores_the_whole_run(store: RunStore) -> None:
    alone: list[bool] = []
    sent = statements(store.storage, alone)
    # Two runs of a session: the second turn's messages follow the first's.
    one = [run_once(store, "one"), run_once(store, "one")]
    # The submitter's insert, the claim, the batch, the ending: one statement each, and the
    # last three each a transaction of its own.
    assert len(sent) == 2 * 4, sent
    assert alone == [False, True, True, True] * 2
    for rid in one:
        written = stored(store, rid, "one")
        assert written["journal"] == {
            "turn/0": ("done", {"text": "x"}),
            "call/0/0": ("done", {"value": "charged 5", "status_code": 200}),
        }
        assert records_of(store, rid) == [1, 2, 3, 4, 5]  # the answer's after the batch's
        assert [r["role"] for r in written["records"]] == [
            "user", "assistant", "tool", "assistant", "output",
        ]  # fmt: skip
        assert written["turn_saved"] is True
        assert written["run"] == ("completed", {"output": "done"}, None, None, None)
        assert [seq for seq, _ in written["events"]] == [1, 2, 3, 4, 5]
        assert written["events"][-1] == (5, {"kind": "result"})
    assert written["counts"] == (2, 8)
    assert [m.content for m in written["session"]] == [m.content for m in TURN * 2]
    assert written["session"][1].tool_calls == TURN[1].tool_calls


def test_a_token_that_lost_its_lease_writes_nothing(store: RunStore) -> None:
    rid = store.add("s", QueuedRequest(message="charge 5"))
    old = store.claim(rid, "w1", 30.0)
    with store.storage.transaction(write=True) as conn:  # as if w1 died: its lease ran out
        conn.execute(
            update(runs_table).where(runs_table.c.request_id == rid).values(lease_expires_ns=1)
        )
    new = store.claim(rid, "w2", 30.0)
    assert new.outcome == "claimed" and new.token == old.token + 1
    batch = Batch(
        {"turn/0": ("done", {"text": "x"})}, [(1, {"kind": "input"})], [record(rid, "s", 1)]
    )
    sent = statements(store.storage)
    with pytest.raises(LeaseLost):
        store.write_batch(rid, old.token, batch)
    with pytest.raises(LeaseLost):
        store.finish(
            rid,
            old.token,
            "completed",
            result={"output": "stale"},
            turn=TURN,
            output=record(rid, "s", 0, "output"),
            event={"kind": "result"},
            batch=batch,
        )
    assert len(sent) == 2  # the one statement each said so: no second way was tried
    assert store.journal_entries(rid) == {} and store.events(rid) == []
    assert records_of(store, rid) == []  # neither the batch's records nor the answer's
    assert store.storage.sessions.load("s") == []
    run = store.get(rid)
    assert run is not None and run.status == "running" and run.lease_owner == "w2"
    assert run.result is None


@pytest.mark.parametrize("takeover", ["committed", "rolled back"])
def test_a_write_waits_for_a_takeover_in_flight(store: RunStore, takeover: str) -> None:
    """Another transaction holds the run's row, taking the lease over: the write waits for
    it, then writes nothing if the takeover committed, and its rows if it rolled back."""
    rid = store.add("s", QueuedRequest(message="charge 5"))
    claim = store.claim(rid, "w1", 30.0)
    batch = Batch(
        {"turn/0": ("done", {"text": "x"})}, [(1, {"kind": "input"})], [record(rid, "s", 1)]
    )
    outcome: list[Any] = []

    def write() -> None:
        try:
            store.write_batch(rid, claim.token, batch)
            outcome.append("written")
        except LeaseLost as exc:
            outcome.append(exc)

    with store.storage.engine.connect() as other:
        other.execute(
            text("UPDATE hermes_runs SET lease_token = lease_token + 1 WHERE request_id = :r"),
            {"r": rid},
        )  # its transaction stays open: the row is locked
        writer = threading.Thread(target=write)
        writer.start()
        wait_for_a_lock(store)
        assert writer.is_alive() and outcome == []  # waiting for the row
        other.commit() if takeover == "committed" else other.rollback()
        writer.join(10)
    assert not writer.is_alive()
    if takeover == "committed":
        assert isinstance(outcome[0], LeaseLost)
        assert store.journal_entries(rid) == {} and store.events(rid) == []
    else:
        assert outcome == ["written"]
        assert store.events(rid) == [(1, {"kind": "input"})]


def test_an_ending_waits_for_its_own_heartbeat_and_then_ends_the_run(store: RunStore) -> None:
    """The lease's heartbeat (same token) holds the run's row when the ending comes: the
    ending waits for it, reads the row again as the heartbeat left it, and ends the run."""
    rid = store.add("s", QueuedRequest(message="charge 5"))
    claim = store.claim(rid, "w1", 30.0)
    outcome: list[Any] = []

    def finish() -> None:
        outcome.append(
            store.finish(
                rid,
                claim.token,
                "completed",
                result={"output": "done"},
                turn=TURN,
                output=record(rid, "s", 0, "output"),
                event={"kind": "result"},
            )
        )

    with store.storage.engine.connect() as heartbeat:
        heartbeat.execute(
            update(runs_table)
            .where(runs_table.c.request_id == rid)
            .values(heartbeat_ns=time.time_ns(), lease_expires_ns=time.time_ns() + 10**10)
        )
        ending = threading.Thread(target=finish)
        ending.start()
        wait_for_a_lock(store)
        heartbeat.commit()
        ending.join(10)
    assert outcome == [None]
    run = store.get(rid)
    assert run is not None and run.status == "completed" and run.lease_expires_ns is None
    assert [m.content for m in store.storage.sessions.load("s")] == [m.content for m in TURN]


def test_a_batch_retried_after_its_reply_was_lost_stores_nothing_twice(store: RunStore) -> None:
    """In autocommit a statement whose reply was lost may have committed: the attempt retries
    the same batch, which must neither fail nor store a row twice; a retried ending finds the
    run ended."""
    rid = store.add("s", QueuedRequest(message="charge 5"))
    claim = store.claim(rid, "w1", 30.0)
    batch = Batch(
        {"call/0/0": ("started", {"tool": "charge"})},
        [(1, {"kind": "input"}), (2, {"kind": "model"})],
        [record(rid, "s", 0), record(rid, "s", 1)],
    )
    store.write_batch(rid, claim.token, batch)
    store.write_batch(rid, claim.token, batch)  # the retry
    records_only = Batch(records=[record(rid, "s", 2)])  # a batch with no event to collide on
    store.write_batch(rid, claim.token, records_only)
    store.write_batch(rid, claim.token, records_only)
    assert [seq for seq, _ in store.events(rid)] == [1, 2]
    assert records_of(store, rid) == [0, 1, 2]
    ending = {
        "result": {"output": "done"},
        "turn": TURN,
        "output": record(rid, "s", 0, "output"),
        "event": {"kind": "result"},
    }
    store.finish(rid, claim.token, "completed", **ending)
    with pytest.raises(LeaseLost):
        store.finish(rid, claim.token, "completed", **ending)
    assert records_of(store, rid) == [0, 1, 2, 3]
    assert [seq for seq, _ in store.events(rid)] == [1, 2, 3]
    assert len(store.storage.sessions.load("s")) == 4


def test_an_ending_with_its_turn_saved_an_event_alone_and_a_parked_follower(
    store: RunStore,
) -> None:
    first = store.add("s", QueuedRequest(message="one"))
    second = store.add("s", QueuedRequest(message="two"))
    claim = store.claim(first, "w1", 30.0)
    assert store.claim(second, "w2", 30.0).outcome == "parked"
    store.save_turn(first, claim.token, "s", TURN)  # an earlier attempt saved the turn
    store.write_batch(first, claim.token, Batch(events=[(1, {"kind": "input"})]))
    sent = statements(store.storage)
    following = store.finish(
        first,
        claim.token,
        "completed",
        result={"output": "done"},
        turn=TURN,
        output=record(first, "s", 3, "output"),
        event={"kind": "result"},
    )
    assert len(sent) == 1
    assert following == second  # handed over in the same statement
    assert len(store.storage.sessions.load("s")) == 4  # not saved twice
    assert store.events(first) == [(1, {"kind": "input"}), (2, {"kind": "result"})]
    run = store.get(first)
    assert run is not None and run.status == "completed" and run.result == {"output": "done"}


def test_a_row_that_cannot_travel_as_json_is_refused_and_a_failed_ending_is_one_statement(
    store: RunStore,
) -> None:
    # Every row a run writes travels as JSON (its text is made storable before it reaches the
    # store): one that does not is a defect, refused before anything is sent, never written
    # another way. A fraction for an integer column is what no parameter would store either.
    sent = statements(store.storage)
    with pytest.raises(ValueError, match="cannot travel as JSON"):
        run_once(store, "s", step=1.5)
    assert not [s for s in sent if "AS following" in s]  # the ending was never sent

    failed = store.add("t", QueuedRequest(message="charge 5"))
    claim = store.claim(failed, "w1", 30.0)
    del sent[:]
    store.write_batch(failed, claim.token, Batch(records=[record(failed, "t", 0)]))
    del sent[:]
    last = Batch(events=[(1, {"kind": "input"})], records=[record(failed, "t", 1, step=3)])
    store.finish(failed, claim.token, "failed", error="the model failed", batch=last)
    assert len(sent) == 1 and sent[0].lstrip().startswith("WITH")
    run = store.get(failed)
    assert run is not None and run.status == "failed" and run.error == "the model failed"
    assert [wire["kind"] for _, wire in store.events(failed)] == ["input", "run_stopped"]
    trail = store.storage.records(failed)
    assert [(r.seq, r.role, r.step) for r in trail] == [
        (0, "assistant", 0), (1, "assistant", 3), (2, "stopped", 3),
    ]  # fmt: skip
    assert trail[-1].session_id == "t" and trail[-1].model_name == "m"
    assert trail[-1].status_code == 500 and '"the model failed"' in trail[-1].content


def test_a_turn_appended_to_a_session_is_one_statement_and_writers_take_turns(
    store: RunStore,
) -> None:
    """The service's append (SqlSessionStore.append): one statement in autocommit, and two
    threads appending to one session at once place every turn whole, after the other's."""
    storage = store.storage
    alone: list[bool] = []
    sent = statements(storage, alone)
    storage.sessions.append("chat", [Message("user", "hi"), Message("assistant", "hello")])
    assert len(sent) == 1 and alone == [True]

    def append_turns(writer: str) -> None:
        for n in range(20):
            turn = [Message("user", f"{writer}{n} asks"), Message("assistant", f"{writer}{n} says")]
            storage.sessions.append("chat", turn)

    writers = [threading.Thread(target=append_turns, args=(w,)) for w in "ab"]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(30)
    history = storage.sessions.load("chat")
    assert len(history) == 82
    for asks, says in zip(history[2::2], history[3::2], strict=True):
        assert asks.content.removesuffix(" asks") == says.content.removesuffix(" says")
    with storage.transaction() as conn:
        counts = conn.execute(
            select(sessions_table.c.turns, sessions_table.c.messages).where(
                sessions_table.c.id == "chat"
            )
        ).one()
        positions = conn.execute(
            select(messages_table.c.position)
            .where(messages_table.c.session_id == "chat")
            .order_by(messages_table.c.position)
        ).scalars()
        assert list(positions) == list(range(82))  # each turn right after the last
    assert tuple(counts) == (41, 82)
