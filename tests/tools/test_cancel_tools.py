"""A run that is cancelled while a subprocess tool runs takes the tool's process with it, at
once: ``Agent.arun`` cancelled by its caller (``task.cancel()``, ``asyncio.wait_for``),
``Agent.run`` interrupted by Ctrl-C, and a pool call aborted from another thread. The pool goes
on working afterwards: the slot is free again and a new worker takes the killed one's place."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes_agent import Agent, ScriptedModel, Tool
from hermes_agent.testing import tool_call as call
from hermes_agent.tools.sandbox import Abort, CallAborted, Limits, SubprocessPool
from processes import alive, gone_within
from server_harness import await_for, wait_for


def read_pids(path: Path, seconds: float = 10) -> tuple[int, int]:
    """(worker pid, sleeper pid) as ``nap`` wrote them."""
    written = wait_for(lambda: path.exists() and path.read_text(), seconds, f"{path} written")
    while len(written.split()) < 2:  # caught halfway through its writing
        written = wait_for(path.read_text, seconds, f"{path} written")
    worker, sleeper = written.split()
    return int(worker), int(sleeper)


def nap(pid_file: str) -> str:
    """Start ``sleep 60`` and wait for it (writes the worker's pid and the sleeper's)."""
    sleeper = subprocess.Popen(["sleep", "60"])
    Path(pid_file).write_text(f"{os.getpid()} {sleeper.pid}")
    sleeper.wait()
    return "woke"


def pid() -> int:
    """The worker's process id."""
    return os.getpid()


def script(messages: object, _tools: object) -> str:
    """``nap F`` → the nap tool, ``pid`` → the pid tool; then an answer with the result."""
    assert isinstance(messages, list)
    user = next(m for m in reversed(messages) if m.role == "user")
    words = str(user.content).split()
    if messages[-1].role == "tool":
        return f"done: {messages[-1].content}"
    if words[0] == "nap":
        return call("nap", pid_file=words[1])
    return call("pid")


@pytest.fixture
def agent() -> Iterator[Agent]:
    made = Agent(model=ScriptedModel(script))
    made.add_tool(Tool.from_function(nap, execution_mode="subprocess", timeout=120))
    made.add_tool(Tool.from_function(pid, execution_mode="subprocess", timeout=30))
    yield made
    made.close()


@pytest.fixture
def strays() -> Iterator[list[int]]:
    """Pids a test saw start: killed at teardown in case the sandbox failed to."""
    pids: list[int] = []
    yield pids
    for stray in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(stray, signal.SIGKILL)


# -- Agent.arun cancelled by its caller ------------------------------------------------------


def test_cancelling_arun_kills_the_sleeping_tool_process_at_once(
    agent: Agent, tmp_path: Path, strays: list[int]
) -> None:
    pid_file = tmp_path / "nap.pid"

    async def scenario() -> float:
        task = asyncio.create_task(agent.arun(f"nap {pid_file}"))
        await await_for(pid_file.exists, what="the nap tool running")
        strays.extend(read_pids(pid_file))
        started = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - started

    took = asyncio.run(scenario())
    worker, sleeper = strays
    assert took < 1.0  # not the 60 s the tool would sleep, nor its 120 s timeout
    assert gone_within(worker, 1.0)
    assert gone_within(sleeper, 1.0)  # started by the tool: killed with the worker's group
    # The pool goes on: the next call gets a new worker.
    result = agent.run("pid")
    assert result.tool_calls[0].status_code == 200
    assert result.tool_calls[0].result not in (worker, None)


def test_a_caller_timeout_around_arun_kills_the_tool_process(
    agent: Agent, tmp_path: Path, strays: list[int]
) -> None:
    pid_file = tmp_path / "nap.pid"

    async def scenario() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(agent.arun(f"nap {pid_file}"), timeout=1.0)

    started = time.monotonic()
    asyncio.run(scenario())
    assert time.monotonic() - started < 3.0
    strays.extend(read_pids(pid_file))
    assert all(gone_within(stray, 1.0) for stray in strays)


def test_cancelling_one_run_leaves_another_runs_tool_alone(tmp_path: Path) -> None:
    started = threading.Event()

    def hold(seconds: float) -> str:
        """Hold a worker for a while."""
        (tmp_path / f"holding {seconds}").touch()
        time.sleep(seconds)  # slow work on purpose: one of the two is cancelled meanwhile
        return f"held {os.getpid()}"

    def script(messages: object, _tools: object) -> str:
        assert isinstance(messages, list)
        if messages[-1].role == "tool":
            return f"done: {messages[-1].content}"
        return call("hold", seconds=float(str(messages[-1].content)))

    agent = Agent(model=ScriptedModel(script))
    agent.add_tool(Tool.from_function(hold, execution_mode="subprocess", timeout=30))

    async def scenario() -> str:
        doomed = asyncio.create_task(agent.arun("30"))
        kept = asyncio.create_task(agent.arun("1.5"))
        # Both tools run now (a pool of two workers).
        await await_for(lambda: len(list(tmp_path.glob("holding *"))) == 2, what="both tools")
        started.set()
        doomed.cancel()
        with pytest.raises(asyncio.CancelledError):
            await doomed
        result = await kept
        assert result.tool_calls[0].status_code == 200
        return str(result.tool_calls[0].result)

    try:
        held = asyncio.run(scenario())
        assert started.is_set()
        assert held.startswith("held ")
        survivor = int(held.split()[1])
        tool = agent.registry.get("hold")
        assert tool is not None
        assert agent.runtime.pool(tool).pids() == [survivor]
    finally:
        agent.close()


# -- Agent.run interrupted by Ctrl-C -----------------------------------------------------------


def test_ctrl_c_during_agent_run_kills_the_tool_process(tmp_path: Path, strays: list[int]) -> None:
    pid_file = tmp_path / "nap.pid"
    program = tmp_path / "interrupted.py"
    program.write_text(
        textwrap.dedent(
            f"""
            import json, os, signal, subprocess, sys, time
            from pathlib import Path

            # Ctrl-C as a terminal gives it, even where the tests were started in the
            # background (whose children inherit SIGINT ignored: no KeyboardInterrupt).
            signal.signal(signal.SIGINT, signal.default_int_handler)

            from hermes_agent import Agent, ScriptedModel, Tool

            def nap() -> str:
                \"\"\"Start a sleeper and wait for it.\"\"\"
                sleeper = subprocess.Popen(["sleep", "60"])
                Path({str(pid_file)!r}).write_text(f"{{os.getpid()}} {{sleeper.pid}}")
                sleeper.wait()
                return "woke"

            def gone(pid):
                try:
                    state = Path(f"/proc/{{pid}}/stat").read_text().rsplit(")", 1)[1].split()[0]
                except (FileNotFoundError, ProcessLookupError):  # reaped while read
                    return True
                return state in ("Z", "X")

            replies = [{call("nap")!r}, {call("nap")!r}, "after the timeout"]
            agent = Agent(model=ScriptedModel(replies))
            agent.add_tool(Tool.from_function(nap, execution_mode="subprocess", timeout=120))
            try:
                agent.run("nap")
            except KeyboardInterrupt:
                interrupted = time.monotonic()
            worker, sleeper = map(int, Path({str(pid_file)!r}).read_text().split())
            while not (gone(worker) and gone(sleeper)) and time.monotonic() - interrupted < 5:
                time.sleep(0.01)  # a bounded poll (5 s) in a program of its own
            report = {{"worker_gone": gone(worker), "sleeper_gone": gone(sleeper),
                       "seconds": time.monotonic() - interrupted}}
            # The agent still works: the next run starts a new worker (and is cut short by
            # its tool's timeout rather than waiting 60 s).
            agent.registry.get("nap").timeout = 0.5
            report["next_status"] = agent.run("nap again").tool_calls[0].status_code
            print(json.dumps(report))
            """
        )
    )
    process = subprocess.Popen(
        [sys.executable, str(program)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=tmp_path,
    )
    try:
        strays.extend(read_pids(pid_file, seconds=60))
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["worker_gone"] and report["sleeper_gone"], report
    assert report["seconds"] < 1.0
    assert report["next_status"] == 408


# -- the pool itself: Abort from another thread ------------------------------------------------


def slow(seconds: float) -> int:
    """Sleep, then return the worker's pid."""
    time.sleep(seconds)  # slow work on purpose: a call to abort, or to wait in line behind
    return os.getpid()


def marked(seconds: float, marker: str) -> int:
    """``slow``, once it has created the file ``marker`` (the test sees the call started)."""
    Path(marker).touch()
    return slow(seconds)


def test_an_aborted_pool_call_kills_its_worker_and_frees_its_slot(tmp_path: Path) -> None:
    pool = SubprocessPool(marked, Limits(), size=1)
    marker = str(tmp_path / "started")
    # A warm worker, back in the pool.
    first = pool.call({"seconds": 0, "marker": str(tmp_path / "warm")}, 10)
    assert pool.pids() == [first]
    abort = Abort()
    outcome: list[BaseException] = []

    def busy() -> None:
        try:
            pool.call({"seconds": 60, "marker": marker}, 120, abort=abort)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=busy)
    thread.start()
    wait_for(Path(marker).exists, what="the call running in the worker")
    started = time.monotonic()
    abort.abort()
    thread.join(5)
    assert not thread.is_alive()
    assert time.monotonic() - started < 1.0
    assert [type(exc) for exc in outcome] == [CallAborted]
    assert not alive(first)  # killed, and reaped by the calling thread
    assert pool.pids() == []  # never handed back
    # The one slot is free; a new worker serves.
    second = pool.call({"seconds": 0, "marker": str(tmp_path / "again")}, 10)
    assert second != first
    abort.abort()  # aborting a call that is over does nothing
    assert pool.pids() == [second] and alive(second)
    pool.close()


def test_an_abort_while_waiting_for_a_free_worker_leaves_the_line_only(tmp_path: Path) -> None:
    pool = SubprocessPool(marked, Limits(), size=1)
    marker = tmp_path / "holding"
    results: list[int] = []
    holder = threading.Thread(
        target=lambda: results.append(pool.call({"seconds": 1.5, "marker": str(marker)}, 10))
    )
    holder.start()
    wait_for(marker.exists, what="the first call holding the one worker")
    in_line = threading.Event()
    take_slot = pool._slots.acquire

    def watched(blocking: bool = True, timeout: float | None = None) -> bool:
        """The pool's wait for a slot, telling when the second call waits (its abort checked)."""
        if threading.current_thread() is waiter:
            in_line.set()
        return take_slot(blocking, timeout)

    pool._slots.acquire = watched  # type: ignore[method-assign]
    abort = Abort()
    outcome: list[BaseException] = []

    def wait_in_line() -> None:
        try:
            pool.call({"seconds": 0}, 60, abort=abort)
        except BaseException as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=wait_in_line)
    waiter.start()
    assert in_line.wait(10), "the second call never waited for a slot"
    started = time.monotonic()
    abort.abort()
    waiter.join(5)
    assert time.monotonic() - started < 0.5
    assert [type(exc) for exc in outcome] == [CallAborted]
    holder.join(10)
    assert len(results) == 1 and alive(results[0])  # the busy call finished undisturbed
    assert pool.pids() == results
    pool.close()


def test_an_abort_before_the_call_starts_uses_no_worker() -> None:
    pool = SubprocessPool(slow, Limits(), size=1)
    warm = pool.call({"seconds": 0}, 10)
    abort = Abort()
    abort.abort()
    with pytest.raises(CallAborted):
        pool.call({"seconds": 0}, 10, abort=abort)
    assert pool.pids() == [warm] and alive(warm)
    pool.close()


def test_acall_timeouts_are_unchanged() -> None:
    pool = SubprocessPool(slow, Limits(), size=1)

    async def scenario() -> None:
        with pytest.raises(TimeoutError, match=r"^no result within 0.5 s$"):
            await pool.acall({"seconds": 60}, 0.5)
        assert await pool.acall({"seconds": 0}, 10) > 0

    started = time.monotonic()
    asyncio.run(scenario())
    assert time.monotonic() - started < 5
    pool.close()
