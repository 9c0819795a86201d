"""Durable runs in one process, without a broker: the run store, the journal, leases and
fencing, takeover and resume, exactly-once tool calls, approvals that free the worker, the dead
letter and the operator's requeue. (tests/worker/test_worker_scale.py runs the same with real Celery
workers, Redis or RabbitMQ, and a SIGKILL.)"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from hermes_agent import Agent, ScriptedModel
from hermes_agent.models.base import ModelSettings
from hermes_agent.pipeline.journal import CallKey
from hermes_agent.runs.request import QueuedRequest
from hermes_agent.storage.sql import SqlStorage
from hermes_agent.tools.registry import Tool
from hermes_agent.types import Message
from hermes_agent.worker.journal import StoreJournal, response_to_json
from hermes_agent.worker.runner import RunWorker
from hermes_agent.worker.store import LeaseLost, RunStore
from worker_harness import Ledger, call, expire
from worker_harness import charge_script as script


@pytest.fixture
def ledger() -> Ledger:
    return Ledger()


def make_agent(url: str, ledger: Ledger, **tool_settings: Any) -> tuple[Agent, ScriptedModel]:
    model = ScriptedModel(script)
    agent = Agent(model, storage=url, tools=[Tool.from_function(ledger.charge, **tool_settings)])
    return agent, model


def setup(
    url: str, ledger: Ledger, cleanup: list[Any], lease_ttl: float = 5.0, **tool_settings: Any
) -> tuple[Agent, ScriptedModel, RunStore, RunWorker, list[str]]:
    agent, model = make_agent(url, ledger, **tool_settings)
    assert isinstance(agent.storage, SqlStorage)
    store = RunStore(agent.storage, max_redeliveries=1)
    sent: list[str] = []
    worker = RunWorker(agent, store, sent.append, name="test:1", lease_ttl=lease_ttl)
    cleanup.extend([agent, worker])
    return agent, model, store, worker, sent


def test_a_queued_run_completes_with_its_events_journal_and_turn(
    url: str, ledger: Ledger, cleanup: list[Any]
) -> None:
    agent, model, store, worker, _ = setup(url, ledger, cleanup)
    rid = store.add("s1", QueuedRequest(message="charge 5"))
    assert worker.execute(rid) == "completed"
    run = store.get(rid)
    assert run is not None and run.status == "completed" and run.claims == 1
    assert run.result is not None
    assert (
        run.result["output"] == 'answer: {"status": "success", "data": "charged 5", "error": null}'
    )
    assert ledger.calls == [f"{rid}/0/0"]  # the tool saw its stable call id
    kinds = [wire["kind"] for _, wire in store.events(rid)]
    assert kinds[0] == "input" and kinds[-1] == "result"
    journal = store.journal_entries(rid)
    assert set(journal) == {"turn/0", "turn/1", "call/0/0"}
    assert journal["call/0/0"] == (
        "done",
        {"value": "charged 5", "status_code": 200, "error": None},
    )
    history = agent.sessions.load("s1")
    assert [m.role for m in history] == ["user", "assistant", "tool", "assistant"]
    assert worker.execute(rid) == "finished"  # a second delivery does nothing
    assert len(model.requests) == 2 and ledger.calls == [f"{rid}/0/0"]


def test_a_queued_run_waits_on_postgresql_3_times_not_16(
    url: str, ledger: Ledger, cleanup: list[Any], tmp_path: Path
) -> None:
    """What a run's store calls cost is mostly their round trips: on PostgreSQL a run of one
    tool call that starts its session waits for the server 3 times, once for each of its
    claim, its model turn's batch and its ending (16 before the batch and the ending were
    one statement each, storage.statements; 17 before the ending's
    update said which run of the session is next, 18 before the claim said whether the
    session holds any message, 26 before pooled connections were pinged only when
    their socket spoke and single statements ran in autocommit), counted in libpq's own trace
    of every connection: each simple query and each sync the worker sends is one wait. The
    first seven runs are not counted: a statement's fifth execution on a connection prepares
    it (psycopg), which costs one more wait, once."""
    if not url.startswith("postgresql"):
        pytest.skip("round trips are PostgreSQL's (SQLite is in process)")
    from sqlalchemy import event

    path = tmp_path / "libpq.trace"
    trace = path.open("w")
    cleanup.append(trace)  # closed last, after the traced connections
    # A long lease: no heartbeat (a transaction of its own) during the runs.
    agent, _, store, worker, _ = setup(url, ledger, cleanup, lease_ttl=60.0, idempotent=True)
    assert isinstance(agent.storage, SqlStorage)
    engine = agent.storage.engine

    def traced(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.pgconn.trace(trace.fileno())

    event.listen(engine, "connect", traced)
    engine.dispose()  # every connection from here on is traced
    waits: list[int] = []
    try:
        for n in range(10):
            rid = store.add(f"s{n}", QueuedRequest(message="charge 5"))
            start = path.stat().st_size  # libpq writes (and flushes) each message itself
            assert worker.execute(rid) == "completed"
            with path.open() as written:
                written.seek(start)
                sent = written.read().splitlines()
            kinds = [line.split("\t")[3] for line in sent if "\tF\t" in line]
            waits.append(sum(1 for kind in kinds if kind in ("Query", "Sync")))
            texts = "\n".join(sent)
            assert 'Query\t ";"' not in texts  # no pings (SQLAlchemy's is an empty query)
        counted = waits[-3:]  # its statements prepared by now
        assert counted == [3, 3, 3], f"round trips per run: {waits}"
    finally:
        event.remove(engine, "connect", traced)
        engine.dispose()  # the traced connections go while their trace file is open


def test_a_runs_ending_is_one_transaction_of_a_few_statements_that_numbers_everything_in_order(
    url: str, ledger: Ledger, cleanup: list[Any]
) -> None:
    """The ending (the last batch, the turn in its session, the run's row, the answer's record
    and the last event) is one transaction of eight statements on SQLite, and one statement of
    eight parts on PostgreSQL (storage.statements); the session's counters, the trail's
    numbers and the events' come out as if written one by one."""
    from sqlalchemy import event, select

    from hermes_agent.storage.schema import audit_table, sessions_table

    agent, _, store, worker, _ = setup(url, ledger, cleanup)
    assert isinstance(agent.storage, SqlStorage)
    agent.sessions.append("s1", [Message("user", "before"), Message("assistant", "hi")])
    # Per connection (the lease's heartbeat writes from a thread of its own): each
    # transaction's statements, in order.
    transactions: list[tuple[int, list[str]]] = []
    sent: list[int] = []  # each transaction's number of statements

    def began(conn: Any) -> None:
        transactions.append((id(conn), []))
        sent.append(0)

    def executed(conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        plumbing = statement.lstrip().upper().startswith(("BEGIN", "SELECT 1", "PRAGMA"))
        mine = [n for n, (owner, _) in enumerate(transactions) if owner == id(conn)]
        if mine and not plumbing:
            transactions[mine[-1]][1].extend(_shapes(statement))
            sent[mine[-1]] += 1

    def direct(statement: str, _params: Any) -> None:
        # Sent straight on the driver's connection (PostgreSQL): a transaction of its own.
        transactions.append((0, list(_shapes(statement))))
        sent.append(1)

    engine = agent.storage.engine
    event.listen(engine, "begin", began)
    event.listen(engine, "before_cursor_execute", executed)
    if agent.storage.engine.dialect.name == "postgresql":  # sent straight on psycopg
        agent.storage.driver.observers.append(direct)
    try:
        rid = store.add("s1", QueuedRequest(message="charge 5"))
        assert worker.execute(rid) == "completed"
    finally:
        event.remove(engine, "begin", began)
        event.remove(engine, "before_cursor_execute", executed)
        if direct in agent.storage.driver.observers:
            agent.storage.driver.observers.remove(direct)
    endings = [
        n
        for n, (_, t) in enumerate(transactions)
        if "UPDATE hermes_runs" in t and "INSERT sessions" in t
    ]
    assert len(endings) == 1, transactions
    ending = transactions[endings[0]][1]
    if url.startswith("postgresql"):
        assert sent[endings[0]] == 1
        assert ending == [
            "SELECT hermes_runs",  # the fence (FOR UPDATE): still this attempt's
            "INSERT hermes_run_journal",  # the batch: journal entries, events, trail records
            "INSERT hermes_run_events",  # (the ending's event among them)
            "INSERT audit_records",
            "INSERT audit_records",  # the answer's record, numbered after the trail
            "INSERT sessions",  # the session created or counted in, where the turn starts
            "INSERT messages",
            "UPDATE hermes_runs",  # returning the session's next run if it is parked
        ]
    else:
        assert sent[endings[0]] == 8
        assert ending == [
            "SELECT hermes_runs",  # the fence: still this attempt's
            "INSERT hermes_run_journal",  # the batch: journal entries, events, trail records
            "INSERT hermes_run_events",  # (the ending's event among them)
            "INSERT audit_records",
            "INSERT sessions",  # the session created or counted in, where the turn starts
            "INSERT messages",
            "INSERT audit_records",  # the answer's record, numbered after the trail
            "UPDATE hermes_runs",  # last: returning the session's next run if it is parked
        ]

    history = agent.sessions.load("s1")
    assert [m.role for m in history] == ["user", "assistant"] * 2 + ["tool", "assistant"]
    assert [m.content for m in history][:3] == ["before", "hi", "charge 5"]
    with agent.storage.transaction() as conn:
        counted = conn.execute(
            select(sessions_table.c.messages, sessions_table.c.turns).where(
                sessions_table.c.id == "s1"
            )
        ).one()
        trail = [
            row.role
            for row in conn.execute(
                select(audit_table.c.role, audit_table.c.seq)
                .where(audit_table.c.request_id == rid)
                .order_by(audit_table.c.seq)
            )
        ]
    assert tuple(counted) == (6, 2)
    assert trail[-1] == "output" and trail.count("output") == 1
    seqs = [seq for seq, _ in store.events(rid)]
    assert seqs == list(range(1, len(seqs) + 1))
    assert store.events(rid)[-1][1]["kind"] == "result"


def _shapes(statement: str) -> list[str]:
    """``SELECT|INSERT|UPDATE <table>`` of a SQL statement, or of each part of a ``WITH``
    statement (its main ``SELECT`` left out)."""
    if statement.lstrip().upper().startswith("WITH "):
        parts = re.findall(
            r"\w+ AS \(((?:SELECT|INSERT|UPDATE)\b.*?)(?=\), \w+ AS \(|\) SELECT)", statement
        )
        return [_shape(part) for part in parts]
    return [_shape(statement)]


def _shape(statement: str) -> str:
    """``SELECT|INSERT|UPDATE <table>`` of a SQL statement."""
    words = statement.split()
    verb = words[0].upper()
    if verb == "INSERT":
        table = words[2]
    elif verb == "UPDATE":
        table = words[1]
    else:
        table = words[[w.upper() for w in words].index("FROM") + 1]
    return f"{verb} {table}"


def _died_mid_call(store: RunStore, rid: str, *, finished: bool) -> None:
    """An earlier attempt: claimed, asked the model (a call of charge), started the call —
    and finished it or not — then died."""
    claim = store.claim(rid, "dead:1", 5.0)
    assert claim.outcome == "claimed"
    first = ScriptedModel([call("charge", cents=7)])
    response = asyncio.run(first.complete([Message("user", "charge 7")], [], ModelSettings()))
    store.write_journal(rid, claim.token, "turn/0", "done", response_to_json(response))
    store.write_journal(rid, claim.token, "call/0/0", "started", {"tool": "charge"})
    if finished:
        outcome = {"value": "charged 7 earlier", "status_code": 200, "error": None}
        store.write_journal(rid, claim.token, "call/0/0", "done", outcome)
    expire(store, rid)


def test_a_call_that_started_and_never_finished_is_reported_interrupted(
    url: str, ledger: Ledger, cleanup: list[Any]
) -> None:
    agent, model, store, worker, _ = setup(url, ledger, cleanup)
    rid = store.add("s1", QueuedRequest(message="charge 7"))
    _died_mid_call(store, rid, finished=False)
    assert worker.execute(rid) == "completed"
    assert ledger.calls == []  # not run again: it may have taken effect
    assert len(model.requests) == 1  # turn 0 came from the journal
    run = store.get(rid)
    assert run is not None and run.claims == 2 and run.redeliveries == 1
    assert run.result is not None
    record = run.result["tool_calls"][0]
    assert record["status_code"] == 500 and record["metadata"]["journal"] == "interrupted"
    assert "interrupted" in record["error"] and "idempotent" in record["error"]
    assert "interrupted" in run.result["output"]  # the model was told
    storage = agent.storage
    assert storage is not None
    resumed = [r for r in storage.records(rid) if r.role == "resumed"]
    assert len(resumed) == 1
    mark = json.loads(resumed[0].content)
    assert mark["takeover"] is True and mark["attempt"] == 2 and mark["worker"] == "test:1"


def test_an_idempotent_call_that_never_finished_runs_again(
    url: str, ledger: Ledger, cleanup: list[Any]
) -> None:
    _, _, store, worker, _ = setup(url, ledger, cleanup, idempotent=True)
    rid = store.add("s1", QueuedRequest(message="charge 7"))
    _died_mid_call(store, rid, finished=False)
    assert worker.execute(rid) == "completed"
    assert ledger.calls == [f"{rid}/0/0"]  # the same call id both times
    run = store.get(rid)
    assert run is not None and run.result is not None
    assert run.result["tool_calls"][0]["status_code"] == 200


def test_a_recorded_result_is_reused_not_run_again(
    url: str, ledger: Ledger, cleanup: list[Any]
) -> None:
    _, model, store, worker, _ = setup(url, ledger, cleanup)
    rid = store.add("s1", QueuedRequest(message="charge 7"))
    _died_mid_call(store, rid, finished=True)
    assert worker.execute(rid) == "completed"
    assert ledger.calls == [] and len(model.requests) == 1
    run = store.get(rid)
    assert run is not None and run.result is not None
    assert run.result["tool_calls"][0]["metadata"]["journal"] == "recorded"
    assert "charged 7 earlier" in run.result["output"]


def test_a_worker_whose_lease_passed_on_writes_nothing(
    url: str, ledger: Ledger, cleanup: list[Any]
) -> None:
    _, _, store, _, _ = setup(url, ledger, cleanup)
    rid = store.add("s1", QueuedRequest(message="charge 1"))
    first = store.claim(rid, "a:1", 5.0)
    expire(store, rid)
    second = store.claim(rid, "b:2", 5.0)
    assert (first.outcome, second.outcome) == ("claimed", "claimed")
    assert second.token == first.token + 1
    assert store.heartbeat(rid, first.token, 5.0) is False
    with pytest.raises(LeaseLost):
        store.write_journal(rid, first.token, "turn/0", "done", {})
    journal = StoreJournal(store, rid, first.token)
    with pytest.raises(asyncio.CancelledError):  # the run stops, whatever stage it is in
        asyncio.run(journal.call_started(CallKey(rid, 0, 0), "charge", {}, False))
    assert journal.holds() is False
    assert store.heartbeat(rid, second.token, 5.0) is True


def test_a_second_copy_of_a_live_run_stops_at_once(
    url: str, ledger: Ledger, cleanup: list[Any]
) -> None:
    _, model, store, worker, _ = setup(url, ledger, cleanup, lease_ttl=3.0)
    rid = store.add("s1", QueuedRequest(message="charge 1"))
    holder = store.claim(rid, "alive:1", 3.0)
    beating = threading.Event()

    def beat() -> None:
        while not beating.wait(0.2):
            store.heartbeat(rid, holder.token, 3.0)

    thread = threading.Thread(target=beat)
    thread.start()
    try:
        started = time.monotonic()
        assert worker.execute(rid) == "busy"
        assert time.monotonic() - started < 1.5  # well within the 3 s lease
    finally:
        beating.set()
        thread.join()
    assert model.requests == [] and ledger.calls == []


def test_a_run_lost_too_often_is_dead_lettered_and_requeued_by_an_operator(
    url: str, ledger: Ledger, cleanup: list[Any]
) -> None:
    agent, _, store, worker, _ = setup(url, ledger, cleanup)  # max_redeliveries=1
    rid = store.add("s1", QueuedRequest(message="charge 2"))
    for attempt in range(2):
        assert store.claim(rid, f"w:{attempt}", 5.0).outcome == "claimed"
        expire(store, rid)
    assert worker.execute(rid) == "dead"
    run = store.get(rid)
    assert run is not None and run.status == "dead" and "dead-lettered" in (run.error or "")
    assert store.events(rid)[-1][1] == {"kind": "run_stopped", "status": "dead", "error": run.error}
    assert agent.storage is not None
    last = agent.storage.records(rid)[-1]
    assert (last.role, last.status_code) == ("stopped", 503)
    assert [r.request_id for r in store.runs(status="dead")] == [rid]
    store.requeue(rid)
    assert worker.execute(rid) == "completed"
    assert ledger.calls == [f"{rid}/0/0"]


def test_an_approval_frees_the_worker_and_the_answer_resumes_the_run(
    url: str, ledger: Ledger, cleanup: list[Any]
) -> None:
    _, model, store, worker, sent = setup(url, ledger, cleanup, requires_approval=True)
    rid = store.add("s1", QueuedRequest(message="charge 9"))
    assert worker.execute(rid) == "waiting_approval"
    assert store.get(rid).status == "waiting_approval"  # type: ignore[union-attr]
    pending = store.pending_approvals(rid)
    assert [(p["tool"], p["arguments"]) for p in pending] == [("charge", {"cents": 9})]
    assert store.events(rid)[-1][1]["kind"] == "approval_required"
    assert worker.execute(rid) == "waiting"  # a stray delivery does not run it
    assert ledger.calls == []
    # A later run of the same session waits for it.
    later = store.add("s1", QueuedRequest(message="charge 1"))
    assert worker.execute(later) == "parked"
    assert store.decide(rid, pending[0]["approval_id"], True, "ok by ops")
    assert worker.execute(rid) == "completed"
    assert ledger.calls == [f"{rid}/0/0"]
    assert len(model.requests) == 2  # the turn that asked was not asked again
    run = store.get(rid)
    assert run is not None and run.result is not None
    assert run.result["approvals"][0]["approved"] is True
    assert run.result["approvals"][0]["reason"] == "ok by ops"
    assert sent == [later]  # its end handed the session to the run that waited


def test_a_denied_approval_reaches_the_model(url: str, ledger: Ledger, cleanup: list[Any]) -> None:
    _, _, store, worker, _ = setup(url, ledger, cleanup, requires_approval=True)
    rid = store.add("s1", QueuedRequest(message="charge 9"))
    assert worker.execute(rid) == "waiting_approval"
    key = store.pending_approvals(rid)[0]["approval_id"]
    assert store.decide(rid, key, False, "too much") is True
    assert store.decide(rid, key, True, "changed my mind") is False  # single use
    assert worker.execute(rid) == "completed"
    assert ledger.calls == []
    run = store.get(rid)
    assert run is not None and run.result is not None
    assert run.result["tool_calls"][0]["status_code"] == 403
    assert "too much" in run.result["output"]


def test_runs_of_one_session_take_turns_and_hand_over(
    url: str, ledger: Ledger, cleanup: list[Any]
) -> None:
    agent, _, store, worker, sent = setup(url, ledger, cleanup)
    first = store.add("s1", QueuedRequest(message="charge 1"))
    second = store.add("s1", QueuedRequest(message="charge 2"))
    other = store.add("s2", QueuedRequest(message="charge 3"))
    assert worker.execute(second) == "parked"
    assert worker.execute(other) == "completed"  # another session is not held up
    assert sent == []
    assert worker.execute(first) == "completed"
    assert sent == [second]  # the first's end handed the session on
    assert worker.execute(second) == "completed"
    users = [m.content for m in agent.sessions.load("s1") if m.role == "user"]
    assert users == ["charge 1", "charge 2"]


def test_a_run_that_starts_its_session_reads_no_history_and_the_next_run_reads_it(
    url: str, ledger: Ledger, cleanup: list[Any]
) -> None:
    """The claim says whether the run's session holds any message: a run that starts a session
    skips the read of its history (one transaction fewer); the next run of the session reads
    it. Another session's messages do not count."""
    from sqlalchemy import event

    agent, model, store, worker, _ = setup(url, ledger, cleanup)
    assert isinstance(agent.storage, SqlStorage)
    assert worker.execute(store.add("other", QueuedRequest(message="charge 9"))) == "completed"
    reads: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "FROM messages" in statement:
            reads.append(statement)

    event.listen(agent.storage.engine, "before_cursor_execute", seen)
    try:
        assert worker.execute(store.add("s1", QueuedRequest(message="charge 1"))) == "completed"
        assert reads == []
        assert worker.execute(store.add("s1", QueuedRequest(message="charge 2"))) == "completed"
        assert len(reads) == 1
    finally:
        event.remove(agent.storage.engine, "before_cursor_execute", seen)
    users = [str(m.content) for m in model.requests[-1].messages if m.role == "user"]
    assert users == ["charge 1", "charge 2"]  # the second run saw the first's turn
    assert not any("charge 9" in str(m.content) for m in model.requests[2].messages)


def test_a_delivery_never_claimed_is_swept_back(
    url: str, ledger: Ledger, cleanup: list[Any]
) -> None:
    _, _, store, worker, sent = setup(url, ledger, cleanup, lease_ttl=0.1)
    rid = store.add("s1", QueuedRequest(message="charge 1"))
    store.mark_delivered(rid)
    assert worker.sweep() == []  # not yet: its worker may still take it
    time.sleep(0.35)  # a measured spell: past the 0.1 s lease, and the sweep's own delay
    assert worker.sweep() == [rid] and sent == [rid]
    assert worker.sweep() == []  # once per lease, not on every pass
    running = store.add("s2", QueuedRequest(message="charge 2"))
    store.claim(running, "gone:1", 0.1)
    time.sleep(0.15)  # a measured spell: the claim's 0.1 s lease runs out
    assert running in worker.sweep()  # a run whose worker died
    # A delivery lost without a trace (never noted as received): sent again after ten leases.
    forgotten = store.add("s3", QueuedRequest(message="charge 3"))
    assert forgotten not in worker.sweep()
    time.sleep(1.1)  # a measured spell: ten leases of 0.1 s
    assert forgotten in worker.sweep()


def test_cancelling_a_running_run_stops_it_at_the_next_heartbeat(
    url: str, cleanup: list[Any]
) -> None:
    release, running = threading.Event(), threading.Event()

    def slow(seconds: float) -> str:
        """Wait.

        Args:
            seconds: how long.
        """
        running.set()
        release.wait(seconds)
        return "slept"

    model = ScriptedModel([call("slow", seconds=10), "never"])
    agent = Agent(model, storage=url, tools=[slow])
    assert isinstance(agent.storage, SqlStorage)
    store = RunStore(agent.storage)
    worker = RunWorker(agent, store, lambda _: None, name="t:1", lease_ttl=0.3)
    cleanup.extend([agent, worker])
    rid = store.add("s1", QueuedRequest(message="sleep"))
    outcome: list[str] = []
    thread = threading.Thread(target=lambda: outcome.append(worker.execute(rid)))
    thread.start()
    assert running.wait(10), "the run's tool never started"
    assert store.cancel(rid, "stop it")
    thread.join(timeout=5)
    release.set()
    assert outcome == ["cancelled"]
    assert store.get(rid).status == "cancelled"  # type: ignore[union-attr]
    assert store.events(rid)[-1][1] == {
        "kind": "run_stopped",
        "status": "cancelled",
        "error": "stop it",
    }
    assert agent.storage is not None
    last = agent.storage.records(rid)[-1]
    assert (last.role, last.status_code, json.loads(last.content)["status"]) == (
        "stopped",
        409,
        "cancelled",
    )
    assert agent.storage.requests()[0]["status"] == "stopped"


def test_a_queued_run_joins_the_submitters_trace(tmp_path: Path, cleanup: list[Any]) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from hermes_agent.tracing import instrument, outgoing_context

    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    agent, _, store, worker, _ = setup(f"sqlite:///{tmp_path / 's.db'}", Ledger(), cleanup)
    instrument(agent, tracer_provider=provider)
    with provider.get_tracer("client").start_as_current_span("submit") as submitting:
        # The submitter passes its trace context with the request (QueueClient.submit does).
        rid = store.add("s1", QueuedRequest(message="charge 3", trace_context=outgoing_context()))
    assert store.get(rid).request["trace_context"]["traceparent"]  # type: ignore[union-attr]
    assert worker.execute(rid) == "completed"
    spans = memory.get_finished_spans()
    run_span = next(s for s in spans if s.name.startswith("invoke_agent"))
    assert run_span.context.trace_id == submitting.get_span_context().trace_id
    assert run_span.parent is not None
    assert run_span.parent.span_id == submitting.get_span_context().span_id
    assert any(s.name == "execute_tool charge" for s in spans)


def test_an_attempt_overtaken_mid_call_stops_and_leaves_the_run_to_the_new_owner(
    url: str, cleanup: list[Any]
) -> None:
    inside = threading.Event()
    release = threading.Event()
    runs: list[int] = []

    def pay(cents: int) -> str:
        """Pay.

        Args:
            cents: the amount.
        """
        runs.append(cents)
        inside.set()
        release.wait(10)
        return f"paid {cents}"

    model = ScriptedModel([call("pay", cents=4), "paid"])
    agent = Agent(model, storage=url, tools=[pay])
    assert isinstance(agent.storage, SqlStorage)
    store = RunStore(agent.storage)
    worker = RunWorker(agent, store, lambda _: None, name="slow:1", lease_ttl=30.0)
    cleanup.extend([agent, worker])
    rid = store.add("s1", QueuedRequest(message="pay 4"))
    outcome: list[str] = []
    thread = threading.Thread(target=lambda: outcome.append(worker.execute(rid)))
    thread.start()
    assert inside.wait(10)
    expire(store, rid)  # as if its heartbeats had stopped reaching the store
    taken = store.claim(rid, "new:2", 30.0)
    assert taken.outcome == "claimed" and taken.resumed
    release.set()
    thread.join(timeout=10)
    assert outcome == ["lease_lost"]
    # The overtaken attempt recorded nothing after the takeover: no outcome of its call, no
    # answer, no turn in the session, no result event.
    assert store.journal_entries(rid)["call/0/0"][0] == "started"
    assert agent.sessions.load("s1") == []
    assert all(wire["kind"] != "result" for _, wire in store.events(rid))
    assert all(r.role != "output" for r in agent.storage.records(rid))
    assert store.get(rid).lease_owner == "new:2"  # type: ignore[union-attr]
    assert len(model.requests) == 1 and runs == [4]


def test_answers_and_cancels_without_a_worker_end_up_in_the_runs_log(
    url: str, ledger: Ledger, cleanup: list[Any]
) -> None:
    _, _, store, worker, _ = setup(url, ledger, cleanup, requires_approval=True)
    rid = store.add("s1", QueuedRequest(message="charge 9"))
    assert worker.execute(rid) == "waiting_approval"
    pending = store.pending_approvals(rid)[0]
    assert pending["asked_ns"] > 0
    assert store.decide(rid, pending["approval_id"], False, "no")
    assert store.events(rid)[-1][1] == {
        "kind": "approval_resolved",
        "approval_id": pending["approval_id"],
        "approved": False,
        "reason": "no",
    }
    assert worker.execute(rid) == "completed"
    kinds = [wire["kind"] for _, wire in store.events(rid)]
    assert kinds.count("input") == 1 and kinds[-1] == "result"  # the replay said nothing twice
    queued = store.add("s2", QueuedRequest(message="charge 1"))
    assert store.cancel(queued, "changed my mind")
    assert store.events(queued) == [
        (1, {"kind": "run_stopped", "status": "cancelled", "error": "changed my mind"})
    ]
    assert worker.execute(queued) == "finished" and ledger.calls == []


def test_a_run_the_broker_refuses_is_not_left_queued(tmp_path: Path) -> None:
    from hermes_agent.config import QueueConfig
    from hermes_agent.errors import HermesAgentError
    from hermes_agent.worker.client import QueueClient

    storage = SqlStorage(f"sqlite:///{tmp_path / 'q.db'}")
    try:
        client = QueueClient(QueueConfig(broker="redis://127.0.0.1:1/0"), storage)
        client.app.conf.broker_connection_timeout = 1
        client.app.conf.task_publish_retry = False
        with pytest.raises(HermesAgentError, match="the broker refused the run"):
            client.submit("hello", session_id="s1")
        (run,) = client.store.runs()
        assert run.status == "cancelled" and "broker refused" in (run.error or "")
    finally:
        storage.close()


def test_a_journaled_turn_keeps_its_thought_and_its_untyped_xml_arguments() -> None:
    from hermes_agent.types import Completion, ModelResponse, ToolCall, Usage
    from hermes_agent.worker.journal import response_from_json

    completion = Completion(
        content="",
        tool_calls=[ToolCall("charge", {"cents": "5"}, "c1", text_arguments=True)],
        thought="Charge five cents.",
        notes=["a call inside the thought was not run"],
    )
    back = response_from_json(
        json.loads(json.dumps(response_to_json(ModelResponse(completion, "<think>...", Usage()))))
    )
    assert back.completion.thought == "Charge five cents."
    assert back.completion.notes == ["a call inside the thought was not run"]
    call = back.completion.tool_calls[0]
    # A resumed run types the XML values by the schema again, as the first attempt did.
    assert (call.arguments, call.text_arguments) == ({"cents": "5"}, True)


def test_a_store_error_is_known_through_its_wrapper_and_is_never_an_approvers_answer() -> None:
    """A session store's error raised from the database's is the store failing; an approver
    that fails that way (a queued run reading its approval while the store is away) is not a
    denial: the error goes through, so the attempt ends and the run resumes."""
    import asyncio
    from types import SimpleNamespace

    from sqlalchemy.exc import OperationalError

    from hermes_agent.errors import is_store_error
    from hermes_agent.pipeline.tool_selector import _ask
    from hermes_agent.storage.base import StorageError
    from hermes_agent.tools.registry import Tool
    from hermes_agent.types import ToolCall

    reset = OperationalError("SELECT 1", {}, Exception("server closed the connection"))
    try:
        raise StorageError("cannot read the session") from reset
    except StorageError as exc:
        wrapped = exc
    assert is_store_error(wrapped) and not is_store_error(ValueError("a bug"))

    def approver(call: ToolCall, tool: Tool) -> bool:
        raise wrapped

    def denying(call: ToolCall, tool: Tool) -> bool:
        raise ValueError("the approver's own bug")

    tool = Tool.from_function(lambda: "ok", name="act")
    call = ToolCall(name="act", arguments={})
    with pytest.raises(StorageError):
        asyncio.run(_ask(SimpleNamespace(approver=approver), call, tool))  # type: ignore[arg-type]
    denied = asyncio.run(_ask(SimpleNamespace(approver=denying), call, tool))  # type: ignore[arg-type]
    assert denied[0] is False and "the approver failed: ValueError" in denied[1]
