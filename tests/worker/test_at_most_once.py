"""At-most-once that holds under pauses, on SQLite and PostgreSQL, without a broker:

- a store that answers a call's intent late (it paused past the lease) still lets the call
  start — the intent and the lease extension are one transaction, and a late answer is
  followed by a fresh heartbeat instead of a refusal — and an intent the fence refuses leaves
  nothing, so the next attempt runs the call instead of reporting it interrupted;
- a lease is extended from when the store runs the heartbeat, not from when it was sent;
- a takeover charges a redelivery only to the run inside the tool call its worker died in
  (a property over every mix of runs in and out of calls, in any takeover order), and runs
  whose deaths cannot be told apart run their calls alone (``CallGate``);
- ``fence(connection)`` refuses a tool's effect once its attempt no longer holds the run, with
  SQLAlchemy and DB-API connections, and holds the run's row until the effect commits.

The same with real worker processes, a frozen PostgreSQL and a frozen worker:
tests/worker/test_at_most_once_faults.py.
"""

from __future__ import annotations

import asyncio
import sqlite3
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select, text, update

from hermes_agent.pipeline.journal import CallKey, reset_current_call, set_current_call
from hermes_agent.runs.request import QueuedRequest
from hermes_agent.storage.sql import SqlStorage
from hermes_agent.worker import FENCE_SQL, FencedOut, fence
from hermes_agent.worker.attempt import Attempt
from hermes_agent.worker.journal import CallGate, StoreJournal
from hermes_agent.worker.leases import STRIKES_KEY
from hermes_agent.worker.store import RunStore, runs_table


def open_store(url: str, cleanup: list[Any]) -> RunStore:
    storage = SqlStorage(url)
    cleanup.append(storage)
    return RunStore(storage, max_redeliveries=3)


def expire(store: RunStore, *request_ids: str) -> None:
    """As if the lease holder died: the leases run out."""
    with store.storage.transaction(write=True) as conn:
        conn.execute(
            update(runs_table)
            .where(runs_table.c.request_id.in_(request_ids))
            .values(lease_expires_ns=time.time_ns() - 1)
        )


def lease_left_s(store: RunStore, rid: str) -> float:
    run = store.get(rid)
    assert run is not None and run.lease_expires_ns is not None
    return (run.lease_expires_ns - time.time_ns()) / 1e9


# -- a call that came due while the store paused ----------------------------------------


def test_a_call_whose_intent_the_store_took_late_still_starts(url: str, cleanup: list[Any]) -> None:
    """The store takes the intent's write after longer than a lease (the lease ran out
    meanwhile, and nobody took the run over): the write lands with the lease extended, the
    attempt asks for its lease again, and the call starts. Before, the attempt refused the
    call after its intent was written, and the next attempt told the model it was
    interrupted although it never ran."""
    store = open_store(url, cleanup)
    rid = store.add("s1", QueuedRequest(message="pay"))
    ttl = 0.5
    claim = store.claim(rid, "w:1", ttl)
    attempt = Attempt(store, rid, claim.token, ttl)
    journal = StoreJournal(store, rid, claim.token, attempt, entries={}, resumes=False)
    plain = store.write_batch

    def paused(*args: Any, **kwargs: Any) -> None:
        time.sleep(ttl * 1.6)  # the store holds the write past the lease
        plain(*args, **kwargs)

    store.write_batch = paused  # type: ignore[method-assign]
    started = asyncio.run(journal.call_started(CallKey(rid, 0, 0), "pay", {}, False))
    assert started is None  # the call starts: nobody else holds the run
    assert journal.holds()
    assert store.journal_entry(rid, "call/0/0") == ("started", {"tool": "pay", "arguments": {}})
    assert lease_left_s(store, rid) > ttl / 2  # extended, from when the store ran the writes


def test_an_intent_the_fence_refuses_leaves_nothing_and_the_next_attempt_runs_the_call(
    url: str, cleanup: list[Any]
) -> None:
    store = open_store(url, cleanup)
    rid = store.add("s1", QueuedRequest(message="pay"))
    first = store.claim(rid, "w:1", 5.0)
    expire(store, rid)
    second = store.claim(rid, "w:2", 5.0)
    old = StoreJournal(store, rid, first.token, entries={}, resumes=False)
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(old.call_started(CallKey(rid, 0, 0), "pay", {}, False))
    assert store.journal_entry(rid, "call/0/0") is None  # no intent: nothing to report
    new = StoreJournal(store, rid, second.token)
    assert asyncio.run(new.call_started(CallKey(rid, 0, 0), "pay", {}, False)) is None
    assert new.interrupted_calls == 0


def test_a_heartbeat_extends_the_lease_from_when_the_store_runs_it(
    url: str, cleanup: list[Any]
) -> None:
    """A heartbeat held up (here by a lock on the run's row, on SQLite the write lock) counts
    from when it ran: the lease it leaves is a whole ``lease_ttl`` from then."""
    store = open_store(url, cleanup)
    rid = store.add("s1", QueuedRequest(message="pay"))
    ttl = 2.0
    claim = store.claim(rid, "w:1", ttl)
    holding = threading.Event()
    released: list[int] = []

    def hold() -> None:
        with store.storage.transaction(write=True) as conn:
            conn.execute(
                select(runs_table.c.status).where(runs_table.c.request_id == rid).with_for_update()
            )
            holding.set()
            time.sleep(1.0)  # a measured hold of the row lock: the beat waits for it
            released.append(time.time_ns())

    thread = threading.Thread(target=hold)
    thread.start()
    assert holding.wait(10)
    assert store.heartbeat(rid, claim.token, ttl)
    thread.join()
    run = store.get(rid)
    assert run is not None and run.lease_expires_ns is not None
    # The lock went at released[0] (give or take its commit): the lease runs from then on.
    assert run.lease_expires_ns >= released[0] + int(ttl * 1e9) - int(0.05e9)


# -- who pays for a death -----------------------------------------------------------------


def _worker_holding(store: RunStore, owner: str, in_call: list[bool]) -> list[str]:
    """Runs claimed by ``owner``, each inside a tool call or not, then the owner dies."""
    ids = []
    for index, calling in enumerate(in_call):
        rid = store.add(f"s{index}", QueuedRequest(message="pay"))
        claim = store.claim(rid, owner, 5.0)
        assert claim.outcome == "claimed"
        store.write_journal(rid, claim.token, "turn/0", "done", {})
        if calling:
            store.write_journal(rid, claim.token, "call/0/0", "started", {"tool": "pay"})
        ids.append(rid)
    expire(store, *ids)
    return ids


def _charged(store: RunStore, ids: list[str]) -> list[int]:
    found = [store.get(rid) for rid in ids]
    return [run.redeliveries for run in found if run is not None]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    in_call=st.lists(st.booleans(), min_size=1, max_size=5),
    order=st.randoms(use_true_random=False),
)
def test_a_death_is_charged_only_to_the_run_whose_call_was_the_only_one_running(
    in_call: list[bool], order: Any
) -> None:
    """The property: whatever the runs a dead worker held were doing, and in whatever order
    the survivors take them over, a run is charged only if it was inside a tool call and no
    other run of that worker was; a run outside any call only if it was the worker's only run;
    runs in calls beside another's get a strike instead (their calls will run alone)."""
    with tempfile.TemporaryDirectory() as folder:
        cleanup: list[Any] = []
        try:
            store = open_store(f"sqlite:///{Path(folder) / 'runs.db'}", cleanup)
            ids = _worker_holding(store, "dead:1", in_call)
            for rid in order.sample(ids, len(ids)):
                assert store.claim(rid, "alive:2", 5.0).outcome == "claimed"
            calling = sum(in_call)
            expected = [
                (1 if calling == 1 else 0) if inside else (1 if len(ids) == 1 else 0)
                for inside in in_call
            ]
            assert _charged(store, ids) == expected
            for rid, inside in zip(ids, in_call, strict=True):
                strike = store.journal_entry(rid, STRIKES_KEY)
                if inside and calling > 1:
                    assert strike is not None and strike[1] == {"n": 1}
                else:
                    assert strike is None
        finally:
            for thing in reversed(cleanup):
                thing.close()


def test_a_run_with_a_strike_runs_its_calls_alone_and_its_next_death_costs_both(
    url: str, cleanup: list[Any]
) -> None:
    store = open_store(url, cleanup)
    pill, neighbour = _worker_holding(store, "dead:1", [True, True])
    taken = store.claim(pill, "w:2", 5.0)
    assert store.claim(neighbour, "w:2", 5.0).outcome == "claimed"
    assert _charged(store, [pill, neighbour]) == [0, 0]
    resumed = StoreJournal(store, pill, taken.token, gate=CallGate())
    assert resumed.alone  # its calls run alone in their process from now on
    # It dies again inside its call, alone this time: this death and the strike are charged.
    store.write_journal(pill, taken.token, "call/0/0", "started", {"tool": "pay"})
    expire(store, pill)
    store.claim(pill, "w:3", 5.0)
    assert _charged(store, [pill, neighbour]) == [2, 0]
    assert store.journal_entry(pill, STRIKES_KEY) == ("done", {"n": 0})


def test_a_note_taken_while_the_worker_lived_on_is_not_used_later(
    url: str, cleanup: list[Any]
) -> None:
    """One run of a live worker lapses (its other run beats on): what the other was doing
    then is noted, and is stale once it beats again; its later death is judged afresh."""
    store = open_store(url, cleanup)
    lapsed, other = _worker_holding(store, "live:1", [True, False])
    token = store.get(other).lease_token  # type: ignore[union-attr]
    assert store.heartbeat(other, token, 5.0)  # it lives on
    assert store.claim(lapsed, "w:2", 5.0).outcome == "claimed"
    assert _charged(store, [lapsed]) == [1]
    time.sleep(0.01)  # the clock moves on: the next beat is later than the note
    assert store.heartbeat(other, token, 5.0)
    store.write_journal(other, token, "call/0/0", "started", {"tool": "pay"})
    expire(store, other)  # now its worker dies inside its call, alone
    assert store.claim(other, "w:2", 5.0).outcome == "claimed"
    assert _charged(store, [other]) == [1]


def test_a_write_the_store_refuses_for_good_still_costs_a_redelivery(
    url: str, cleanup: list[Any]
) -> None:
    """Not a death but the run's own failure: its release charges it, and a run released so
    more than max_redeliveries times is dead-lettered by its next claim."""
    store = open_store(url, cleanup)
    rid = store.add("s1", QueuedRequest(message="pay"))
    for attempt in range(4):
        claim = store.claim(rid, f"w:{attempt}", 5.0)
        assert claim.outcome == "claimed"
        store.release(rid, claim.token, charge=True)
    assert store.claim(rid, "w:9", 5.0).outcome == "dead"
    run = store.get(rid)
    assert run is not None and run.status == "dead" and run.redeliveries == 4


# -- the gate of the calls in progress in one process -------------------------------------


def test_a_call_that_must_run_alone_waits_for_the_others_and_keeps_new_ones_out() -> None:
    async def scenario() -> list[str]:
        gate = CallGate()
        seen: list[str] = []
        first, second, suspect, late = object(), object(), object(), object()
        await gate.enter(first, alone=False)
        await gate.enter(second, alone=False)  # ordinary calls run side by side

        async def run_alone() -> None:
            await gate.enter(suspect, alone=True)
            seen.append("alone")
            await asyncio.sleep(0.01)  # a moment alone, in which the late one may not go in
            gate.leave(suspect)

        async def run_late() -> None:
            await gate.enter(late, alone=False)
            seen.append("late")
            gate.leave(late)

        alone = asyncio.create_task(run_alone())
        await asyncio.sleep(0)  # one turn of the loop: the task reaches the gate
        assert gate.contended
        arrived = asyncio.create_task(run_late())  # behind the one waiting to run alone
        await gate.enter(first, alone=False)  # a run already in a call may go on
        await asyncio.sleep(0.01)  # turns of the loop in which neither waiting task may go in
        assert seen == []
        gate.leave_all(first)
        seen.append("first out")
        gate.leave(second)
        await asyncio.gather(alone, arrived)
        assert not gate.contended
        return seen

    assert asyncio.run(scenario()) == ["first out", "alone", "late"]


# -- the tool's fence ---------------------------------------------------------------------


def _psycopg_dsn(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def test_the_documented_statement_names_the_runs_table() -> None:
    assert f"FROM {runs_table.name} " in FENCE_SQL


def test_fence_refuses_an_effect_once_the_attempt_no_longer_holds_the_run(
    url: str, cleanup: list[Any]
) -> None:
    store = open_store(url, cleanup)
    rid = store.add("s1", QueuedRequest(message="pay"))
    first = store.claim(rid, "w:1", 5.0)
    engine = store.storage.engine
    holding = CallKey(rid, 0, 0, first.token)

    def effect_through_sqlalchemy(key: CallKey) -> None:
        with engine.begin() as conn:
            fence(conn, key)
            conn.execute(text("SELECT 1"))

    def effect_through_dbapi(key: CallKey) -> None:
        if url.startswith("sqlite"):
            raw = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
            try:
                raw.execute("BEGIN IMMEDIATE")
                fence(raw, key)
                raw.execute("COMMIT")
            finally:
                raw.close()
        else:
            import psycopg

            with psycopg.connect(_psycopg_dsn(url)) as raw, raw.transaction():
                fence(raw, key)

    effect_through_sqlalchemy(holding)
    effect_through_dbapi(holding)
    token = set_current_call(holding)  # the current call, as a tool sees it
    try:
        with engine.begin() as conn:
            fence(conn)
    finally:
        reset_current_call(token)
    with engine.begin() as conn:  # in process: no token, nothing to check
        fence(conn, CallKey(rid, 0, 0, None))
    expire(store, rid)
    assert store.claim(rid, "w:2", 5.0).outcome == "claimed"
    with pytest.raises(FencedOut, match="no longer holds"):
        effect_through_sqlalchemy(holding)
    with pytest.raises(FencedOut):
        effect_through_dbapi(holding)


def test_fence_holds_the_run_until_the_effect_commits(url: str, cleanup: list[Any]) -> None:
    """A takeover that comes while the tool's transaction is open waits for its commit: the
    effect cannot land after the run changed hands."""
    if url.startswith("sqlite"):
        pytest.skip("SQLite: the tool's write lock is the row lock (BEGIN IMMEDIATE)")
    store = open_store(url, cleanup)
    rid = store.add("s1", QueuedRequest(message="pay"))
    first = store.claim(rid, "w:1", 5.0)
    expire(store, rid)
    fenced = threading.Event()
    committed: list[int] = []

    def tool() -> None:
        import psycopg

        with psycopg.connect(_psycopg_dsn(url)) as raw:
            with raw.transaction():
                fence(raw, CallKey(rid, 0, 0, first.token))
                fenced.set()
                time.sleep(0.5)  # a measured hold of the fence's transaction
            committed.append(time.monotonic_ns())

    thread = threading.Thread(target=tool)
    thread.start()
    assert fenced.wait(10)
    taken = store.claim(rid, "w:2", 5.0)
    claimed_at = time.monotonic_ns()
    thread.join()
    assert taken.outcome == "claimed"
    assert committed and claimed_at >= committed[0]


def test_every_test_the_guarantee_table_names_exists() -> None:
    """docs/scale-out.md's table of what holds per fault points at tests: each exists."""
    import ast
    import re

    tests = Path(__file__).resolve().parent
    page = (tests.parents[1] / "docs" / "scale-out.md").read_text(encoding="utf-8")
    table = page.split("### What holds, fault by fault", 1)[1].split("\n\n", 2)[1]
    named: list[tuple[str, str]] = []
    for line in table.splitlines()[2:]:
        module = ""
        for ref in re.findall(r"`([\w.]*::?\w+|[\w]+\.py)`", line.rsplit("|", 2)[-2]):
            if "::" in ref:
                head, name = ref.split("::")
                module = head or module
                named.append((module, name))
            else:
                module = ref
        assert module, f"a row names no test: {line}"
    assert len(named) >= 10
    for module, name in named:
        source = (tests / module).read_text(encoding="utf-8")
        functions = {
            node.name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.FunctionDef)
        }
        assert name in functions, f"{module}::{name}"
