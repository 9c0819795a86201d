"""Subprocess execution for tools that must not be trusted with the agent's process.

A tool with ``execution_mode: subprocess`` runs in a worker process of its own pool. Workers are
forked from the agent process when first needed, so they inherit the tool's function as it is
(closures and all — nothing is pickled but the arguments and the result) and keep running for
later calls (a pooled call costs a pipe round trip, not a process start). Limits are applied in
the worker with ``resource.setrlimit`` before any call: address space (memory) and CPU time.

What can happen to a call, and what the agent sees:

- it returns → its value (sent back pickled; what cannot be pickled comes back as ``str``);
- it raises (``MemoryError`` past the memory limit included) → ``ToolProcessError`` (500);
- it runs past its timeout → the worker is killed with SIGKILL and reaped → ``TimeoutError`` (408);
- the worker dies (``os._exit``, a segfault, SIGXCPU past the CPU limit) → ``ToolProcessError``
  naming the exit code or signal (500).

A dead or killed worker is replaced on the next call. Forking a process that runs threads is
safe here because the worker only ever runs the tool function and talks over its own pipe.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import resource
import signal
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

_CONTEXT = multiprocessing.get_context("fork")


class ToolProcessError(Exception):
    """The tool failed inside its worker process (raised, or the process died)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Resource limits of a tool's worker processes (``None``: no limit)."""

    memory_mb: int | None = None
    cpu_seconds: int | None = None


class _Worker:
    def __init__(self, function: Callable[..., Any], limits: Limits) -> None:
        parent, child = _CONTEXT.Pipe()
        self.process = _CONTEXT.Process(
            target=_serve, args=(function, limits, child, parent), daemon=True
        )
        self.process.start()
        child.close()
        self.connection: Connection = parent

    def call(self, arguments: dict[str, Any], timeout: float) -> Any:
        self.connection.send(arguments)
        if not self.connection.poll(timeout):
            self.kill()
            raise TimeoutError(f"no result within {timeout:g} s")
        try:
            ok, payload = self.connection.recv()
        except (EOFError, OSError):
            self.process.join(1)
            raise ToolProcessError(_death(self.process.exitcode)) from None
        if not ok:
            raise ToolProcessError(payload)
        return payload

    def alive(self) -> bool:
        return self.process.is_alive()

    def kill(self) -> None:
        if self.process.is_alive() and self.process.pid is not None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.join(5)
        self.connection.close()


class SubprocessPool:
    """Up to ``size`` worker processes for one tool; each call borrows one."""

    def __init__(self, function: Callable[..., Any], limits: Limits, size: int = 2) -> None:
        self.function = function
        self.limits = limits
        self.size = max(1, size)
        self._idle: list[_Worker] = []
        self._closed = False
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(self.size)

    def call(self, arguments: dict[str, Any], timeout: float) -> Any:
        """Run the tool with ``arguments`` in a worker (blocking; call it from a thread)."""
        with self._slots:
            worker = self._borrow()
            try:
                result = worker.call(arguments, timeout)
            except BaseException:
                if worker.alive():
                    worker.kill()  # its state is unknown after a failure mid-call
                raise
            self._give_back(worker)
            return result

    def _borrow(self) -> _Worker:
        with self._lock:
            self._closed = False  # a closed pool used again starts workers again
            while self._idle:
                worker = self._idle.pop()
                if worker.alive():
                    return worker
                worker.kill()
        return _Worker(self.function, self.limits)

    def _give_back(self, worker: _Worker) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(worker)
                return
        worker.kill()  # the pool closed while this worker was busy

    def close(self) -> None:
        """Kill every idle worker; a busy one is killed when its call returns."""
        with self._lock:
            self._closed = True
            workers, self._idle = self._idle, []
        for worker in workers:
            worker.kill()

    def pids(self) -> list[int]:
        with self._lock:
            return [w.process.pid for w in self._idle if w.process.pid is not None]


def _serve(
    function: Callable[..., Any], limits: Limits, connection: Connection, parent_end: Connection
) -> None:
    """The worker's loop: apply limits, then answer calls until the pipe closes."""
    parent_end.close()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    if limits.memory_mb is not None:
        size = limits.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (size, size))
    if limits.cpu_seconds is not None:
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds))
    while True:
        try:
            arguments = connection.recv()
        except (EOFError, OSError):
            return
        try:
            reply: tuple[bool, Any] = (True, function(**arguments))
        except MemoryError:
            reply = (False, "MemoryError: the tool went past its memory limit")
        except Exception as exc:
            reply = (False, f"{type(exc).__name__}: {exc}")
        except BaseException as exc:  # SystemExit from the tool: report it, keep serving
            reply = (False, f"{type(exc).__name__}: {exc}")
        try:
            connection.send(reply)
        except (pickle.PicklingError, TypeError, AttributeError):
            connection.send((True, str(reply[1])))
        except MemoryError:
            connection.send((False, "MemoryError: the result did not fit in the memory limit"))
        except Exception:
            connection.send((False, traceback.format_exc(limit=1)))


def _death(exit_code: int | None) -> str:
    if exit_code is None:
        return "the tool process stopped answering"
    if exit_code < 0:
        name = signal.Signals(-exit_code).name
        hint = " (CPU time limit reached)" if name == "SIGXCPU" else ""
        return f"the tool process was killed by {name}{hint}"
    return f"the tool process exited with code {exit_code}"
