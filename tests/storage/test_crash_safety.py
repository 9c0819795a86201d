"""A process killed with SIGKILL mid-run leaves a SQLite database that opens, passes
``PRAGMA integrity_check`` and holds whole steps only."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections import defaultdict
from pathlib import Path

import pytest

from hermes_agent.storage import SqlStorage

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")

WORKER = textwrap.dedent(
    '''
    import json, sys, threading, time
    from pathlib import Path
    from hermes_agent import Agent, ScriptedModel, ToolExecution
    from hermes_agent.storage import SqlStorage

    url, ready = sys.argv[1], Path(sys.argv[2])
    CALL = '<tool_call>\\n{"name": "%s", "arguments": {"n": 1}}\\n</tool_call>'

    def quick(n: int) -> int:
        """Returns at once."""
        return n

    def stuck(n: int) -> int:
        """Blocks until the process is killed."""
        ready.write_text("blocked")
        time.sleep(120)  # a tool that blocks: the process is killed inside it
        return n

    def busy_model(messages, tools):
        return CALL % "quick"

    def stuck_model(messages, tools):
        turns = sum(1 for m in messages if m.role == "assistant")
        return CALL % ("stuck" if turns >= 5 else "quick")

    storage = SqlStorage(url)

    def churn(number):
        agent = Agent(model=ScriptedModel(busy_model), tools=[quick], storage=storage,
                      max_iterations=20, max_retries=10_000)
        while True:
            agent.run("keep busy", session_id=f"busy-{number}")

    for number in range(3):
        threading.Thread(target=churn, args=(number,), daemon=True).start()
    agent = Agent(model=ScriptedModel(stuck_model), tools=[quick, stuck], storage=storage,
                  max_iterations=50, tool_execution=ToolExecution(default_timeout=300))
    agent.run("this run will be killed", session_id="victim")
    '''
)

WHOLE_STEPS = (
    {"prompt", "completion", "selection", "tool", "tool_calls"},  # the first, tool-calling step
    {"prompt_added", "completion", "selection", "tool", "tool_calls"},  # a later tool-calling step
    {"prompt", "completion", "output"},  # a first step that answered
    {"prompt_added", "completion", "output"},  # a later final step
    {"output"},  # the run ended (max_iterations) after the loop
)


def _stored(db: Path, session_id: str) -> bool:
    with sqlite3.connect(db, timeout=10) as raw:
        query = "SELECT COUNT(*) FROM audit_records WHERE session_id = ?"
        return bool(raw.execute(query, (session_id,)).fetchone()[0])


def test_sigkill_mid_run_leaves_whole_steps(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    url = f"sqlite:///{db}"
    SqlStorage(url).close()  # schema in place before the worker starts
    ready = tmp_path / "ready"
    script = tmp_path / "worker.py"
    script.write_text(WORKER, encoding="utf-8")
    process = subprocess.Popen([sys.executable, str(script), url, str(ready)])
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert process.poll() is None, "the worker exited early"
            assert time.monotonic() < deadline, "the worker never reached the blocking tool"
            time.sleep(0.02)  # the polling pace, bounded by the deadline above
        # The victim is blocked in step 5; wait until its finished steps are stored (the
        # writer stores a burst once it pauses), then kill while the busy threads write on.
        while not _stored(db, "victim"):
            assert time.monotonic() < deadline, "the finished steps were never stored"
            time.sleep(0.05)  # the polling pace, bounded by the deadline above
        time.sleep(0.1)  # the busy runs write on a while: the kill comes mid-write
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL

    with sqlite3.connect(db) as raw:
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        rows = raw.execute(
            "SELECT request_id, session_id, step, role FROM audit_records ORDER BY id"
        ).fetchall()
    assert rows, "no records were stored before the kill"

    steps: dict[tuple[str, int], set[str]] = defaultdict(set)
    sessions: dict[str, str] = {}
    for request_id, session_id, step, role in rows:
        steps[(request_id, step)].add(role)
        sessions[request_id] = session_id
    for (request_id, step), roles in steps.items():
        if step == 0:  # the InputParser record travels with the first step
            assert "user" in roles, f"request {request_id} lost its user record"
            roles = roles - {"user"}
        assert roles in WHOLE_STEPS, f"request {request_id} step {step} is partial: {roles}"
    assert len(sessions) > 3, "the busy threads stored no whole runs"

    victim = [rid for rid, sid in sessions.items() if sid == "victim"]
    assert len(victim) == 1, "the killed run's finished steps were not stored"
    victim_steps = sorted(step for rid, step in steps if rid == victim[0])
    assert victim_steps == [0, 1, 2, 3, 4], victim_steps  # step 5 was blocked: not there

    with SqlStorage(url) as storage:  # it opens, and its trail reads back
        assert storage.records(victim[0])[0].content == "this run will be killed"
        assert any(r["session_id"] == "victim" for r in storage.requests(limit=1000))
