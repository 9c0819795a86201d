"""Each engine writes a run's ending once. However a run ends (answered, failed, cancelled,
timed out), its trail holds exactly one final record (the ``output``, or a ``stopped`` record
saying why), after every other record of the run, and its events exactly one last event. The
same contract, run against the in-process engine (``runs.local``) and the queued engine (its
worker in this process, ``worker.runner``), on SQLite and PostgreSQL (the ``url`` fixture)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from hermes_agent import Agent, ScriptedModel, Tool
from hermes_agent.audit.records import AuditRecord, Role
from hermes_agent.backends import build_backend
from hermes_agent.runs.events import is_end
from hermes_agent.runs.principal import Principal
from hermes_agent.runs.request import QueuedRequest, RunRequest
from hermes_agent.runs.settings import ServiceSettings
from hermes_agent.storage.sql import SqlStorage
from hermes_agent.testing import tool_call as call
from hermes_agent.types import Message
from hermes_agent.worker.runner import RunWorker
from hermes_agent.worker.store import RunStore

ENDINGS = ["completed", "failed", "cancelled", "timed_out"]

Ending = tuple[str, list[AuditRecord], list[dict[str, Any]]]
"""A run's status, its trail and its events, read back once it ended."""


class Hold:
    """A tool that waits until released (a run stopped while it waits never releases it)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def hold(self) -> str:
        """Wait for the operator."""
        self.entered.set()
        self.release.wait(30)
        return "released"


def _model(ending: str) -> ScriptedModel:
    def answer(messages: Sequence[Message], _tools: Sequence[dict[str, Any]]) -> str:
        if ending == "failed":
            raise RuntimeError("the model endpoint is down")
        if ending in ("cancelled", "timed_out") and messages[-1].role != "tool":
            return call("hold")
        return "done"

    return ScriptedModel(answer)


def _agent(url: str, ending: str, hold: Hold) -> Agent:
    agent = Agent(_model(ending), storage=url)
    agent.add_tool(Tool.from_function(hold.hold))
    return agent


def _check_one_ending(
    status: str, records: list[AuditRecord], events: list[dict[str, Any]]
) -> None:
    finals = [r for r in records if r.role in (Role.OUTPUT, Role.STOPPED)]
    assert len(finals) == 1, [(r.stage, r.role) for r in records]
    # Last in the trail (a call the run abandoned may finish after it: its late_result).
    assert finals[0].seq == max(r.seq for r in records if r.role != Role.LATE_RESULT)
    assert status != "completed" or finals[0].role == Role.OUTPUT
    if finals[0].role == Role.STOPPED:
        assert f'"status": "{status}"' in finals[0].content
    ends = [event for event in events if is_end(event)]
    assert len(ends) == 1 and events[-1] is ends[0], [e.get("type") for e in events]


async def _in_process(url: str, ending: str) -> Ending:
    hold = Hold()
    timeout = 0.5 if ending == "timed_out" else 60.0
    settings = ServiceSettings(auth="none", run_timeout_s=timeout)
    built = build_backend(_agent(url, ending, hold), settings, with_keys=False)
    try:
        user = Principal("alice")
        view = await built.backend.start(user, RunRequest(message="go"))
        if ending == "cancelled":
            await asyncio.to_thread(hold.entered.wait, 30)
            await built.backend.cancel(view.request_id, user)
        ended = await built.backend.wait(view.request_id, user)
        hold.release.set()
        stream = await built.backend.events(ended.request_id, user, 0, 30.0)
        items = [item async for item in stream]
        storage = built.agent.storage
        assert storage is not None
        records = await asyncio.to_thread(storage.records, ended.request_id)
        return ended.status, records, [item[1] for item in items if item is not None]
    finally:
        hold.release.set()
        await built.shutdown(5.0)


def _queued(url: str, ending: str, cleanup: list[Any]) -> Ending:
    hold = Hold()
    agent = _agent(url, ending, hold)
    assert isinstance(agent.storage, SqlStorage)
    store = RunStore(agent.storage, max_redeliveries=1)
    worker = RunWorker(agent, store, lambda _rid: None, name="ending:1", lease_ttl=5.0)
    cleanup.extend([agent, worker])
    # A worker past the deadline ends the run at once: no wait on a clock.
    timeout = 1e-6 if ending == "timed_out" else None
    rid = store.add("s1", QueuedRequest(message="go"), run_timeout_s=timeout)
    if ending == "cancelled":
        done = threading.Thread(target=worker.execute, args=(rid,))
        done.start()
        assert hold.entered.wait(30)
        assert store.cancel(rid)
        hold.release.set()
        done.join(30)
    else:
        worker.execute(rid)
    run = store.get(rid)
    assert run is not None
    records = agent.storage.records(rid)
    return run.status, records, [wire for _, wire in store.events(rid)]


Engine = Callable[[str, str, list[Any]], Ending]


def in_process(url: str, ending: str, _cleanup: list[Any]) -> Ending:
    return asyncio.run(_in_process(url, ending))


@pytest.mark.parametrize("engine", [in_process, _queued], ids=["in_process", "queued"])
@pytest.mark.parametrize("ending", ENDINGS)
def test_a_run_ends_once_in_every_engine(
    url: str, cleanup: list[Any], engine: Engine, ending: str
) -> None:
    status, records, events = engine(url, ending, cleanup)
    assert status == ending
    _check_one_ending(status, records, events)
