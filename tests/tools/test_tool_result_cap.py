"""A tool's result is bounded by default, the moment the tool returns it: a result longer than
the agent's ``max_result_chars`` (100,000 characters) is cut, with a note, before it is cached,
journaled, recorded, stored, put in an event or sent to the model — in process and in a worker,
where a huge result no longer multiplies the worker's memory."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hermes_agent import Agent, ScriptedModel, ToolExecution
from hermes_agent.config import AgentConfig, HermesConfig, ScriptedConfig
from hermes_agent.events import Event, ResultEvent, ToolResultsEvent
from hermes_agent.pipeline.tool_executor import _NOTE_ROOM
from hermes_agent.runs.request import QueuedRequest
from hermes_agent.storage.sql import SqlStorage
from hermes_agent.testing import tool_call as call
from hermes_agent.tools.registry import Tool
from hermes_agent.tools.runtime import DEFAULT_MAX_RESULT_CHARS
from hermes_agent.types import RunResult
from hermes_agent.worker.runner import RunWorker
from hermes_agent.worker.store import RunStore

BIG = 3_000_000


def run_big(agent: Agent) -> tuple[RunResult, list[Event]]:
    """The run's result and every event it streamed."""
    events: list[Event] = []

    async def consume() -> None:
        async for event in agent.astream("show it", session_id="s1"):
            events.append(event)

    asyncio.run(consume())
    [result] = [e.result for e in events if isinstance(e, ResultEvent)]
    assert result.status == 200, result.error
    return result, events


def shown_to_model(model: ScriptedModel) -> Any:
    return model.requests[-1].messages[-1].tool_results[0].content["data"]


def test_a_huge_result_is_cut_by_default_everywhere_it_goes(tmp_path: Path) -> None:
    def dump() -> str:
        """Everything."""
        return "x" * BIG

    db = tmp_path / "state.db"
    model = ScriptedModel([call("dump"), "done"])
    agent = Agent(model, storage=f"sqlite:///{db}", tools=[dump])
    result, events = run_big(agent)
    [record] = result.tool_calls
    note = f"… [truncated: the result has {BIG:,} characters, only the first 100,000 are shown]"
    assert record.result == "x" * DEFAULT_MAX_RESULT_CHARS + note
    assert (record.metadata["truncated"], record.metadata["result_chars"]) == (True, BIG)
    assert shown_to_model(model) == record.result
    [shown] = [e for e in events if isinstance(e, ToolResultsEvent)]
    assert shown.results[0].content["data"] == record.result
    agent.close()
    # The store (session, trail, events) never held the whole: far less than one copy of it.
    assert db.stat().st_size < BIG / 3


def test_a_tools_own_bound_raises_it_or_cuts_only_what_the_model_reads() -> None:
    def rows() -> list[int]:
        """Many rows."""
        return list(range(30_000))  # about 190,000 characters of JSON

    whole = len(json.dumps(list(range(30_000))))
    larger = ScriptedModel([call("rows"), "done"])
    agent = Agent(larger, tools=[Tool.from_function(rows, max_result_chars=200_000)])
    [record] = agent.run("rows").tool_calls
    assert record.result == list(range(30_000)) and "truncated" not in record.metadata
    assert shown_to_model(larger) == list(range(30_000))

    def few() -> list[int]:
        """A few rows."""
        return list(range(100))

    smaller = ScriptedModel([call("few"), "done"])
    agent = Agent(smaller, tools=[Tool.from_function(few, max_result_chars=20)])
    [record] = agent.run("few").tool_calls
    assert record.result == list(range(100))  # the caller keeps what the agent's bound allows
    assert shown_to_model(smaller).startswith("[0, 1, 2, 3, 4, 5, 6… [truncated: the result has")
    assert whole > DEFAULT_MAX_RESULT_CHARS  # the first case was over the default bound


def test_the_agents_bound_is_a_setting_of_code_and_config_and_forks_keep_it() -> None:
    def text() -> str:
        """Text."""
        return "y" * 5000

    capped = ToolExecution(max_result_chars=1000)
    agent = Agent(ScriptedModel([call("text"), "done"]), tools=[text], tool_execution=capped)
    [record] = agent.run("text").tool_calls
    assert record.metadata["result_chars"] == 5000 and len(record.result) < 1000 + _NOTE_ROOM
    assert agent.fork().runtime.max_result_chars == 1000
    assert AgentConfig().max_result_chars == DEFAULT_MAX_RESULT_CHARS
    config = HermesConfig(
        model=ScriptedConfig(responses=["ok"]),
        agent=AgentConfig(max_result_chars=2000),
    )
    assert Agent.from_settings(config).runtime.max_result_chars == 2000


def test_a_huge_error_message_and_a_cached_result_are_bounded_too() -> None:
    calls = 0

    def fails() -> str:
        """Fails loudly."""
        raise RuntimeError("e" * BIG)

    def cached() -> str:
        """Cached."""
        nonlocal calls
        calls += 1
        return "c" * BIG

    model = ScriptedModel([call("fails"), call("cached"), call("cached"), "done"])
    agent = Agent(model, tools=[fails, Tool.from_function(cached, cache_ttl=60)])
    failed, first, hit = agent.run("go").tool_calls
    assert failed.status_code == 500 and failed.error is not None
    assert len(failed.error) < DEFAULT_MAX_RESULT_CHARS + _NOTE_ROOM
    assert calls == 1 and hit.metadata["cache_hit"] is True
    assert first.result == hit.result and len(hit.result) < DEFAULT_MAX_RESULT_CHARS + _NOTE_ROOM


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=60),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=40,
)


@settings(max_examples=60, deadline=None)
@given(value=json_values, limit=st.integers(min_value=1, max_value=300))
def test_whatever_a_tool_returns_the_model_and_the_record_get_at_most_the_bound(
    value: Any, limit: int
) -> None:
    def anything() -> Any:
        """Anything."""
        return value

    model = ScriptedModel([call("anything"), "done"])
    agent = Agent(model, tools=[anything], tool_execution=ToolExecution(max_result_chars=limit))
    [record] = agent.run("go").tool_calls
    size = len(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))
    if size <= limit:
        assert record.result == value and shown_to_model(model) == value
    else:
        assert isinstance(record.result, str) and len(record.result) <= limit + _NOTE_ROOM
        assert record.metadata["result_chars"] == size
        assert shown_to_model(model) == record.result
    agent.close()


# -- the queued engine ------------------------------------------------------------------------


def test_a_worker_journals_and_stores_only_the_bounded_result(url: str, cleanup: list[Any]) -> None:
    def big() -> str:
        """Return a lot."""
        return "x" * BIG

    model = ScriptedModel([call("big"), "done"])
    agent = Agent(model, storage=url, tools=[big])
    assert isinstance(agent.storage, SqlStorage)
    store = RunStore(agent.storage, max_redeliveries=1)
    worker = RunWorker(agent, store, lambda _rid: None, name="w:1", lease_ttl=5.0)
    cleanup.extend([agent, worker])
    rid = store.add("s1", QueuedRequest(message="big"))
    assert worker.execute(rid) == "completed"
    journaled = store.journal_entries(rid)["call/0/0"][1]["value"]
    assert len(journaled) < DEFAULT_MAX_RESULT_CHARS + _NOTE_ROOM
    assert len(json.dumps(shown_to_model(model))) < DEFAULT_MAX_RESULT_CHARS + _NOTE_ROOM
    run = store.get(rid)
    assert run is not None and len(json.dumps(run.result)) < 3 * DEFAULT_MAX_RESULT_CHARS


PROBE = textwrap.dedent(
    """
    import json, resource, sys
    from hermes_agent import Agent, ScriptedModel
    from hermes_agent.runs.request import QueuedRequest
    from hermes_agent.testing import tool_call
    from hermes_agent.worker.runner import RunWorker
    from hermes_agent.worker.store import RunStore

    url, size = sys.argv[1], int(sys.argv[2])

    def big() -> str:
        \"\"\"Return a lot.\"\"\"
        return "x" * size

    agent = Agent(ScriptedModel([tool_call("big"), "done"]), storage=url, tools=[big])
    store = RunStore(agent.storage, max_redeliveries=1)
    worker = RunWorker(agent, store, lambda _rid: None, name="probe:1", lease_ttl=30.0)
    rid = store.add("s1", QueuedRequest(message="big"))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    outcome = worker.execute(rid)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    worker.close()
    agent.close()
    print(json.dumps({"outcome": outcome, "before_kb": before, "peak_kb": peak}))
    """
)


def worker_memory(url: str, size: int) -> dict[str, Any]:
    """Run one queued run whose tool returns ``size`` characters in a worker process of its
    own; what became of it and the process's peak RSS before and after."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, url, str(size)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_a_worker_with_a_huge_result_grows_by_about_one_copy_of_it(url: str) -> None:
    """The tool's own string is the only whole copy: the worker's peak grows by about its size
    (it grew by several times its size when every write and request carried it whole)."""
    size = 50_000_000
    found = worker_memory(url, size)
    assert found["outcome"] == "completed"
    grown_mb = (found["peak_kb"] - found["before_kb"]) / 1024
    assert grown_mb < 1.5 * size / 1e6, found
