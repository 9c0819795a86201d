"""Attacks on durable queued runs, in one process without a broker: replay that differs from the
first attempt, races between a decision and the attempt that asked for it, an operator's requeue
beside newer runs of the session, approvals shared by identical calls, duplicated events, and
input a model or a tool controls. Each test states a promise of docs/scale-out.md."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

from hermes_agent import Agent, Memory, ScriptedModel
from hermes_agent.models.base import ModelSettings
from hermes_agent.runs.request import QueuedRequest
from hermes_agent.storage.sql import SqlStorage
from hermes_agent.tools.registry import Tool
from hermes_agent.types import Message
from hermes_agent.worker.journal import response_to_json
from hermes_agent.worker.runner import RunWorker
from hermes_agent.worker.store import RunStore
from worker_harness import Ledger, call, charge_script, expire


def calls(*bodies: tuple[str, dict[str, Any]]) -> str:
    return "\n".join(call(name, **arguments) for name, arguments in bodies)


def worker_for(
    agent: Agent, cleanup: list[Any], *, name: str = "w:1", lease_ttl: float = 5.0
) -> tuple[RunStore, RunWorker, list[str]]:
    assert isinstance(agent.storage, SqlStorage)
    store = RunStore(agent.storage, max_redeliveries=1)
    sent: list[str] = []
    worker = RunWorker(agent, store, sent.append, name=name, lease_ttl=lease_ttl)
    cleanup.extend([agent, worker])
    return store, worker, sent


def charging_agent(url: str, ledger: Ledger, **tool_settings: Any) -> tuple[Agent, ScriptedModel]:
    model = ScriptedModel(charge_script)
    tool = Tool.from_function(ledger.charge, **tool_settings)
    return Agent(model, storage=url, tools=[tool]), model


def _journal_turn(store: RunStore, rid: str, token: int, turn: int, text: str) -> None:
    model = ScriptedModel([text])
    response = asyncio.run(model.complete([Message("user", "x")], [], ModelSettings()))
    store.write_journal(rid, token, f"turn/{turn}", "done", response_to_json(response))


def _failed_midway(store: RunStore, rid: str) -> None:
    """An earlier attempt that asked the model, charged, and then failed (a run an operator may
    requeue): its journal holds turn 0 and the call's outcome."""
    claim = store.claim(rid, "old:1", 5.0)
    assert claim.outcome == "claimed"
    _journal_turn(store, rid, claim.token, 0, call("charge", cents=1))
    outcome = {"value": "charged 1", "status_code": 200, "error": None}
    store.write_journal(rid, claim.token, "call/0/0", "done", outcome)
    store.finish(rid, claim.token, "failed", error="the store went away")


# -- replay must ask the same questions as the first attempt ----------------------------


def test_a_cached_history_summary_does_not_shift_the_replayed_turns(
    url: str, cleanup: list[Any]
) -> None:
    """The first attempt asked the model for a summary of the old turns (turn 0) and then for the
    call (turn 1); the summary is now in the worker's cache, so the resumed attempt does not ask
    for it again — and must still get the call, not the summary, as its first answer."""
    ledger = Ledger()

    def script(messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> str:
        if not tools and any("summar" in str(m.content).lower() for m in messages):
            return "SUMMARY OF OLD TURNS"
        return charge_script(messages, tools)

    model = ScriptedModel(script)
    tool = Tool.from_function(ledger.charge, requires_approval=True)
    memory = Memory(history_window=1, summarize_with_model=True)
    agent = Agent(model, storage=url, tools=[tool], memory=memory)
    store, worker, _ = worker_for(agent, cleanup)
    old = [Message("user", f"old question {i}") for i in range(3)]
    agent.sessions.append("s1", [m for q in old for m in (q, Message("assistant", "ok"))])
    rid = store.add("s1", QueuedRequest(message="charge 9"))
    assert worker.execute(rid) == "waiting_approval"
    assert len(model.requests) == 2  # the summary, then the call
    key = store.pending_approvals(rid)[0]["approval_id"]
    assert store.decide(rid, key, True, "ok")
    assert worker.execute(rid) == "completed"
    run = store.get(rid)
    assert run is not None and run.result is not None
    assert ledger.calls == [f"{rid}/0/0"]  # the approved charge happened
    assert run.result["output"].startswith("answer:")


def test_a_recorded_call_is_not_refused_by_a_rate_limit_on_replay(
    url: str, cleanup: list[Any]
) -> None:
    """The call ran in the first attempt (its outcome is journaled); the worker that resumes
    the run has used up the tool's rate limit on other runs. The recorded outcome must still be
    what the run reports — not a 429 for a charge that took place."""
    ledger = Ledger()
    tool = Tool.from_function(ledger.charge, rate_limit=1)
    agent = Agent(ScriptedModel(charge_script), storage=url, tools=[tool])
    store, worker, _ = worker_for(agent, cleanup)
    rid = store.add("s1", QueuedRequest(message="charge 7"))
    claim = store.claim(rid, "dead:1", 5.0)
    _journal_turn(store, rid, claim.token, 0, call("charge", cents=7))
    store.write_journal(rid, claim.token, "call/0/0", "started", {"tool": "charge"})
    outcome = {"value": "charged 7 earlier", "status_code": 200, "error": None}
    store.write_journal(rid, claim.token, "call/0/0", "done", outcome)
    expire(store, rid)
    assert agent.runtime.admit(tool)  # another run of this worker used the minute's call
    assert worker.execute(rid) == "completed"
    run = store.get(rid)
    assert run is not None and run.result is not None
    record = run.result["tool_calls"][0]
    assert (record["status_code"], record["metadata"].get("journal")) == (200, "recorded")
    assert "charged 7 earlier" in run.result["output"] and ledger.calls == []


# -- approvals ---------------------------------------------------------------------------


class DecidingStore(RunStore):
    """A store where a decision arrives the moment the pending approval exists (another
    process answered at once): before the call is recorded there is nothing to answer, and
    once it is, the run is already set aside, so the answer re-enqueues it."""

    def park_for_approval(
        self, request_id: str, token: int, key: str, *args: Any, **kwargs: Any
    ) -> None:
        assert not self.decide(request_id, key, True, "too early")  # nothing pending yet
        super().park_for_approval(request_id, token, key, *args, **kwargs)
        assert self.decide(request_id, key, True, "quick")
        assert self.get(request_id).status == "queued"  # type: ignore[union-attr]


def test_a_decision_given_while_the_run_is_being_set_aside_is_not_lost(
    url: str, cleanup: list[Any]
) -> None:
    ledger = Ledger()
    agent, _ = charging_agent(url, ledger, requires_approval=True)
    assert isinstance(agent.storage, SqlStorage)
    store = DecidingStore(agent.storage)
    worker = RunWorker(agent, store, lambda _: None, name="w:1", lease_ttl=5.0)
    cleanup.extend([agent, worker])
    rid = store.add("s1", QueuedRequest(message="charge 9"))
    worker.execute(rid)
    # The decider re-enqueued the run (decide returned True); that delivery must run it.
    assert store.pending_approvals(rid) == []
    assert worker.execute(rid) == "completed"
    assert ledger.calls == [f"{rid}/0/0"]


def test_one_decision_approves_one_call_not_every_identical_call_of_the_turn(
    url: str, cleanup: list[Any]
) -> None:
    """The model asks for the same charge twice in one turn: two charges, so two decisions."""
    ledger = Ledger()
    model = ScriptedModel([calls(("charge", {"cents": 9}), ("charge", {"cents": 9})), "done"])
    tool = Tool.from_function(ledger.charge, requires_approval=True)
    agent = Agent(model, storage=url, tools=[tool])
    store, worker, _ = worker_for(agent, cleanup)
    rid = store.add("s1", QueuedRequest(message="charge 9 twice"))
    assert worker.execute(rid) == "waiting_approval"
    first = store.pending_approvals(rid)
    assert len(first) == 1
    assert store.decide(rid, first[0]["approval_id"], True, "one charge of 9")
    outcome = worker.execute(rid)
    # The second charge needs its own decision; one approval must not cover both.
    assert outcome == "waiting_approval" or len(ledger.calls) <= 1
    assert len(ledger.calls) <= 1


def test_an_approval_resume_keeps_each_stage_of_the_trail_once(
    url: str, cleanup: list[Any]
) -> None:
    ledger = Ledger()
    agent, _ = charging_agent(url, ledger, requires_approval=True)
    store, worker, _ = worker_for(agent, cleanup)
    rid = store.add("s1", QueuedRequest(message="charge 9"))
    assert worker.execute(rid) == "waiting_approval"
    key = store.pending_approvals(rid)[0]["approval_id"]
    assert store.decide(rid, key, True, "ok")
    assert worker.execute(rid) == "completed"
    assert agent.storage is not None
    records = agent.storage.records(rid)
    seqs = [r.seq for r in records]
    assert len(seqs) == len(set(seqs))
    staged = [(r.step, r.stage, r.role) for r in records if r.stage != "Worker"]
    assert len(staged) == len(set(staged)), staged
    # The selection of step 0 that approved the call is in the trail, as a success.
    selections = [r for r in records if (r.step, r.stage) == (0, "ToolSelector")]
    assert selections and all(r.status_code == 200 for r in selections), [
        (r.role, r.status_code, r.content[:80]) for r in selections
    ]


def test_events_of_a_resumed_run_are_not_repeated(url: str, cleanup: list[Any]) -> None:
    ledger = Ledger()
    agent, _ = charging_agent(url, ledger, requires_approval=True)
    store, worker, _ = worker_for(agent, cleanup)
    rid = store.add("s1", QueuedRequest(message="charge 9"))
    assert worker.execute(rid) == "waiting_approval"
    key = store.pending_approvals(rid)[0]["approval_id"]
    assert store.decide(rid, key, True, "ok")
    assert worker.execute(rid) == "completed"
    kinds = [wire["kind"] for _, wire in store.events(rid)]
    assert kinds.count("input") == 1, kinds


# -- an operator's requeue ---------------------------------------------------------------


def test_a_requeued_run_does_not_run_beside_a_newer_run_of_its_session(
    url: str, cleanup: list[Any]
) -> None:
    ledger = Ledger()
    agent, _ = charging_agent(url, ledger)
    store, _, _ = worker_for(agent, cleanup)
    older = store.add("s1", QueuedRequest(message="charge 1"))
    _failed_midway(store, older)
    newer = store.add("s1", QueuedRequest(message="charge 2"))
    assert store.claim(newer, "busy:2", 30.0).outcome == "claimed"  # running elsewhere now
    # Two turns of one session at once, or the older after the newer: the requeue is refused.
    from hermes_agent.storage.base import StorageError

    with pytest.raises(StorageError, match="submit the message again"):
        store.requeue(older)
    assert store.get(older).status == "failed"  # type: ignore[union-attr]


def test_a_run_requeued_after_newer_runs_of_its_session_completed_keeps_the_order(
    url: str, cleanup: list[Any]
) -> None:
    """Its journaled model turn answered a history without the newer turns; appending its turn
    after theirs would put the session out of order. Refusing the requeue is fine too."""
    from hermes_agent.storage.base import StorageError

    ledger = Ledger()
    agent, _ = charging_agent(url, ledger)
    store, worker, _ = worker_for(agent, cleanup)
    older = store.add("s1", QueuedRequest(message="charge 1"))
    _failed_midway(store, older)
    newer = store.add("s1", QueuedRequest(message="charge 2"))
    assert worker.execute(newer) == "completed"
    try:
        store.requeue(older)
    except StorageError:
        return  # refused: the session has moved on
    assert worker.execute(older) == "completed"
    users = [m.content for m in agent.sessions.load("s1") if m.role == "user"]
    assert users == ["charge 1", "charge 2"], users


# -- races -------------------------------------------------------------------------------


def test_two_workers_claiming_one_run_at_once_get_one_claim(url: str, cleanup: list[Any]) -> None:
    agent, _ = charging_agent(url, Ledger())
    store, _, _ = worker_for(agent, cleanup)
    for round_ in range(5):
        rid = store.add(f"s{round_}", QueuedRequest(message="charge 1"))
        gate = threading.Barrier(4)
        outcomes: list[str] = []

        def grab(
            name: str,
            rid: str = rid,
            gate: threading.Barrier = gate,
            outcomes: list[str] = outcomes,
        ) -> None:
            gate.wait()
            outcomes.append(store.claim(rid, name, 30.0).outcome)

        threads = [threading.Thread(target=grab, args=(f"w:{i}",)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(outcomes) == ["busy", "busy", "busy", "claimed"]


def test_two_sweepers_at_once_send_each_lost_run_once(url: str, cleanup: list[Any]) -> None:
    agent, _ = charging_agent(url, Ledger())
    store, _, _ = worker_for(agent, cleanup)
    lost = [store.add(f"s{i}", QueuedRequest(message="charge 1")) for i in range(6)]
    for rid in lost:
        store.claim(rid, "gone:1", 0.05)
    time.sleep(0.1)  # a measured spell: the claims' 0.05 s leases run out
    gate = threading.Barrier(3)
    found: list[str] = []

    def sweep() -> None:
        gate.wait()
        found.extend(store.to_sweep(5.0))

    threads = [threading.Thread(target=sweep) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(found) == sorted(lost)


def test_events_written_at_once_by_two_writers_are_all_kept(
    url: str, cleanup: list[Any], request: pytest.FixtureRequest
) -> None:
    """The attempt that is about to learn it lost the run and the one that took it over (or a
    service writing ``run_stopped``) add events to one run at the same moment."""
    agent, _ = charging_agent(url, Ledger())
    store, _, _ = worker_for(agent, cleanup)
    rid = store.add("s1", QueuedRequest(message="charge 1"))
    gate = threading.Barrier(4)
    errors: list[BaseException] = []

    def write(i: int) -> None:
        gate.wait()
        for j in range(10):
            try:
                store.add_event(rid, {"kind": "probe", "writer": i, "n": j})
            except Exception as exc:
                errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(store.events(rid)) == 40


# -- input the model or a tool controls -------------------------------------------------


def test_a_lone_surrogate_in_a_tool_calls_arguments_does_not_wedge_the_run(
    url: str, cleanup: list[Any]
) -> None:
    seen: list[str] = []

    def echo(text: str) -> str:
        """Echo.

        Args:
            text: what to echo.
        """
        seen.append(text)
        return "echoed"

    body = '{"name": "echo", "arguments": {"text": "a\\ud800b"}}'
    model = ScriptedModel([f"<tool_call>\n{body}\n</tool_call>", "done"])
    agent = Agent(model, storage=url, tools=[echo])
    store, worker, _ = worker_for(agent, cleanup)
    rid = store.add("s1", QueuedRequest(message="echo"))
    assert worker.execute(rid) == "completed"
    run = store.get(rid)
    assert run is not None and run.result is not None
    # As in a run without a queue: the call runs with what the model wrote.
    assert seen == ["a\ud800b"], run.result["output"]
    assert run.result["status"] == 200


def test_a_tool_result_with_a_lone_surrogate_or_nul_is_kept(url: str, cleanup: list[Any]) -> None:
    def odd() -> str:
        """Return odd text."""
        return "x\ud800y\x00z"

    model = ScriptedModel([call("odd"), "done"])
    agent = Agent(model, storage=url, tools=[odd])
    store, worker, _ = worker_for(agent, cleanup)
    rid = store.add("s1", QueuedRequest(message="odd"))
    assert worker.execute(rid) == "completed"
    run = store.get(rid)
    assert run is not None and run.result is not None
    assert run.result["status"] == 200, run.result["output"]
    assert store.journal_entries(rid)["call/0/0"][0] == "done"


def test_a_huge_tool_result_is_journaled_and_cut_for_the_model(
    url: str, cleanup: list[Any]
) -> None:
    def big() -> str:
        """Return a lot."""
        return "x" * 3_000_000

    model = ScriptedModel([call("big"), "done"])
    agent = Agent(model, storage=url, tools=[Tool.from_function(big, max_result_chars=1000)])
    store, worker, _ = worker_for(agent, cleanup)
    rid = store.add("s1", QueuedRequest(message="big"))
    assert worker.execute(rid) == "completed"
    # Cut to the agent's bound (100,000 characters) before it was journaled, never whole.
    assert 100_000 < len(store.journal_entries(rid)["call/0/0"][1]["value"]) < 100_200
    prompt = model.requests[-1].messages[-1].tool_results[0].content
    assert len(json.dumps(prompt)) < 2000


@pytest.mark.parametrize(
    "session_id",
    [
        "",
        "s" * 400,
        "a\x00b",
    ],
)
def test_an_odd_session_id_is_refused_or_fails_the_run_before_any_call(
    url: str, cleanup: list[Any], session_id: str
) -> None:
    """A run keeps the session id it was queued with: one no store can hold is refused when it
    is queued, or fails the run before anything runs — never run under another session."""
    ledger = Ledger()
    agent, model = charging_agent(url, ledger)
    store, worker, _ = worker_for(agent, cleanup)
    try:
        rid = store.add(session_id, QueuedRequest(message="charge 1"))
    except Exception:
        return  # refused at the door: nothing stored, nothing to run
    assert worker.execute(rid) == "failed"
    assert ledger.calls == [] and model.requests == []
