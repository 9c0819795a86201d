"""Per-agent tool state that outlives one run: result cache, rate-limit windows, worker pools."""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from typing import Any

from hermes_agent.tools.registry import Tool
from hermes_agent.tools.sandbox import Limits, SubprocessPool

_MINUTE = 60.0


class ToolRuntime:
    """What an agent remembers about its tools between calls. Thread-safe."""

    def __init__(self, *, pool_size: int = 2) -> None:
        self.pool_size = pool_size
        self._cache: dict[tuple[str, str], tuple[float, Any]] = {}
        self._calls: dict[str, deque[float]] = {}
        self._pools: dict[str, tuple[Tool, SubprocessPool]] = {}
        self._lock = threading.Lock()

    # -- result cache (per tool ``cache_ttl``) ------------------------------------------

    @staticmethod
    def cache_key(tool: Tool, arguments: dict[str, Any]) -> tuple[str, str]:
        return tool.name, json.dumps(arguments, sort_keys=True, ensure_ascii=False, default=str)

    def cached(self, tool: Tool, arguments: dict[str, Any]) -> tuple[bool, Any]:
        """(hit, value) for a call with these arguments within the tool's TTL."""
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
            return True, value

    def remember(self, tool: Tool, arguments: dict[str, Any], value: Any) -> None:
        if not tool.cache_ttl:
            return
        with self._lock:
            expires = time.monotonic() + tool.cache_ttl
            self._cache[self.cache_key(tool, arguments)] = (expires, value)

    # -- rate limit (per tool ``rate_limit`` calls per minute) ---------------------------

    def admit(self, tool: Tool) -> bool:
        """Count a call against the tool's rate limit; False when the limit is reached."""
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
            pool = SubprocessPool(tool.function, limits, size=self.pool_size)
            self._pools[tool.name] = (tool, pool)
            return pool

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for _, pool in pools:
            pool.close()
