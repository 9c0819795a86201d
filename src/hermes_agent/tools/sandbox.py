"""Subprocess execution for tools that must not be trusted with the agent's process.

A tool with ``execution_mode: subprocess`` runs in a worker process of its own pool. Workers are
forked from the agent process when first needed, so they inherit the tool's function as it is
(closures and all) and keep running for later calls (a pooled call costs a socket round trip, not
a process start). Limits are applied in the worker with ``resource.setrlimit`` before any call:
address space (memory) and CPU time; core dumps are off, so a crash never writes the agent's
memory to disk.

What crosses the boundary is JSON and nothing else: arguments go to the worker as JSON, and the
worker sends its reply as JSON in a length-prefixed frame of at most ``max_frame_bytes``. The
agent decodes it with ``json.loads``, which can build dicts, lists, strings, numbers, booleans
and ``None`` but no other object, so nothing a tool returns can run code in the agent's process.

What can happen to a call, and what the agent sees:

- it returns JSON data → that data (tuples arrive as lists, dict keys as strings);
- it returns anything else (a ``set``, a ``datetime``, an object with ``__reduce__``...) →
  ``ToolProcessError`` naming the type and where in the result it was (500);
- it raises (``MemoryError`` past the memory limit included) → ``ToolProcessError`` (500);
- it runs past its timeout, or its worker sends half a frame and stops → the worker's process
  group is killed with SIGKILL and the worker reaped → ``TimeoutError`` (408);
- the worker dies (``os._exit``, a segfault, the CPU limit) → ``ToolProcessError`` naming the
  exit code or signal, or saying it went past its CPU time limit (500);
- it sends a frame over the size bound or that is not a valid reply → ``ToolProcessError`` (500);
- the caller gives up on it (the run awaiting ``acall`` is cancelled, or ``Abort.abort()`` is
  called from any thread) → the worker's process group is killed with SIGKILL at once, not when
  the tool returns, and the call ends with ``CallAborted``; a call still waiting for a free
  worker leaves the line without starting one.

Each worker leads a session (and process group) of its own, and whenever a worker is killed —
on timeout, on a failed call, on ``close()`` and at interpreter exit — the whole group is
killed, so processes a tool started (``subprocess``, ``os.fork``) go with it. A process that
leaves the group itself (``setsid``) is out of reach; a container or cgroup is the tool for that.

A dead or killed worker is replaced on the next call, and so is one that has used a tenth of
its CPU time budget (the kernel counts CPU time per process, not per call). Forking a process
that runs threads is safe here because the worker only ever runs the tool function and talks
over its own socket.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import json
import math
import os
import resource
import select
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from hermes_agent.errors import HermesAgentError

MAX_FRAME_BYTES = 64 * 1024 * 1024
"""Default bound on one message between the agent and a worker (arguments or reply)."""

_HEADER = struct.Struct(">Q")  # the length of the JSON body that follows, in bytes
_CHUNK = 1024 * 1024
_CHECK_INTERVAL = 0.05  # a waiting read looks this often whether the worker is still there
_EXIT_GRACE = 1.0  # a worker whose socket closed gets this long to finish exiting by itself
_REAP_WAIT = 5.0  # how long a SIGKILLed worker may take to be reaped
_CPU_REUSE_SHARE = 0.1  # a worker that used this share of its CPU budget is replaced
_MAX_ERROR_CHARS = 100_000
_STUCK_GRACE = 5.0  # ``acall`` gives up this long after the timeout (a pool that cannot fork)


class ToolProcessError(HermesAgentError):
    """The tool failed inside its worker process (raised, died, or sent what is not data)."""


class CallAborted(HermesAgentError):
    """The caller aborted the call (``Abort.abort``); its worker, if it had one, was killed."""


class Abort:
    """Stops one ``SubprocessPool.call`` from another thread (``acall`` makes and uses one).

    ``abort()`` never blocks: it sends SIGKILL to the process group of the worker the call is
    using, if any, and marks the call, which then ends with ``CallAborted`` (within
    ``_CHECK_INTERVAL`` when it was still waiting for a free worker). The calling thread reaps
    the worker, and the pool starts a new one for its next call. Aborting a call that is over
    does nothing.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._aborted = False
        self._worker: _Worker | None = None

    @property
    def aborted(self) -> bool:
        return self._aborted

    def abort(self) -> None:
        # Under the lock: the call cannot hand its worker back to the pool (and so to another
        # call) between the check and the signal.
        with self._lock:
            self._aborted = True
            if self._worker is not None:
                self._worker.interrupt()

    def _attach(self, worker: _Worker) -> bool:
        """The call now uses ``worker``; False when it was aborted already."""
        with self._lock:
            if self._aborted:
                return False
            self._worker = worker
            return True

    def _detach(self) -> bool:
        """The call is done with its worker; False when it was aborted meanwhile (the worker
        may have been signalled and must not go back to the pool)."""
        with self._lock:
            self._worker = None
            return not self._aborted

    def _check(self) -> None:
        if self._aborted:
            raise CallAborted("the call was aborted")


@dataclass(frozen=True, slots=True)
class Limits:
    """Resource limits of a tool's worker processes (``None``: no limit)."""

    memory_mb: int | None = None
    cpu_seconds: int | None = None


# Every worker forked by this process and not yet reaped, by pid (which is also its process
# group id). Forks happen under the lock, so no worker inherits another's end of a socket, and
# what is left at interpreter exit is killed, group and all.
_LIVE: dict[int, _Worker] = {}
_LIVE_LOCK = threading.Lock()


class _Worker:
    """One forked worker process and the agent's end of its socket."""

    def __init__(self, function: Callable[..., Any], limits: Limits, max_frame: int) -> None:
        self.limits = limits
        self.max_frame = max_frame
        self.cpu_used = 0.0  # as the worker last reported it
        self._lock = threading.Lock()
        self._reaped = False
        self._status: int | None = None  # exit code, or -signal, once reaped
        self._rusage: resource.struct_rusage | None = None
        with _LIVE_LOCK:
            ours, theirs = socket.socketpair()
            pid = os.fork()
            if pid == 0:  # the worker; _run_worker never returns
                ours.close()
                _run_worker(function, limits, theirs, max_frame)
            theirs.close()
            ours.setblocking(False)
            self.socket = ours
            self.pid = pid
            _LIVE[pid] = self

    # -- one call -----------------------------------------------------------------------

    def call(
        self, arguments: dict[str, Any], deadline: float, timeout: float, abort: Abort | None = None
    ) -> Any:
        """Send the arguments and wait for the reply, never past ``deadline`` (monotonic), and
        no longer than ``abort`` allows."""
        try:
            body = json.dumps({"arguments": arguments}, default=_refuse).encode("ascii")
        except (TypeError, ValueError) as exc:
            raise ToolProcessError(f"the arguments are not JSON data: {exc}") from None
        if len(body) > self.max_frame:
            raise ToolProcessError(_too_big("the arguments are", len(body), self.max_frame))
        try:
            self._send(_HEADER.pack(len(body)) + body, deadline, abort)
            header = self._receive(_HEADER.size, deadline, abort)
            (size,) = _HEADER.unpack(header)
            if size > self.max_frame:
                raise ToolProcessError(_too_big("the reply is", size, self.max_frame))
            frame = self._receive(size, deadline, abort)
        except TimeoutError:
            self.kill()
            raise TimeoutError(f"no result within {timeout:g} s") from None
        except CallAborted:
            self.kill()
            raise
        except (_Gone, OSError, ValueError):  # ValueError: the socket was closed under us
            if abort is not None and abort.aborted:  # it died of the abort's SIGKILL
                self.kill()
                raise CallAborted("the call was aborted; its process was killed") from None
            raise ToolProcessError(self._death()) from None
        ok, payload, cpu = _decode_reply(frame)
        self.cpu_used = cpu
        if not ok:
            raise ToolProcessError(payload)
        return payload

    def _send(self, data: bytes, deadline: float, abort: Abort | None) -> None:
        view = memoryview(data)
        while view:
            self._wait(select.POLLOUT, deadline, abort)
            try:
                sent = self.socket.send(view)
            except BlockingIOError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                raise _Gone from None
            view = view[sent:]

    def _receive(self, size: int, deadline: float, abort: Abort | None) -> bytes:
        """Exactly ``size`` bytes, read as they come (memory grows with what actually arrived)."""
        chunks: list[bytes] = []
        missing = size
        while missing:
            self._wait(select.POLLIN, deadline, abort)
            try:
                chunk = self.socket.recv(min(missing, _CHUNK))
            except BlockingIOError:
                continue
            except ConnectionResetError:
                raise _Gone from None
            if not chunk:
                raise _Gone
            chunks.append(chunk)
            missing -= len(chunk)
        return b"".join(chunks)

    def _wait(self, event: int, deadline: float, abort: Abort | None) -> None:
        """Until the socket is ready for ``event``; TimeoutError at the deadline, _Gone when
        the worker has exited (a process it forked may still hold its end of the socket),
        CallAborted once ``abort`` says so."""
        poller = select.poll()
        poller.register(self.socket, event)
        while True:
            if abort is not None:
                abort._check()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            if poller.poll(math.ceil(min(remaining, _CHECK_INTERVAL) * 1000)):
                return
            if self._exited():
                raise _Gone

    # -- life and death -----------------------------------------------------------------

    def alive(self) -> bool:
        return not self._exited()

    def spent(self) -> bool:
        """Whether the worker used enough of its CPU budget that a new one should take over."""
        limit = self.limits.cpu_seconds
        return limit is not None and self.cpu_used >= limit * _CPU_REUSE_SHARE

    def interrupt(self) -> None:
        """SIGKILL the worker's process group now, from any thread, without waiting or reaping
        (the thread using the worker does that). Skipped while ``kill`` runs: it kills too."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            if not self._reaped:  # unreaped, the pid (and group id) cannot belong to another
                _kill_group(self.pid)
        finally:
            self._lock.release()

    def kill(self) -> None:
        """SIGKILL the worker's process group, reap the worker, close the socket. Idempotent."""
        with self._lock:
            if not self._reaped:
                _kill_group(self.pid)
                self._reap(_REAP_WAIT)
                # A process forked in the instant before the worker made its own group, or
                # still in the group after the leader went: the group id stays reserved
                # while any member lives, so this cannot reach anyone else.
                _kill_group(self.pid, leader_too=False)
            self.socket.close()

    def _exited(self) -> bool:
        """Whether the worker has ended, without reaping it (so its group id stays reserved)."""
        if self._reaped:
            return True
        waitid = getattr(os, "waitid", None)
        if waitid is None:  # no waitid (macOS): signal 0 cannot tell a zombie apart
            return False
        try:
            result = waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # SIGCHLD ignored: the kernel reaps, so no zombie to see
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return True
            return False
        return result is not None

    def _reap(self, wait: float) -> None:
        until = time.monotonic() + wait
        while True:
            try:
                pid, status, rusage = os.wait4(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere (SIGCHLD ignored): status unknown
                break
            if pid:
                self._status = os.waitstatus_to_exitcode(status)
                self._rusage = rusage
                break
            if time.monotonic() >= until:
                return  # unkillable for now (uninterruptible sleep); stays in _LIVE
            time.sleep(0.005)
        self._reaped = True
        with _LIVE_LOCK:
            _LIVE.pop(self.pid, None)

    def _death(self) -> str:
        """Why the worker stopped answering; kills what is left of it."""
        until = time.monotonic() + _EXIT_GRACE
        while not self._exited() and time.monotonic() < until:
            time.sleep(0.01)
        by_itself = self._exited()
        self.kill()
        if not by_itself:
            return "the tool process closed its end of the pipe and stopped answering"
        cpu = None
        if self._rusage is not None:
            cpu = self._rusage.ru_utime + self._rusage.ru_stime
        return _death(self._status, cpu, self.limits)


class _Gone(Exception):
    """The worker exited or closed its socket."""


class SubprocessPool:
    """Up to ``size`` worker processes for one tool; each call borrows one.

    ``max_frame_bytes`` bounds one message in either direction (the JSON of the arguments or of
    the reply); a larger one is an error, and a worker that claims to send one is killed.
    """

    def __init__(
        self,
        function: Callable[..., Any],
        limits: Limits,
        size: int = 2,
        *,
        max_frame_bytes: int = MAX_FRAME_BYTES,
    ) -> None:
        self.function = function
        self.limits = limits
        self.size = max(1, size)
        self.max_frame_bytes = max_frame_bytes
        self._idle: list[_Worker] = []
        self._closed = False
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(self.size)

    def call(self, arguments: dict[str, Any], timeout: float, *, abort: Abort | None = None) -> Any:
        """Run the tool with ``arguments`` in a worker (blocking; call it from a thread).

        ``timeout`` covers everything: waiting for a free worker, sending, running, replying.
        ``abort`` lets another thread stop the call (and kill its worker) before that.
        """
        deadline = time.monotonic() + timeout
        if not self._take_slot(deadline, abort):
            raise TimeoutError(f"no worker of this tool was free within {timeout:g} s")
        try:
            worker = self._borrow()
            if abort is not None and not abort._attach(worker):
                self._give_back(worker)  # it never received the call: still as good as new
                raise CallAborted("the call was aborted before it started")
            try:
                result = worker.call(arguments, deadline, timeout, abort)
            except BaseException:
                worker.kill()  # its state is unknown after a failure mid-call
                raise
            finally:
                intact = abort is None or abort._detach()
            if not intact:  # aborted as the reply came: the worker may have been signalled
                worker.kill()
                raise CallAborted("the call was aborted; its process was killed")
            if worker.spent():
                worker.kill()
            else:
                self._give_back(worker)
            return result
        finally:
            self._slots.release()

    async def acall(
        self, arguments: dict[str, Any], timeout: float, executor: Executor | None = None
    ) -> Any:
        """``call`` from async code, on a thread of ``executor`` (the loop's default one when
        ``None``). Cancelling the task that awaits it aborts the call: the worker is killed
        at once, with its process group, and the pool starts a new one for the next call.

        The call enforces ``timeout`` itself; the bound here, a little longer, only covers a
        thread that cannot even start the call (an executor with no free thread, a fork that
        hangs), and aborts the call too.
        """
        abort = Abort()
        call = functools.partial(self.call, arguments, timeout, abort=abort)
        running = asyncio.get_running_loop().run_in_executor(executor, call)
        try:
            async with asyncio.timeout(timeout + _STUCK_GRACE):
                return await running
        except BaseException:
            abort.abort()  # nobody waits for the call any more (no effect once it is over)
            raise

    def _take_slot(self, deadline: float, abort: Abort | None) -> bool:
        """Wait for a free worker slot until ``deadline``; an aborted wait raises CallAborted."""
        if abort is None:
            return self._slots.acquire(timeout=max(0.0, deadline - time.monotonic()))
        while True:
            abort._check()
            remaining = deadline - time.monotonic()
            if self._slots.acquire(timeout=max(0.0, min(remaining, _CHECK_INTERVAL))):
                if abort.aborted:
                    self._slots.release()
                    abort._check()
                return True
            if remaining <= _CHECK_INTERVAL:
                return False

    def _borrow(self) -> _Worker:
        with self._lock:
            self._closed = False  # a closed pool used again starts workers again
            while self._idle:
                worker = self._idle.pop()
                if worker.alive():
                    return worker
                worker.kill()  # reaps it, and ends whatever it left running
        return _Worker(self.function, self.limits, self.max_frame_bytes)

    def _give_back(self, worker: _Worker) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(worker)
                return
        worker.kill()  # the pool closed while this worker was busy

    def close(self) -> None:
        """Kill every idle worker and its process group; a busy one when its call returns."""
        with self._lock:
            self._closed = True
            workers, self._idle = self._idle, []
        for worker in workers:
            worker.kill()

    def pids(self) -> list[int]:
        """The process ids of the idle workers."""
        with self._lock:
            return [worker.pid for worker in self._idle]


@atexit.register
def _kill_all_workers() -> None:
    """At interpreter exit, no worker (nor anything it started) outlives the agent."""
    with _LIVE_LOCK:
        workers = list(_LIVE.values())
    for worker in workers:
        worker.kill()


def _kill_group(pid: int, *, leader_too: bool = True) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:  # no such group (yet): the worker has not called setsid
        if leader_too:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    except PermissionError:  # cannot happen for our own group; never worth a crash
        pass


# -- the worker side ------------------------------------------------------------------------


def _run_worker(
    function: Callable[..., Any], limits: Limits, connection: socket.socket, max_frame: int
) -> None:
    """The forked child: its own session, limits, then calls until the socket closes.

    Leaves with ``os._exit`` whatever happens: it must never return into the agent's code or
    run the agent's exit handlers.
    """
    global _LIVE_LOCK
    code = 0
    try:
        os.setsid()  # first, before any tool code can start a process
        _LIVE_LOCK = threading.Lock()  # the agent held it to fork; a tool may fork workers too
        for other in _LIVE.values():  # the agent's ends of other workers' sockets
            other.socket.close()
        _LIVE.clear()
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the agent's to handle
        signal.signal(signal.SIGXCPU, signal.SIG_DFL)  # the soft CPU limit ends the worker
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        _apply_limits(limits)
        _serve(function, connection, max_frame)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):  # a closed or broken stream
                stream.flush()
        os._exit(code)


def _apply_limits(limits: Limits) -> None:
    _lower_limit(resource.RLIMIT_CORE, 0, 0)
    if limits.memory_mb is not None:
        size = limits.memory_mb * 1024 * 1024
        _lower_limit(resource.RLIMIT_AS, size, size)
    if limits.cpu_seconds is not None:
        # Soft below hard: at the soft limit the kernel sends SIGXCPU, which names the cause;
        # equal limits would make it a bare SIGKILL. A tool that ignores SIGXCPU is SIGKILLed
        # a second later, and the agent still recognises it from the CPU time the worker used.
        _lower_limit(resource.RLIMIT_CPU, limits.cpu_seconds, limits.cpu_seconds + 1)


def _lower_limit(kind: int, soft: int, hard: int) -> None:
    """Set a limit, never above the hard limit already in force (raising it is not allowed)."""
    _, current = resource.getrlimit(kind)
    if current != resource.RLIM_INFINITY:
        hard = min(hard, current)
        soft = min(soft, hard)
    resource.setrlimit(kind, (soft, hard))


def _serve(function: Callable[..., Any], connection: socket.socket, max_frame: int) -> None:
    while True:
        request = _read_frame(connection, max_frame)
        if request is None:
            return
        arguments = json.loads(request)["arguments"]
        try:
            reply = _value_reply(function(**arguments), max_frame)
        except MemoryError:
            reply = _error_reply("MemoryError: the tool went past its memory limit")
        except BaseException as exc:  # SystemExit from the tool too: report it, keep serving
            reply = _error_reply(_describe(exc))
        connection.sendall(_HEADER.pack(len(reply)))
        connection.sendall(reply)


def _read_frame(connection: socket.socket, max_frame: int) -> bytes | None:
    """The next request, or None when the agent closed its end."""
    header = _read_exactly(connection, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > max_frame:
        return None
    return _read_exactly(connection, size)


def _read_exactly(connection: socket.socket, size: int) -> bytes | None:
    chunks: list[bytes] = []
    missing = size
    while missing:
        chunk = connection.recv(min(missing, _CHUNK))
        if not chunk:
            return None
        chunks.append(chunk)
        missing -= len(chunk)
    return b"".join(chunks)


def _value_reply(value: Any, max_frame: int) -> bytes:
    try:
        body = _dumps({"ok": True, "value": value, "cpu": _cpu_used()})
    except _NotData as exc:
        where = _where(value, "result") or "result"
        return _error_reply(
            f"the tool returned a {exc.type_name} (at {where}), which cannot leave its process: "
            "only JSON data (dict, list, str, int, float, bool, None) can; convert it first"
        )
    except MemoryError:
        return _error_reply("MemoryError: the result did not fit in the memory limit")
    except RecursionError:
        return _error_reply("the result is nested too deeply to send back as JSON")
    except ValueError as exc:  # a circular reference
        return _error_reply(f"the result cannot be sent back as JSON: {exc}")
    except Exception as exc:  # a dict key of the wrong type, or a subclass that raised
        return _error_reply(f"the result cannot be sent back as JSON: {_describe(exc)}")
    if len(body) > max_frame:
        return _error_reply(_too_big("the result is", len(body), max_frame))
    return body


def _error_reply(message: str) -> bytes:
    if len(message) > _MAX_ERROR_CHARS:
        message = f"{message[:_MAX_ERROR_CHARS]}… [cut at {_MAX_ERROR_CHARS:,} characters]"
    return _dumps({"ok": False, "error": message, "cpu": _cpu_used()})


def _dumps(reply: dict[str, Any]) -> bytes:
    # ASCII only: lone surrogates and every other code point travel as escapes.
    return json.dumps(reply, default=_refuse, ensure_ascii=True).encode("ascii")


def _cpu_used() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class _NotData(TypeError):
    def __init__(self, type_name: str) -> None:
        super().__init__(f"{type_name} is not JSON data")
        self.type_name = type_name


def _refuse(value: object) -> Any:
    """``json.dumps``'s hook for what it cannot encode: refuse it, by type."""
    raise _NotData(_type_name(value))


def _type_name(value: object) -> str:
    kind = type(value)
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


_JSON_SCALARS = (str, int, float, bool, type(None))


def _where(value: object, path: str, depth: int = 0) -> str | None:
    """The path of the first value in ``value`` that JSON cannot hold (for the error message)."""
    if depth > 100:
        return None
    if isinstance(value, _JSON_SCALARS):
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            found = _where(item, f"{path}[{key!r}]", depth + 1)
            if found is not None:
                return found
        return None
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = _where(item, f"{path}[{index}]", depth + 1)
            if found is not None:
                return found
        return None
    return path


def _describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # an exception whose __str__ fails still gets reported
        text = "(its message could not be turned into text)"
    return f"{type(exc).__name__}: {text}"


# -- the agent side: decoding and describing ------------------------------------------------


def _decode_reply(frame: bytes) -> tuple[bool, Any, float]:
    """(ok, value or error message, CPU seconds used) from a worker's frame.

    ``json.loads`` builds only dicts, lists, strings, numbers, booleans and None: whatever the
    worker sent, no code of its choosing runs here.
    """
    try:
        reply = json.loads(frame)
    except (ValueError, RecursionError) as exc:
        raise ToolProcessError(f"the tool process sent a reply that is not JSON: {exc}") from None
    if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
        raise ToolProcessError("the tool process sent a reply of the wrong shape")
    cpu = reply.get("cpu")
    cpu_used = cpu if isinstance(cpu, float) else 0.0
    if reply["ok"]:
        if "value" not in reply:
            raise ToolProcessError("the tool process sent a reply of the wrong shape")
        return True, reply["value"], cpu_used
    error = reply.get("error")
    if not isinstance(error, str):
        raise ToolProcessError("the tool process sent a reply of the wrong shape")
    return False, error, cpu_used


def _too_big(what: str, size: int, limit: int) -> str:
    return (
        f"{what} {size:,} bytes as JSON, over the limit of {limit:,} bytes; "
        "return less (or raise max_frame_bytes)"
    )


def _death(exit_code: int | None, cpu_used: float | None, limits: Limits) -> str:
    if exit_code is None:
        return "the tool process stopped answering"
    if exit_code >= 0:
        return f"the tool process exited with code {exit_code}"
    try:
        name = signal.Signals(-exit_code).name
    except ValueError:
        name = f"signal {-exit_code}"
    limit = limits.cpu_seconds
    over_cpu = name == "SIGXCPU" or (
        name == "SIGKILL" and cpu_used is not None and limit is not None and cpu_used >= limit
    )
    if limit is not None and over_cpu:
        return f"the tool process went past its CPU time limit of {limit} s (killed by {name})"
    return f"the tool process was killed by {name}"
