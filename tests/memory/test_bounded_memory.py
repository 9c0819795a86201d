"""Nothing an agent keeps per session or per call grows without bound in a long-lived process:
session locks live only while a run holds them, history summaries and cached tool results are
evicted by count (least recently used, oldest first)."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref

import pytest

from hermes_agent import Agent, ScriptedModel
from hermes_agent.memory.history import HistoryLoader
from hermes_agent.storage import open_storage
from hermes_agent.tools import runtime as runtime_module
from hermes_agent.tools.registry import Tool
from hermes_agent.tools.runtime import ToolRuntime
from hermes_agent.types import Message
from storage_backends import database_url  # noqa: F401  (the db_url fixture)


def test_session_locks_are_dropped_once_no_run_holds_them(db_url: str) -> None:
    storage = open_storage(db_url)
    agent = Agent(model=ScriptedModel(lambda _m, _t: "ok"), storage=storage)
    try:
        for number in range(200):  # a long-lived service: every run on a new session
            assert agent.run("hi", session_id=f"s{number}").output == "ok"
        gc.collect()
        sessions = storage.sessions
        assert len(sessions._locks) == 0  # type: ignore[attr-defined]
        # While a run holds a session's lock, every caller gets that same lock.
        held = sessions.lock("s1")
        with held:
            assert sessions.lock("s1") is held
            assert not sessions.lock("s1").acquire(blocking=False)
        gone = weakref.ref(held)
        del held
        gc.collect()
        assert gone() is None
        assert len(sessions._locks) == 0  # type: ignore[attr-defined]
    finally:
        agent.close()
        storage.close()


def _turns(count: int) -> list[Message]:
    messages = []
    for number in range(count):
        messages += [
            Message("user", f"question {number}"),
            Message("assistant", f"answer {number}"),
        ]
    return messages


def test_history_summaries_are_evicted_least_recently_used_first() -> None:
    loader = HistoryLoader(
        history_window=1, summary_max_chars=100, summarize_with_model=False, max_cached=3
    )
    model = ScriptedModel(["unused"])
    stored = _turns(3)  # two turns beyond the window: summarised

    def load(session: str) -> None:
        asyncio.run(loader.load(session, stored, model))

    for session in ("a", "b", "c"):
        load(session)
    load("a")  # used again: now the most recent
    load("d")  # one too many: "b", the least recently used, goes
    assert list(loader._summaries) == ["c", "a", "d"]
    for number in range(100):
        load(f"x{number}")
    assert len(loader._summaries) == 3


def test_cached_tool_results_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime_module, "MAX_CACHED_RESULTS", 5)
    runtime = ToolRuntime()

    def lookup(key: str) -> str:
        """Look up a key."""
        return key.upper()

    tool = Tool.from_function(lookup, cache_ttl=3600)
    for number in range(50):
        runtime.remember(tool, {"key": f"k{number}"}, f"K{number}")
    assert len(runtime._cache) == 5
    assert runtime.cached(tool, {"key": "k49"}) == (True, "K49")
    assert runtime.cached(tool, {"key": "k0"}) == (False, None)  # the oldest went first
    # An entry written again counts as new: it outlives those written before it.
    runtime.remember(tool, {"key": "k45"}, "K45")
    runtime.remember(tool, {"key": "new"}, "NEW")
    assert runtime.cached(tool, {"key": "k45"}) == (True, "K45")
    assert runtime.cached(tool, {"key": "k46"}) == (False, None)
    # Expired entries go before live ones.
    short = Tool.from_function(lookup, name="short", cache_ttl=1e-9)
    runtime._cache.clear()
    for number in range(4):
        runtime.remember(short, {"key": f"old{number}"}, "x")
    runtime.remember(tool, {"key": "live"}, "LIVE")
    runtime.remember(tool, {"key": "next"}, "NEXT")
    assert {k[1] for k in runtime._cache} == {'{"key": "live"}', '{"key": "next"}'}


def test_the_summary_cache_stays_bounded_with_runs_on_many_threads() -> None:
    loader = HistoryLoader(
        history_window=1, summary_max_chars=100, summarize_with_model=False, max_cached=4
    )
    model = ScriptedModel(["unused"])
    stored = _turns(3)
    errors: list[BaseException] = []

    def worker(offset: int) -> None:
        try:
            for number in range(300):  # each thread on its own loop, as sync callers are
                asyncio.run(loader.load(f"s{(offset + number) % 12}", stored, model))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert len(loader._summaries) == 4
