"""What ``Agent`` needs around a run that is not the agent itself: the sync facade's event
loop per thread, waiting for a session lock held elsewhere, checked variables. (Prices are
``hermes_agent.pricing``; ``cost`` is still importable from here.)"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from hermes_agent.errors import HermesAgentError
from hermes_agent.memory.session import AcquiresAsync, SessionLock
from hermes_agent.models.base import ClosesConnections, Model, ModelSettings
from hermes_agent.pipeline.variables import check_variables
from hermes_agent.pricing import cost
from hermes_agent.types import Message

__all__ = [
    "acquire_elsewhere",
    "checked_variables",
    "close_connections_of",
    "cost",
    "not_a_model",
    "on_thread_loop",
    "run_in_thread_loop",
    "warm_embedded",
]

T = TypeVar("T")

_loops = threading.local()
logger = logging.getLogger("hermes_agent")


def checked_variables(variables: Mapping[str, object] | None) -> dict[str, object]:
    """A run's own copy of its variables; ``HermesAgentError`` naming what is wrong."""
    if variables is None:
        return {}
    try:
        return copy.deepcopy(check_variables(variables))
    except ValueError as exc:
        raise HermesAgentError(str(exc)) from None


async def acquire_elsewhere(lock: SessionLock) -> None:
    """Wait for a session lock another run holds, without blocking the event loop.

    If this run is cancelled while it waits, the lock is released as soon as the waiting thread
    gets it — otherwise the session would stay locked for good.
    """
    if isinstance(lock, AcquiresAsync):  # it may wait on other processes: not from a thread
        await lock.acquire_async()
        return
    waiter = asyncio.get_running_loop().run_in_executor(None, lock.acquire)
    try:
        await asyncio.shield(waiter)
    except asyncio.CancelledError:
        waiter.add_done_callback(lambda done: lock.release() if done.result() else None)
        raise


def run_in_thread_loop(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run on this thread's own event loop, kept open between runs.

    Starting a loop per run would cost more than the rest of a short run, and clients bound to
    a loop (the OpenAI SDK's connection pool) stay usable across runs. ``asyncio.Runner`` is not
    used: on the main thread it swaps the SIGINT handler around every run, and restoring it
    formats the running task's repr — milliseconds per run on Python 3.11.
    """
    loop: asyncio.AbstractEventLoop | None = getattr(_loops, "loop", None)
    if loop is None or loop.is_closed():
        loop = asyncio.new_event_loop()
        _loops.loop = loop
    task = loop.create_task(coroutine)
    try:
        return loop.run_until_complete(task)
    except BaseException:
        task.cancel()  # Ctrl-C: stop the run cleanly before re-raising
        with contextlib.suppress(BaseException):
            loop.run_until_complete(task)
        raise


async def close_connections_of(models: Iterable[object]) -> None:
    """``aclose`` each distinct model that holds connections (``ClosesConnections``) on the
    running loop; a model that fails to close is logged, not raised (a shutdown goes on)."""
    seen: list[object] = []
    for model in models:
        if model is None or any(model is done for done in seen):
            continue
        seen.append(model)
        if isinstance(model, ClosesConnections):
            try:
                await model.aclose()
            except Exception:
                logger.exception("cannot close the connections of model %r", model)


def on_thread_loop(make: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``make()`` on this thread's own loop (``run_in_thread_loop``), if it has one and no
    loop is running here: what the sync facade's runs opened on it (a model's connections) is
    closed on the loop that opened it."""
    loop: asyncio.AbstractEventLoop | None = getattr(_loops, "loop", None)
    if loop is None or loop.is_closed():
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        loop.run_until_complete(make())


def not_a_model(candidate: object) -> None:
    members = ("name", "profile", "complete", "stream", "render_prompt", "count_tokens")
    missing = [name for name in members if not hasattr(candidate, name)]
    raise HermesAgentError(
        f"{type(candidate).__name__} is not a Model: it lacks {', '.join(missing)}; "
        "subclass hermes_agent.ModelBase (it supplies profile, render_prompt and "
        "count_tokens) and write complete and stream"
    )


def warm_embedded(
    turns: Iterable[tuple[Model | None, Sequence[dict[str, Any]]]],
    messages: Sequence[Message],
    settings: ModelSettings,
) -> None:
    """Have each embedded model of ``turns`` (with the tools it is offered) complete one token
    of ``messages``, so that llama.cpp keeps what every request starts with evaluated
    (``Agent.warmup``); other models have nothing to load."""
    from hermes_agent.models.llamacpp import LlamaCpp

    for model, offered in turns:
        if isinstance(model, LlamaCpp):
            coroutine = model.complete(messages, offered, settings)
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                asyncio.run(coroutine)
                continue
            with ThreadPoolExecutor(max_workers=1) as pool:  # called from async code
                pool.submit(asyncio.run, coroutine).result()
