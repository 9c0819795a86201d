"""The garbage collector's settings for a process that serves runs for a long time.

A service or worker process imports a great deal before its first run (FastAPI, the openai SDK,
SQLAlchemy, Celery) and then allocates many short-lived objects per run. With CPython's
defaults the cyclic collector walks the whole startup heap at every full collection, and runs
a young collection every 700 allocations: on the service benchmark 6–21% of the process's
CPU went to the collector, and 1–5% once settled (benchmarks/HISTORY.md, tenth round).

``settle_heap`` is called once the process has built what it keeps: ``hermes-agent serve``
after ``create_app``, ``hermes-agent worker`` after its agent (a prefork pool's main process
before it forks, so that the children share its frozen pages, and each child again once it
has built its own agent). It is not done by ``create_app`` or ``Agent``: the collector's
settings belong to the process, and a program that embeds the runtime decides them itself (it
may call this).
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_COLLECTION_EVERY", "settle_heap"]

YOUNG_COLLECTION_EVERY = 10_000
"""Allocations between young collections (CPython's default is 700): a run's objects mostly die
with the run, so fewer collections find fewer survivors to promote and walk again."""


def settle_heap() -> None:
    """Collect what startup left behind, move every object alive now into the collector's
    permanent generation (``gc.freeze``: never walked again, never freed by the collector),
    and space out young collections. Calling it again freezes what has been built since."""
    gc.collect()
    gc.freeze()
    young, middle, old = gc.get_threshold()
    if young:  # 0: the program turned automatic collection off; leave it so
        gc.set_threshold(max(young, YOUNG_COLLECTION_EVERY), middle, old)
