"""A background thread running its own event loop: where MCP sessions live.

An MCP session is bound to the event loop it was opened on (its streams, its task group, the
child process's pipes). The agent's runs happen on other loops: ``Agent.run`` keeps one loop per
calling thread, ``run`` called from async code starts a loop per call, a service runs on
uvicorn's. So the sessions get a loop of their own that outlives every run, and a tool call
from any loop is handed to it with ``asyncio.run_coroutine_threadsafe``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """An event loop on a daemon thread, started on first use and again after ``stop``."""

    def __init__(self, name: str = "hermes-mcp") -> None:
        self.name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop (started now if it is not)."""
        with self._lock:
            if self._loop is None or self._thread is None or not self._thread.is_alive():
                started = threading.Event()
                loop = asyncio.new_event_loop()

                def main() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(started.set)
                    loop.run_forever()

                thread = threading.Thread(target=main, name=self.name, daemon=True)
                thread.start()
                started.wait()
                self._loop, self._thread = loop, thread
            return self._loop

    @property
    def running(self) -> bool:
        """Whether the loop's thread is alive (``loop`` would not start one)."""
        return self._thread is not None and self._thread.is_alive()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> Future[T]:
        """Run ``coroutine`` on the loop; cancelling the future cancels it there."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def in_loop(self) -> bool:
        """Whether the caller runs on this loop's thread."""
        return self._thread is not None and threading.current_thread() is self._thread

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop and wait for its thread (what is still scheduled is dropped)."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        if thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout)
        if not thread.is_alive():
            loop.close()
