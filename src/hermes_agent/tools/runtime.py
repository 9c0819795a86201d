"""Per-agent tool state that outlives one run: result cache, rate-limit windows, the threads
that run sync tools, and subprocess worker pools."""

from __future__ import annotations

import contextvars
import copy
import functools
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from hermes_agent.errors import HermesAgentError
from hermes_agent.tools.registry import Tool
from hermes_agent.tools.sandbox import Limits, SubprocessPool

_MINUTE = 60.0
MAX_CACHED_RESULTS = 4096
"""Cached tool results an agent keeps; past it, expired ones go, then the oldest."""
DEFAULT_MAX_RESULT_CHARS = 100_000
"""The agent's default bound on a tool's result (characters of its JSON): about 25,000
tokens, more than most models' context can spare for one result. A longer one is cut before
it is stored or sent (``pipeline.tool_executor``)."""
_IMMUTABLE = (str, int, float, bool, bytes, type(None))


def private_copy(value: Any) -> Any:
    """A copy of ``value`` that shares nothing mutable with it (deep only when it must be).

    Arguments handed to a tool, results kept in the cache and the snapshot of an approved call
    are copied this way, so that whoever edits one object cannot change what another reads.
    """
    if isinstance(value, _IMMUTABLE):
        return value
    if type(value) is dict and all(isinstance(item, _IMMUTABLE) for item in value.values()):
        return dict(value)  # the common case: flat arguments; keys are strings
    return copy.deepcopy(value)


_asked: contextvars.ContextVar[list[bool] | None] = contextvars.ContextVar(
    "hermes_asked_caller", default=None
)


def asked_caller() -> None:
    """Note that the tool call running now asked its caller (an MCP caller's input, model or
    roots): its result is that caller's own, so it is not cached for another call."""
    asked = _asked.get()
    if asked is not None:
        asked.append(True)


def watch_asking() -> tuple[list[bool], contextvars.Token[list[bool] | None]]:
    """Start watching whether the call about to run asks its caller (``asked_caller``): a
    list that is non-empty once it did, and the token that ``stop_watching`` takes. A list,
    not a flag: the tool's task or thread runs in a copy of this context and shares it."""
    asked: list[bool] = []
    return asked, _asked.set(asked)


def stop_watching(token: contextvars.Token[list[bool] | None]) -> None:
    _asked.reset(token)


class ToolRuntime:
    """What an agent remembers about its tools between calls. Thread-safe.

    ``threads`` bounds the threads that run sync ``in_process`` tools at once (not counting
    threads written off because their call timed out); ``per_tool`` is how many of them one tool
    may hold when the tool sets no ``max_concurrent`` (default: half of ``threads``).
    ``max_result_chars`` bounds every tool's result, unless the tool's own is larger.
    """

    def __init__(
        self,
        *,
        pool_size: int = 2,
        threads: int = 8,
        per_tool: int | None = None,
        max_result_chars: int = DEFAULT_MAX_RESULT_CHARS,
    ) -> None:
        if max_result_chars < 1:
            raise HermesAgentError(f"max_result_chars must be at least 1, got {max_result_chars}")
        self.pool_size = pool_size
        self.max_result_chars = max_result_chars
        self.threads = ToolThreads(threads)
        self.per_tool = per_tool if per_tool is not None else max(1, threads // 2)
        self._cache: dict[tuple[str, str], tuple[float, Any]] = {}
        self._calls: dict[str, deque[float]] = {}
        self._pools: dict[str, tuple[Tool, SubprocessPool]] = {}
        self._lock = threading.Lock()

    def result_limit(self, tool: Tool) -> int:
        """The longest result of ``tool`` the model reads: its own ``max_result_chars``, or
        the agent's bound."""
        own = tool.max_result_chars
        return own if own is not None else self.max_result_chars

    # -- result cache (per tool ``cache_ttl``) ------------------------------------------

    @staticmethod
    def cache_key(tool: Tool, arguments: dict[str, Any]) -> tuple[str, str]:
        return tool.name, json.dumps(arguments, sort_keys=True, ensure_ascii=False, default=str)

    def cached(self, tool: Tool, arguments: dict[str, Any]) -> tuple[bool, Any]:
        """(hit, value) for a call with these arguments within the tool's TTL. The value is
        the caller's own copy: editing it leaves the cache entry as it was."""
        if not tool.cache_ttl:
            return False, None
        key = self.cache_key(tool, arguments)
        with self._lock:
            entry = self._cache.get(key)
            if entry is None:
                return False, None
            expires, value = entry
            if time.monotonic() >= expires:
                del self._cache[key]
                return False, None
        return True, private_copy(value)

    def remember(self, tool: Tool, arguments: dict[str, Any], value: Any) -> None:
        """Keep a copy of ``value`` for the tool's TTL (a value that cannot be copied is not
        cached: handing out the same object twice would let one reader edit another's)."""
        if not tool.cache_ttl:
            return
        try:
            kept = private_copy(value)
        except Exception:  # e.g. a result holding a lock or a socket
            return
        key = self.cache_key(tool, arguments)
        with self._lock:
            now = time.monotonic()
            self._cache.pop(key, None)  # re-inserted last: the dict is oldest first
            if len(self._cache) >= MAX_CACHED_RESULTS:
                for stale in [k for k, (expires, _) in self._cache.items() if expires <= now]:
                    del self._cache[stale]
                while len(self._cache) >= MAX_CACHED_RESULTS:
                    del self._cache[next(iter(self._cache))]
            self._cache[key] = (now + tool.cache_ttl, kept)

    # -- rate limit (per tool ``rate_limit`` calls per minute) ---------------------------

    def has_room(self, tool: Tool) -> bool:
        """Whether a call of ``tool`` would be within its rate limit now (counts nothing)."""
        if not tool.rate_limit:
            return True
        now = time.monotonic()
        with self._lock:
            window = self._calls.get(tool.name)
            if window is None:
                return True
            while window and now - window[0] >= _MINUTE:
                window.popleft()
            return len(window) < tool.rate_limit

    def admit(self, tool: Tool) -> bool:
        """Count a call against the tool's rate limit; False when the limit is reached.

        Call it only for a call that is about to run: refused calls must not use up the limit.
        """
        if not tool.rate_limit:
            return True
        now = time.monotonic()
        with self._lock:
            window = self._calls.setdefault(tool.name, deque())
            while window and now - window[0] >= _MINUTE:
                window.popleft()
            if len(window) >= tool.rate_limit:
                return False
            window.append(now)
            return True

    # -- sync in-process tools ------------------------------------------------------------

    def run_in_thread(
        self,
        tool: Tool,
        arguments: dict[str, Any],
        context: contextvars.Context | None = None,
    ) -> Future[Any]:
        """Start a sync tool call on a tool thread (in ``context``, when given); at most
        ``tool.max_concurrent`` (or ``per_tool``) calls of one tool run at once, the others
        wait their turn."""
        limit = tool.max_concurrent or self.per_tool
        function = tool.function
        if context is not None:
            function = functools.partial(context.run, tool.function)
        return self.threads.submit(tool.name, limit, function, arguments)

    def write_off(self, future: Future[Any]) -> None:
        """The caller stopped waiting for ``future`` (timeout or cancellation); see
        ``ToolThreads.write_off``."""
        self.threads.write_off(future)

    # -- subprocess pools ---------------------------------------------------------------

    def pool(self, tool: Tool) -> SubprocessPool:
        """The worker pool of a subprocess tool (a new one if the tool object changed)."""
        with self._lock:
            entry = self._pools.get(tool.name)
            if entry is not None and entry[0] is tool:
                return entry[1]
            if entry is not None:
                entry[1].close()
            limits = Limits(memory_mb=tool.memory_limit_mb, cpu_seconds=tool.cpu_time_limit_s)
            # Only JSON reaches the worker: it converts the arguments for the function itself.
            pool = SubprocessPool(tool.json_function(), limits, size=self.pool_size)
            self._pools[tool.name] = (tool, pool)
            return pool

    def close(self) -> None:
        """Stop idle tool threads and worker processes (both start again on demand)."""
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for _, pool in pools:
            pool.close()
        self.threads.close()


@dataclass(eq=False, slots=True)
class _Job:
    key: str
    function: Callable[..., Any]
    arguments: dict[str, Any]
    future: Future[Any] = field(default_factory=Future)
    written_off: bool = False
    finished: bool = False


class ClosedError(HermesAgentError, RuntimeError):
    """The tool threads were closed before this call could start."""


class ToolThreads:
    """Runs sync tool calls on daemon threads, so that a hung tool cannot starve the others.

    Python cannot stop a running thread, so a tool call that hangs holds its thread until the
    function returns, whatever its timeout says. Three rules bound the damage:

    - at most ``limit`` calls with the same key (the tool's name) run at once; the others wait
      in line, and a caller that stops waiting takes its call out of the line;
    - a call whose caller stopped waiting while it ran is *written off*: its thread no longer
      counts against ``max_workers``, so a new thread takes its place, and the old one ends
      when (if ever) the function returns;
    - the threads are daemon threads, so a hung call does not keep the interpreter from
      exiting (``concurrent.futures`` joins its workers at exit and would wait forever).

    Code that may hang for good, or must be stopped, belongs in ``execution_mode: subprocess``,
    where a timeout kills the process.
    """

    def __init__(self, max_workers: int = 8) -> None:
        self.max_workers = max(1, max_workers)
        self._lock = threading.Lock()
        self._ready: deque[_Job] = deque()
        self._wakeup = threading.Condition(self._lock)
        self._workers = 0
        """Threads that count against ``max_workers`` (alive and not written off)."""
        self._idle = 0
        self._running: dict[str, int] = {}
        self._waiting: dict[str, deque[_Job]] = {}
        self._jobs: dict[Future[Any], _Job] = {}
        self._generation = 0
        """Bumped by ``close``: threads of an older generation leave instead of waiting."""

    def submit(
        self, key: str, limit: int, function: Callable[..., Any], arguments: dict[str, Any]
    ) -> Future[Any]:
        """Run ``function(**arguments)`` on a tool thread once fewer than ``limit`` calls of
        ``key`` are running; the future holds its result."""
        job = _Job(key, function, arguments)
        with self._lock:
            self._jobs[job.future] = job
            if self._running.get(key, 0) < max(1, limit):
                self._running[key] = self._running.get(key, 0) + 1
                self._dispatch(job)
            else:
                self._waiting.setdefault(key, deque()).append(job)
        return job.future

    def write_off(self, future: Future[Any]) -> None:
        """The caller no longer waits for ``future``: a call still in line is dropped; a call
        that is running keeps its thread, which stops counting against ``max_workers``."""
        with self._lock:
            job = self._jobs.get(future)
            if job is None or job.finished or job.written_off:
                return
            if future.cancel() or future.cancelled():
                waiting = self._waiting.get(job.key)
                if waiting is not None and job in waiting:
                    waiting.remove(job)  # never started: its tool slot was never taken
                    del self._jobs[future]
                    future.set_running_or_notify_cancel()  # wakes ``wait()``ers; returns False
                return  # in the ready line: the thread that picks it up frees its slot
            job.written_off = True
            self._workers -= 1
            self._spawn_if_needed()

    def close(self) -> None:
        """Let idle threads end and fail the calls still in line (new calls start threads
        again). Running calls finish on their threads, which then end."""
        with self._lock:
            self._generation += 1
            dropped = list(self._ready)
            for line in self._waiting.values():
                dropped.extend(line)
            self._ready.clear()
            self._waiting.clear()
            self._running.clear()
            for job in dropped:
                self._jobs.pop(job.future, None)
            self._workers -= self._idle  # woken below, idle threads of this generation end
            self._idle = 0
            self._wakeup.notify_all()
        for job in dropped:
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(ClosedError("the agent was closed before the call ran"))

    # -- internals (called with the lock held) --------------------------------------------

    def _dispatch(self, job: _Job) -> None:
        self._ready.append(job)
        if self._idle:
            self._idle -= 1  # taken off the count here, so a second job wakes a second thread
            self._wakeup.notify()
        else:
            self._spawn_if_needed()

    def _spawn_if_needed(self) -> None:
        if self._ready and self._idle == 0 and self._workers < self.max_workers:
            self._workers += 1
            thread = threading.Thread(
                target=self._work, args=(self._generation,), name="hermes-tool", daemon=True
            )
            thread.start()

    def _release(self, key: str) -> None:
        """A call of ``key`` ended: its slot goes to the next one in line."""
        waiting = self._waiting.get(key)
        while waiting:
            job = waiting.popleft()
            if not job.future.cancelled():
                self._dispatch(job)
                return
            self._jobs.pop(job.future, None)
            job.future.set_running_or_notify_cancel()
        running = self._running.get(key, 0) - 1
        if running > 0:
            self._running[key] = running
        else:
            self._running.pop(key, None)
            self._waiting.pop(key, None)

    def _work(self, generation: int) -> None:
        """One tool thread: run calls from the ready line until closed or written off."""
        while True:
            with self._lock:
                while not self._ready:
                    self._idle += 1
                    self._wakeup.wait()  # whoever wakes us took us off the idle count
                    if generation != self._generation:
                        return  # closed while idle (and no longer counted)
                job = self._ready.popleft()
            ran = job.future.set_running_or_notify_cancel()
            value: Any = None
            error: BaseException | None = None
            if ran:
                try:
                    value = job.function(**job.arguments)
                except BaseException as exc:  # every failure goes to the caller, as in a pool
                    error = exc
            with self._lock:
                job.finished = True
                self._jobs.pop(job.future, None)
                current = generation == self._generation
                if current:
                    self._release(job.key)
                elif not job.written_off:
                    self._workers -= 1  # busy when closed: still counted until now
                leave = job.written_off or not current
            if ran:
                if error is not None:
                    job.future.set_exception(error)
                else:
                    job.future.set_result(value)
            if leave:
                return
