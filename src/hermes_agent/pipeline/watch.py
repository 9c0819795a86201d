"""What an engine watches of a run it drives, from outside the run: the tokens its model turns
spent so far, and the tool calls it had to abandon that are still running.

An engine (the service's, a queue worker) that wants either sets a ``RunWatch`` around
``Agent.arun`` with ``watching``; without one the pipeline counts nothing extra. The pipeline
feeds it at the two places it meets what cannot be taken back:

- each model turn counts its prompt when the request is sent and its output as it streams
  (an estimate, from the model's own ``count_tokens``), replaced by the usage the model
  reports once the turn ends — so a turn cut short (cancelled, timed out, failed mid-stream)
  still counts what it spent;
- a call whose caller stopped waiting (the run was cancelled) while the tool runs on — a sync
  in-process tool on its thread, which nothing can stop — is listed, with its future, so the
  engine can say it is still running and record its late result.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from hermes_agent.types import Usage


@dataclass(slots=True)
class SpendMeter:
    """The tokens of a run's model turns, however each ended."""

    counted: int = 0
    """Tokens of the turns that ended (the model's usage, or the estimate where it gave none)."""
    _prompt: int = 0
    _streamed: list[str] = field(default_factory=list)
    _count: Callable[[str], int] | None = None

    def sent(self, prompt_tokens: int, count: Callable[[str], int]) -> None:
        """A request went out: its prompt counts from now on."""
        self._close()
        self._prompt, self._count = prompt_tokens, count

    def streamed(self, text: str) -> None:
        """A piece of the reply arrived."""
        self._streamed.append(text)

    def ended(self, usage: Usage) -> None:
        """The turn's reply is in: the model's usage replaces the estimate (where it gave one)."""
        if usage.total_tokens > 0:
            self.counted += usage.total_tokens
            self._reset()
        else:
            self._close()

    @property
    def total(self) -> int:
        """Every turn so far, the one in progress at its estimate."""
        return self.counted + self._open()

    def _open(self) -> int:
        if self._count is None:
            return 0
        output = self._count("".join(self._streamed)) if self._streamed else 0
        return self._prompt + output

    def _close(self) -> None:
        self.counted += self._open()
        self._reset()

    def _reset(self) -> None:
        self._prompt, self._streamed, self._count = 0, [], None


@dataclass(frozen=True, slots=True)
class AbandonedCall:
    """A tool call the run stopped waiting for while it ran on."""

    name: str
    call_id: str
    step: int
    future: Future[Any]

    @property
    def running(self) -> bool:
        return not self.future.done()


@dataclass(slots=True)
class RunWatch:
    """What ``watching`` lets an engine see of one run (see the module docstring)."""

    spend: SpendMeter = field(default_factory=SpendMeter)
    abandoned: list[AbandonedCall] = field(default_factory=list)

    def still_running(self) -> list[AbandonedCall]:
        """The abandoned calls that have not finished yet."""
        return [call for call in self.abandoned if call.running]


_WATCH: ContextVar[RunWatch | None] = ContextVar("hermes_run_watch", default=None)


@contextlib.contextmanager
def watching(watch: RunWatch) -> Iterator[RunWatch]:
    """Watch the run started in this context (``Agent.arun`` inside the ``with``)."""
    token = _WATCH.set(watch)
    try:
        yield watch
    finally:
        _WATCH.reset(token)


def current_watch() -> RunWatch | None:
    """The watch of the run in this context, if an engine set one."""
    return _WATCH.get()
