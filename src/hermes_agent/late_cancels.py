"""Work that must end whole once begun: a turn being appended to its session, the steps of a run
that is already ending. A cancel that lands meanwhile waits for the work and is taken back
(``Task.uncancel``), so an enclosing ``asyncio.timeout`` still tells its own expiry apart; the
caller decides whether the cancel still matters (``memory.session.off_the_loop`` raises it when
the append failed)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

_T = TypeVar("_T")


async def finish_despite_cancels(work: Awaitable[_T]) -> tuple[asyncio.Future[_T], bool]:
    """Wait for ``work`` to end, whatever cancels this task meanwhile; returns its finished
    future (its result or failure untouched) and whether a cancel landed."""
    done = asyncio.ensure_future(work)
    cancelled = False
    while not done.done():
        try:
            await asyncio.wait({done})  # never cancels ``done``, never raises its failure
        except asyncio.CancelledError:
            cancelled = True
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
    return done, cancelled
