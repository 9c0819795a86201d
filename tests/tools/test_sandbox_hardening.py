"""Attacks on the subprocess sandbox, each performed for real, and what the agent does now.

- a result whose unpickling would run code in the agent (only JSON data crosses back);
- processes a tool starts outliving the timeout, ``close()`` and interpreter exit;
- a worker that wedges the agent through its pipe (half a frame, a huge frame, garbage);
- a CPU-time-limit kill reported as a plain SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from hermes_agent import Agent, Tool
from hermes_agent.testing import tool_call as call
from hermes_agent.tools.sandbox import Limits, SubprocessPool, ToolProcessError
from processes import alive, gone_within
from server_harness import scripted, wait_for


def read_pid(path: Path, seconds: float = 10) -> int:
    text = wait_for(lambda: path.exists() and path.read_text().strip(), seconds, f"{path} written")
    return int(text)


@pytest.fixture
def strays() -> Iterator[list[int]]:
    """Pids a test started through a tool: killed at teardown if the sandbox failed to."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


# -- 1. only plain data crosses the boundary ----------------------------------------------------


def write_marker(path: str) -> None:
    """What the attacker wants run in the agent's process: here, it leaves a file behind."""
    Path(path).write_text(str(os.getpid()))


class Payload:
    """An object whose unpickling calls ``write_marker``."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return write_marker, (self.marker,)


def test_a_result_whose_unpickling_runs_code_never_runs_it_in_the_agent(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    def exploit(marker: str) -> object:
        """Returns an object that runs code when unpickled."""
        return Payload(marker)

    def nested(marker: str) -> object:
        """Hides the same object inside plain data."""
        return {"rows": [1, {"cell": Payload(marker)}]}

    agent = Agent(
        model=scripted(
            call("exploit", marker=str(marker)), call("nested", marker=str(marker)), "done"
        )
    )
    agent.add_tool(Tool.from_function(exploit, execution_mode="subprocess"))
    agent.add_tool(Tool.from_function(nested, execution_mode="subprocess"))
    result = agent.run("go")
    agent.close()

    assert not marker.exists()  # the code ran nowhere: not in the agent, not in the worker
    direct, hidden = result.tool_calls
    assert direct.status_code == 500 and hidden.status_code == 500
    type_name = f"{Payload.__module__}.Payload"
    assert direct.error == (
        f"tool 'exploit' failed in its process: the tool returned a {type_name} (at result), "
        "which cannot leave its process: only JSON data (dict, list, str, int, float, bool, "
        "None) can; convert it first"
    )
    assert f"the tool returned a {type_name} (at result['rows'][1]['cell'])" in (hidden.error or "")
    assert result.output == "done"


def test_json_data_comes_back_as_json_would_have_it() -> None:
    def plain() -> object:
        """Returns every kind of JSON value, a tuple and a non-string key."""
        return {
            "text": "héllo \ud800 \x00",
            "numbers": (1, 2.5, -3),
            "flags": [True, False, None],
            7: {"nested": [[]]},
        }

    agent = Agent(model=scripted(call("plain"), "done"))
    agent.add_tool(Tool.from_function(plain, execution_mode="subprocess"))
    result = agent.run("go")
    agent.close()
    assert result.tool_calls[0].status_code == 200
    assert result.tool_calls[0].result == {
        "text": "héllo \ud800 \x00",
        "numbers": [1, 2.5, -3],
        "flags": [True, False, None],
        "7": {"nested": [[]]},
    }


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({1, 2}, "the tool returned a set (at result)"),
        (
            {"when": datetime(2024, 1, 1)},
            "the tool returned a datetime.datetime (at result['when'])",
        ),
        ([b"raw"], "the tool returned a bytes (at result[0])"),
        ({("a", "b"): 1}, "the result cannot be sent back as JSON: TypeError: keys must be"),
    ],
)
def test_values_that_are_not_json_data_are_errors_naming_their_type(
    value: object, expected: str
) -> None:
    pool = SubprocessPool(lambda: value, Limits())
    with pytest.raises(ToolProcessError) as raised:
        pool.call({}, 10)
    pool.close()
    assert str(raised.value).startswith(expected), str(raised.value)


def test_circular_and_too_deep_results_are_errors_and_the_next_call_works() -> None:
    circular: list[object] = []
    circular.append(circular)
    deep: list[object] = []
    for _ in range(100_000):
        deep = [deep]
    values = iter([circular, deep, "fine"])
    pool = SubprocessPool(lambda: next(values), Limits(), size=1)
    with pytest.raises(ToolProcessError, match="Circular reference detected"):
        pool.call({}, 10)
    # The worker that failed was replaced; a new fork starts from the same iterator state.
    values = iter([deep, "fine"])
    with pytest.raises(ToolProcessError, match="nested too deeply"):
        pool.call({}, 10)
    values = iter(["fine"])
    assert pool.call({}, 10) == "fine"
    pool.close()


# -- 6. every read is bounded: half frames, huge frames, garbage ----------------------------------


def worker_socket() -> socket.socket:
    """From inside a tool: the worker's own socket to the agent, as hostile code could find it."""
    frame = sys._getframe()
    while frame is not None:
        if frame.f_code.co_name == "_serve":
            connection = frame.f_locals["connection"]
            assert isinstance(connection, socket.socket)
            return connection
        frame = frame.f_back  # type: ignore[assignment]
    raise AssertionError("not running in a sandbox worker")


def test_a_worker_that_sends_half_a_frame_is_killed_at_the_deadline(tmp_path: Path) -> None:
    pid_file = tmp_path / "worker.pid"

    def wedge() -> str:
        """Announces a 100-byte reply, sends 10 bytes of it, then nothing."""
        pid_file.write_text(str(os.getpid()))
        worker_socket().sendall((100).to_bytes(8, "big") + b"x" * 10)
        time.sleep(3600)  # a tool that hangs: the pool must end it
        return "never"

    agent = Agent(model=scripted(call("wedge"), "it hung"))
    agent.add_tool(Tool.from_function(wedge, execution_mode="subprocess", timeout=1))
    started = time.monotonic()
    result = agent.run("go")
    elapsed = time.monotonic() - started
    agent.close()
    assert result.tool_calls[0].status_code == 408
    assert result.tool_calls[0].error == "tool 'wedge' timed out after 1 s"
    assert elapsed < 1 + 1.5, elapsed  # not the executor's outer bound (timeout + 5 s)
    assert gone_within(read_pid(pid_file), 2)


def test_a_header_then_silence_does_not_block_the_calling_thread(tmp_path: Path) -> None:
    pid_file = tmp_path / "worker.pid"

    def header_only() -> str:
        """Sends a length header and nothing after it."""
        pid_file.write_text(str(os.getpid()))
        worker_socket().sendall((16).to_bytes(8, "big"))
        time.sleep(3600)  # a tool that hangs: the pool must end it
        return "never"

    pool = SubprocessPool(header_only, Limits())
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            pool.call({}, 0.5)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(3)
    assert not thread.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], TimeoutError)
    assert str(outcome[0]) == "no result within 0.5 s"
    assert gone_within(read_pid(pid_file), 2)
    assert pool.pids() == []


def test_a_frame_over_the_size_bound_is_refused_at_once(tmp_path: Path) -> None:
    pid_file = tmp_path / "worker.pid"

    def huge() -> str:
        """Announces a reply of a terabyte."""
        pid_file.write_text(str(os.getpid()))
        worker_socket().sendall((2**40).to_bytes(8, "big"))
        time.sleep(3600)  # a tool that hangs: the pool must end it
        return "never"

    pool = SubprocessPool(huge, Limits())
    started = time.monotonic()
    with pytest.raises(ToolProcessError) as raised:
        pool.call({}, 30)
    assert time.monotonic() - started < 5
    assert str(raised.value) == (
        "the reply is 1,099,511,627,776 bytes as JSON, over the limit of 67,108,864 bytes; "
        "return less (or raise max_frame_bytes)"
    )
    assert gone_within(read_pid(pid_file), 2)


def test_results_and_arguments_over_the_size_bound_are_errors() -> None:
    pool = SubprocessPool(lambda text: text * 2, Limits(), max_frame_bytes=1000)
    assert pool.call({"text": "ab"}, 10) == "abab"
    with pytest.raises(ToolProcessError, match=r"^the result is 1,0\d\d bytes as JSON, over"):
        pool.call({"text": "x" * 490}, 10)
    with pytest.raises(ToolProcessError, match=r"^the arguments are 2,0\d\d bytes as JSON, over"):
        pool.call({"text": "x" * 2000}, 10)
    pool.close()


def test_a_reply_that_is_not_json_is_an_error_and_ends_the_worker(tmp_path: Path) -> None:
    pid_file = tmp_path / "worker.pid"

    def garbage() -> str:
        """Sends a frame that is a pickle, not JSON."""
        import pickle

        pid_file.write_text(str(os.getpid()))
        body = pickle.dumps(Payload(str(tmp_path / "pwned")))
        worker_socket().sendall(len(body).to_bytes(8, "big") + body)
        time.sleep(3600)  # a tool that hangs: the pool must end it
        return "never"

    pool = SubprocessPool(garbage, Limits())
    with pytest.raises(ToolProcessError, match=r"^the tool process sent a reply that is not JSON"):
        pool.call({}, 30)
    assert not (tmp_path / "pwned").exists()
    assert gone_within(read_pid(pid_file), 2)


def test_a_dead_worker_is_noticed_even_when_a_process_it_forked_holds_its_socket(
    tmp_path: Path, strays: list[int]
) -> None:
    child_file = tmp_path / "child.pid"

    def die_leaving_a_child() -> str:
        """Forks a copy of itself (which keeps the socket open), then exits."""
        child = os.fork()
        if child == 0:
            time.sleep(60)  # a child that outlives its parent, holding the socket open
            os._exit(0)
        child_file.write_text(str(child))
        os._exit(3)

    pool = SubprocessPool(die_leaving_a_child, Limits())
    started = time.monotonic()
    with pytest.raises(ToolProcessError) as raised:
        pool.call({}, 30)
    strays.append(read_pid(child_file))
    assert str(raised.value) == "the tool process exited with code 3"
    assert time.monotonic() - started < 5  # not the 30 s timeout
    assert gone_within(strays[0], 2)  # and the child went with its group


def test_waiting_for_a_free_worker_counts_against_the_timeout(tmp_path: Path) -> None:
    running = tmp_path / "running"

    def slow() -> str:
        """Takes 2 s."""
        running.touch()
        time.sleep(2)  # slow work on purpose: the one worker stays busy
        return "slow"

    pool = SubprocessPool(slow, Limits(), size=1)

    def occupy() -> None:
        pool.call({}, 10)

    busy = threading.Thread(target=occupy)
    busy.start()
    wait_for(running.exists, what="the first call running in the one worker")
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"^no worker of this tool was free within 0.5 s$"):
        pool.call({}, 0.5)
    assert time.monotonic() - started < 1.5
    busy.join(10)
    pool.close()


# -- 5. processes a tool starts die with its worker ---------------------------------------------


def start_sleeper(pid_file: str, how: str) -> None:
    """Start ``sleep 60`` as a grandchild of the worker, the way ``how`` says."""
    if how == "fork":
        child = os.fork()
        if child == 0:
            os.execvp("sleep", ["sleep", "60"])
    else:
        child = subprocess.Popen(["sleep", "60"]).pid
    Path(pid_file).write_text(str(child))


@pytest.mark.parametrize("how", ["fork", "subprocess"])
def test_a_grandchild_dies_with_a_worker_that_timed_out(
    tmp_path: Path, strays: list[int], how: str
) -> None:
    pid_file = tmp_path / "sleeper.pid"

    def spawn_and_hang(how: str) -> str:
        """Starts a sleeper, then hangs."""
        start_sleeper(str(pid_file), how)
        time.sleep(3600)  # a tool that hangs: the pool must end it
        return "never"

    agent = Agent(model=scripted(call("spawn_and_hang", how=how), "it hung"))
    agent.add_tool(Tool.from_function(spawn_and_hang, execution_mode="subprocess", timeout=1))
    result = agent.run("go")
    strays.append(read_pid(pid_file))
    assert result.tool_calls[0].status_code == 408
    assert gone_within(strays[0], 2)
    agent.close()


def test_a_grandchild_dies_when_the_agent_closes(tmp_path: Path, strays: list[int]) -> None:
    pid_file = tmp_path / "sleeper.pid"

    def spawn(how: str) -> str:
        """Starts a sleeper and returns at once."""
        start_sleeper(str(pid_file), how)
        return "started"

    agent = Agent(model=scripted(call("spawn", how="fork"), "started"))
    agent.add_tool(Tool.from_function(spawn, execution_mode="subprocess"))
    result = agent.run("go")
    strays.append(read_pid(pid_file))
    assert result.tool_calls[0].result == "started"
    assert alive(strays[0])  # the worker is idle in its pool, the sleeper still runs
    agent.close()
    assert gone_within(strays[0], 2)


def test_a_grandchild_dies_at_interpreter_exit(tmp_path: Path, strays: list[int]) -> None:
    pid_file = tmp_path / "sleeper.pid"
    script = tmp_path / "leave.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import subprocess
            from pathlib import Path

            from hermes_agent import Agent, ScriptedModel, Tool

            def spawn() -> str:
                \"\"\"Starts a sleeper and returns at once.\"\"\"
                sleeper = subprocess.Popen(
                    ["sleep", "60"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
                Path({str(pid_file)!r}).write_text(str(sleeper.pid))
                return "started"

            agent = Agent(model=ScriptedModel([{call("spawn")!r}, "started"]))
            agent.add_tool(Tool.from_function(spawn, execution_mode="subprocess"))
            print(agent.run("go").tool_calls[0].result)
            # exits without agent.close(): the worker and its sleeper are still running
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "started"
    strays.append(read_pid(pid_file))
    assert gone_within(strays[0], 2)


# -- 16. a CPU-time-limit kill says so -------------------------------------------------------------


def burn() -> str:
    """Spins forever."""
    while True:
        pass


def burn_ignoring_sigxcpu() -> str:
    """Spins forever, deaf to the soft CPU limit's SIGXCPU."""
    signal.signal(signal.SIGXCPU, signal.SIG_IGN)
    while True:
        pass


def test_a_cpu_time_limit_kill_names_the_limit() -> None:
    agent = Agent(model=scripted(call("burn"), call("burn_ignoring_sigxcpu"), "done"))
    for function in (burn, burn_ignoring_sigxcpu):
        agent.add_tool(
            Tool.from_function(
                function, execution_mode="subprocess", cpu_time_limit_s=1, timeout=60
            )
        )
    result = agent.run("go")
    agent.close()
    soft, hard = result.tool_calls
    assert (soft.status_code, hard.status_code) == (500, 500)
    assert soft.error == (
        "tool 'burn' failed in its process: the tool process went past its CPU time limit "
        "of 1 s (killed by SIGXCPU)"
    )
    assert hard.error == (
        "tool 'burn_ignoring_sigxcpu' failed in its process: the tool process went past its "
        "CPU time limit of 1 s (killed by SIGKILL)"
    )


def test_a_worker_that_used_a_tenth_of_its_cpu_budget_is_replaced() -> None:
    def spin_a_little() -> int:
        """Uses 0.2 s of CPU, returns its pid."""
        until = time.process_time() + 0.2
        while time.process_time() < until:
            pass
        return os.getpid()

    limited = SubprocessPool(spin_a_little, Limits(cpu_seconds=1), size=1)
    first, second = limited.call({}, 30), limited.call({}, 30)
    assert first != second and limited.pids() == []
    limited.close()
    unlimited = SubprocessPool(spin_a_little, Limits(), size=1)
    assert unlimited.call({}, 30) == unlimited.call({}, 30)  # reused: no budget to run out of
    unlimited.close()


def test_the_pool_works_in_a_host_that_ignores_sigchld() -> None:
    def pid() -> int:
        """The worker's pid."""
        return os.getpid()

    def hang() -> None:
        """Never returns."""
        time.sleep(3600)  # a tool that hangs: the pool must end it

    previous = signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped unasked
    try:
        pool = SubprocessPool(pid, Limits())
        first = pool.call({}, 10)
        assert pool.call({}, 10) == first  # the worker was not mistaken for a dead one
        pool.close()
        assert gone_within(first, 2)
        hanging = SubprocessPool(hang, Limits())
        with pytest.raises(TimeoutError):
            hanging.call({}, 0.5)
    finally:
        signal.signal(signal.SIGCHLD, previous)
