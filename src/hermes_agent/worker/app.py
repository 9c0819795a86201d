"""The Celery side: the app, the one task, and the worker process that runs it.

Celery settings chosen for long agent runs (docs/scale-out.md explains each):

- ``task_acks_late`` + ``task_reject_on_worker_lost``: a delivery is acknowledged when the run
  has finished with it, so a worker that dies leaves its runs to be delivered again;
- ``worker_prefetch_multiplier = 1``: a worker holds no more runs than it is running;
- ``worker_send_task_events`` + ``task_send_sent_event`` (``queue.task_events``, off unless
  turned on): Flower sees the workers always, and the runs once it asks for them (its
  ``enable_events`` broadcast), as ``celery events`` does after ``control enable_events``;
- the Redis broker's ``visibility_timeout`` comes from the config: a run that lasts longer is
  delivered again while it runs, and the copy stops at once (the run's lease says it is alive).

Delivery is only half of it: a run's own lease (``worker.store``) decides who runs it, and each
worker's sweeper re-enqueues a run whose worker died, whatever the broker does with the message.
A delivery that met an unavailable store (``StoreUnavailable``) is not acknowledged as done:
it goes back to the broker as a retry after a pause.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from hermes_agent.config import HermesConfig, QueueConfig
from hermes_agent.errors import ConfigError, MissingDependencyError, StoreUnavailable
from hermes_agent.heap import settle_heap

logger = logging.getLogger("hermes_agent.worker")

RUN_TASK = "hermes_agent.run"


def _celery() -> Any:
    try:
        import celery  # type: ignore[import-untyped]
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise MissingDependencyError(
            "queued runs need Celery: pip install 'hermes-agent-core[worker]'"
        ) from exc
    return celery


def make_celery(queue: QueueConfig) -> Any:
    """A Celery app for ``queue`` (the same on the service, the submitters and the workers)."""
    celery = _celery()
    app = celery.Celery("hermes_agent", broker=queue.broker)
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        task_default_queue=queue.queue_name,
        task_serializer="json",
        accept_content=["json"],
        worker_send_task_events=queue.task_events,
        task_send_sent_event=queue.task_events,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"visibility_timeout": queue.visibility_timeout},
        worker_hijack_root_logger=False,
        worker_cancel_long_running_tasks_on_connection_loss=False,
    )
    return app


def store_retry_pause(queue: QueueConfig, retries: int) -> float:
    """Seconds before a delivery that met an unavailable store is tried again: from a tenth
    of a lease, doubling, up to one lease (by then an attempt that could not release its
    lease has let it lapse, and the claim takes the run over)."""
    return float(min(queue.lease_ttl, queue.lease_ttl / 10 * 2**retries))


def enqueue(app: Any, queue: QueueConfig, request_id: str) -> None:
    """Send one delivery of ``request_id`` to the workers."""
    app.send_task(RUN_TASK, args=[request_id], queue=queue.queue_name)


class DeliveryNotes:
    """Deliveries this process received, noted in the store (``RunStore.mark_delivered``) only
    when they have not started after ``delay`` seconds: one that waits for a free slot leaves
    its trace for the sweeper, one that starts at once (the common case) writes nothing here,
    since its claim notes it. A worker that dies within ``delay`` of a delivery leaves that run
    to the sweeper's last resort (queued ten leases with no trace), as one that died before
    its note reached the store always did.

    One thread writes the notes. A delivery wakes it only when it sleeps with nothing to wait
    for (a note's deadline is never earlier than those pending); while deliveries keep coming,
    it looks again every ``delay`` instead."""

    def __init__(self, note: Callable[[str], None], delay: float) -> None:
        self._note = note
        self.delay = delay
        self._pending: dict[str, float] = {}
        self._guard = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._fresh = False  # a delivery came since the thread last looked
        self._sleeping = False  # the thread waits with no deadline: a delivery must wake it

    def received(self, request_id: str) -> None:
        with self._guard:
            if self._closed:
                return
            self._pending.setdefault(request_id, time.monotonic() + self.delay)
            self._fresh = True
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="hermes-deliveries", daemon=True
                )
                self._thread.start()
            # A thread waiting for a deadline wakes by then: this one is never earlier.
            if self._sleeping:
                self._guard.notify()

    def started(self, request_id: str) -> None:
        """The delivery runs now (in this process): nothing to note."""
        with self._guard:
            self._pending.pop(request_id, None)

    def pending(self) -> list[str]:
        with self._guard:
            return list(self._pending)

    def close(self) -> None:
        with self._guard:
            self._closed = True
            self._guard.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._guard:
                while not self._closed:
                    now = time.monotonic()
                    due = [rid for rid, at in self._pending.items() if at <= now]
                    if due:
                        break
                    if self._pending:
                        self._guard.wait(min(self._pending.values()) - now)
                    elif self._fresh:
                        # Deliveries keep coming (and start at once): look again after a
                        # delay instead of being woken by each one.
                        self._fresh = False
                        self._guard.wait(self.delay)
                    else:
                        self._sleeping = True
                        self._guard.wait()
                        self._sleeping = False
                if self._closed:
                    return
                for rid in due:
                    del self._pending[rid]
            for rid in due:
                try:
                    self._note(rid)
                except Exception:
                    logger.exception("could not note the delivery of run %s", rid)


def delivery_delay(queue: QueueConfig) -> float:
    """How long a received delivery may wait for a slot before it is noted in the store: a
    tenth of a lease, at most one second (the sweeper acts on a note after three leases)."""
    return min(1.0, queue.lease_ttl / 10)


class WorkerProcess:
    """What one worker process holds: the agent, the run store, the runner, the sweeper."""

    def __init__(self, config: HermesConfig, tools_files: Sequence[str] = ()) -> None:
        from hermes_agent.loading import build_agent, on_owned_loops
        from hermes_agent.storage.sql import SqlStorage
        from hermes_agent.worker.runner import RunWorker
        from hermes_agent.worker.store import RunStore

        if config.queue is None:
            raise ConfigError(f"{config.source}: a worker needs a queue: section (broker, ...)")
        self.queue = config.queue
        self.app = make_celery(self.queue)
        # The worker's run loop closes its models' connections as it stops.
        self.agent = build_agent(on_owned_loops(config), tools_files=list(tools_files))
        if not isinstance(self.agent.storage, SqlStorage):
            raise ConfigError(
                f"{config.source}: queued runs keep their state in a SQL store; set storage.url "
                "(postgresql+psycopg://... for workers on several machines)"
            )
        self.store = RunStore(self.agent.storage, max_redeliveries=self.queue.max_redeliveries)
        name = f"{socket.gethostname()}:{os.getpid()}"
        self.runner = RunWorker(
            self.agent, self.store, self.send, name=name, lease_ttl=self.queue.lease_ttl
        )
        self._stop = threading.Event()
        self._sweeper = threading.Thread(target=self._sweep, name="hermes-sweeper", daemon=True)
        self._sweeper.start()

    def send(self, request_id: str) -> None:
        enqueue(self.app, self.queue, request_id)

    def _sweep(self) -> None:
        interval = self.queue.sweep_interval or self.queue.lease_ttl
        while not self._stop.wait(interval):
            try:
                self.runner.sweep()
            except Exception:
                logger.exception("the sweeper failed; trying again in %.1f s", interval)

    def close(self) -> None:
        self._stop.set()
        self.runner.close()
        self.agent.close()


_process: WorkerProcess | None = None
_process_guard = threading.Lock()
_settings: tuple[HermesConfig, tuple[str, ...]] | None = None
_main_store: Any = None
"""Under the prefork pool: the main process's own small ``RunStore``, for noting deliveries
(the agent, its loop and its sweeper live in each child, made after the fork)."""
_deliveries: DeliveryNotes | None = None
"""This process's notes of deliveries received (the main process's, under prefork, where a
child's start is not seen: every delivery is noted once its delay has passed)."""


def _note_delivery(request_id: str) -> None:
    store = _main_store if _main_store is not None else worker_process().store
    store.mark_delivered(request_id)


def worker_process() -> WorkerProcess:
    """This process's ``WorkerProcess``, made on first use (after a fork, in each child)."""
    global _process
    with _process_guard:
        if _process is None:
            if _settings is None:
                raise ConfigError("this process was not started by `hermes-agent worker`")
            _process = WorkerProcess(*_settings)
        return _process


def worker_app(config: HermesConfig, tools_files: Sequence[str] = ()) -> Any:
    """The Celery app of a worker, with the run task registered."""
    global _settings
    if config.queue is None:
        raise ConfigError(f"{config.source}: a worker needs a queue: section (broker, ...)")
    _settings = (config, tuple(tools_files))
    app = make_celery(config.queue)
    global _deliveries
    if _deliveries is not None:
        _deliveries.close()
    deliveries = _deliveries = DeliveryNotes(_note_delivery, delivery_delay(config.queue))

    from celery.signals import (  # type: ignore[import-untyped]
        task_received,
        worker_process_init,
        worker_process_shutdown,
        worker_shutdown,
    )

    @worker_process_init.connect(weak=False)  # type: ignore[untyped-decorator]
    def child_started(**_: Any) -> None:
        # A prefork child: the main process's store connections are its parent's (never
        # used here); the child builds its own agent, store, loop and sweeper now, before
        # its first task, so that a child that replaces a dead one is ready at once.
        if _main_store is not None:
            _main_store.storage.engine.dispose(close=False)
        worker_process()
        settle_heap()  # the child's own agent and store, built after the fork

    def close_process() -> None:
        global _process
        with _process_guard:
            if _process is not None:
                _process.close()
                _process = None

    @worker_shutdown.connect(weak=False)  # type: ignore[untyped-decorator]
    def closing(**_: Any) -> None:
        # After a warm shutdown the runs of this process have finished; stop the sweeper,
        # the run loop and the agent (its MCP servers, its store, its models' connections).
        if _deliveries is not None:
            _deliveries.close()
        close_process()

    @worker_process_shutdown.connect(weak=False)  # type: ignore[untyped-decorator]
    def child_closing(**_: Any) -> None:
        # A prefork child holds an agent of its own (worker_shutdown is the main process's).
        close_process()

    @task_received.connect(weak=False)  # type: ignore[untyped-decorator]
    def received(sender: Any = None, request: Any = None, **_: Any) -> None:
        # Noted when the delivery has waited a moment for a free slot to run it: a worker
        # that dies holding it leaves a trace the sweeper acts on (``DeliveryNotes``).
        if request is not None and request.name == RUN_TASK and request.args:
            deliveries.received(str(request.args[0]))

    @app.task(  # type: ignore[untyped-decorator]
        name=RUN_TASK, acks_late=True, reject_on_worker_lost=True, ignore_result=True, bind=True
    )
    def run(task: Any, request_id: str) -> str:
        deliveries.started(request_id)  # its claim notes it
        try:
            return worker_process().runner.execute(request_id)
        except StoreUnavailable as exc:
            # The store was away (for the claim, or mid-run): this delivery goes back to the
            # broker, to be tried again after a pause, instead of being acknowledged as done.
            # (Should the broker not take it either, the sweeper sends the run again.)
            retries = int(task.request.retries or 0)
            pause = store_retry_pause(config.queue, retries)  # type: ignore[arg-type]
            logger.warning(
                "run %s: the store is unavailable (%s); delivered again in %.1f s",
                request_id,
                exc,
                pause,
            )
            raise task.retry(countdown=pause, max_retries=None) from None

    return app


def run_worker(
    config: HermesConfig,
    tools_files: Sequence[str] = (),
    *,
    concurrency: int = 4,
    pool: str = "threads",
    loglevel: str = "INFO",
    hostname: str | None = None,
) -> None:
    """Start a Celery worker that runs queued runs (blocks until it is stopped)."""
    app = worker_app(config, tools_files)
    argv = [
        "worker",
        f"--concurrency={concurrency}",
        f"--pool={pool}",
        f"--loglevel={loglevel}",
        "--without-gossip",
        "--without-mingle",
    ]
    assert config.queue is not None  # checked by worker_app
    if config.queue.task_events:
        argv.append("--events")
    if hostname:
        argv.append(f"--hostname={hostname}")
    if pool != "prefork":
        worker_process()  # build the agent before taking any task; fail fast on a bad config
    else:
        # The main process forks the children: it holds no agent, no run loop and no
        # sweeper (threads do not survive a fork), only a store for noting deliveries, made
        # before the fork so that every module the store needs is imported once, here.
        global _main_store
        from hermes_agent.config import StorageConfig
        from hermes_agent.storage.sql import SqlStorage
        from hermes_agent.worker.store import RunStore

        url = (config.storage or StorageConfig()).url
        _main_store = RunStore(SqlStorage(url), max_redeliveries=config.queue.max_redeliveries)
    settle_heap()  # before the pool forks: the children share the frozen heap's pages
    app.worker_main(argv)
