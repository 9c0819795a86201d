"""The one composition root: what serves an agent's runs, built in one place for every door.

    from hermes_agent.backends import build_backend

    served = build_backend(agent, ServiceSettings(), config=config)
    served.backend                       # the RunBackend every front door runs through
    await served.shutdown(grace_s=30)    # or served.close() where no event loop runs

``build_backend`` picks, for an agent and the service's settings:

- **the API keys**: ``keys`` when given; else ``settings.keys_url``; else the config's
  ``storage.url``; else the agent's own SQL database, so that a key made with
  ``hermes-agent keys create`` on that database is a key the service accepts; else this
  process's memory, which a warning says when callers must present keys (no command can add a
  key there);
- **the daily quotas**, counted beside the keys (in memory when the keys are, or when there are
  none);
- **the engine**: in process (``server.in_process``: one fork of the agent serves every run), and
  with ``execution: queue`` the Celery workers of the config's ``queue:`` section
  (``server.queued``), which borrow the in-process gate, quotas and shutdown.

The HTTP service (``server.app.create_app``), the MCP server (``mcp.server.AgentMcpServer``, over
HTTP and stdio, mounted in the service or on its own) and ``hermes-agent mcp serve`` take what
they serve from here and build none of it themselves.
"""

from __future__ import annotations

import dataclasses
import logging

from hermes_agent.agent import Agent
from hermes_agent.config import HermesConfig
from hermes_agent.runs.backend import RunBackend
from hermes_agent.runs.gate import Gate
from hermes_agent.runs.in_process import serve_in_process
from hermes_agent.runs.keys import KeyStore, open_key_store
from hermes_agent.runs.local import RunManager
from hermes_agent.runs.metrics import ServiceMetrics
from hermes_agent.runs.quotas import MemoryQuotaStore, Quotas, quota_store_for
from hermes_agent.runs.settings import ServiceSettings, store_url
from hermes_agent.runs.trail import recover_interrupted
from hermes_agent.storage.base import Storage
from hermes_agent.storage.engine import safe_url
from hermes_agent.storage.sql import SqlStorage
from hermes_agent.worker.backend import QueueService, check_queue_mode

logger = logging.getLogger("hermes_agent.server")

MEMORY = "memory://"


@dataclasses.dataclass(slots=True)
class Backends:
    """What a door serves runs with: ``backend`` (the seam it calls), the fork of the agent
    that runs them (``agent``), the in-process ``manager`` (its gate, quotas, approvals and
    shutdown, which the queue borrows too), the ``keys`` callers present (``None`` where no
    caller presents one), and ``keys_url``, where they are kept (password hidden)."""

    settings: ServiceSettings
    agent: Agent
    manager: RunManager
    backend: RunBackend
    metrics: ServiceMetrics
    keys: KeyStore | None
    keys_url: str | None
    queue: QueueService | None

    def recover(self) -> list[str]:
        """In process: end the runs an earlier life of this instance left open (their ids);
        a store that cannot be read is logged and leaves them. Queued runs are the workers'."""
        if self.queue is not None:
            return []
        try:
            return recover_interrupted(self.agent, self.settings.instance)
        except Exception:
            logger.exception("cannot end the runs an earlier life left open (the store)")
            return []

    @property
    def gate(self) -> Gate:
        """The run layer's gate every run passes (a door may ask it before a run starts)."""
        return self.manager.gate

    async def drain(self, grace_s: float) -> None:
        """Stop taking runs and let those in flight finish for ``grace_s``, then cancel them
        (followers receive ``run_stopped``); nothing is released."""
        await self.manager.shutdown(grace_s)

    async def shutdown(self, grace_s: float) -> None:
        """Stop taking runs, let those in flight finish for ``grace_s`` (then cancel them),
        and release everything: the queue's broker connections, the serving fork's model
        connections (opened on this loop) and tool pools (the audit trail is flushed), and
        the keys."""
        await self.drain(grace_s)
        if self.queue is not None:
            self.queue.close()
        await self.agent.close_connections()
        self.close(queue=False)

    def close(self, *, queue: bool = True) -> None:
        """Release what ``build_backend`` opened, where no event loop runs (the CLI)."""
        if queue and self.queue is not None:
            self.queue.close()
        self.agent.close()
        if self.keys is not None:
            self.keys.close()


def check_backend(
    settings: ServiceSettings, config: HermesConfig | None, storage: Storage | None = None
) -> None:
    """``ConfigError`` for settings no backend can be built from (``execution: queue``
    without a ``queue:`` section or a SQL store), before anything is built: a door calls it
    before it builds the agent, so that a bad config does not load a model first."""
    if settings.execution == "queue":
        check_queue_mode(config, storage)


def keys_url_for(settings: ServiceSettings, config: HermesConfig | None, agent: Agent) -> str:
    """Where the API keys are: ``settings.keys_url``, else the config's ``storage.url``, else
    the agent's SQL database (not one in this process's memory), else ``memory://``."""
    storage = agent.storage
    own = storage.url if isinstance(storage, SqlStorage) and not storage.in_memory else MEMORY
    return store_url(settings, config, own)


def build_backend(
    agent: Agent,
    settings: ServiceSettings,
    *,
    config: HermesConfig | None = None,
    keys: KeyStore | None = None,
    with_keys: bool = True,
    metrics: ServiceMetrics | None = None,
    quotas: Quotas | None = None,
) -> Backends:
    """Keys, quotas and engine for ``agent`` under ``settings`` (see the module). ``keys``
    are handed over (``Backends.close`` closes them); ``with_keys=False`` opens none (stdio,
    or a server whose callers all run as one local user). ``quotas`` replaces the settings'
    quotas counted beside the keys. Raises ``ConfigError`` (``check_backend``) and
    ``StorageError`` (a key store that cannot be opened)."""
    check_backend(settings, config, agent.storage)
    where: str | None = None
    if keys is None and with_keys:
        url = keys_url_for(settings, config, agent)
        where = safe_url(url) if not url.startswith("memory:") else MEMORY
        if where == MEMORY and settings.auth == "keys":
            logger.warning(
                "API keys are kept in this process's memory: neither service.keys_url, "
                "storage.url nor the agent's storage names a database, so no key made with "
                "`hermes-agent keys create` is accepted (401); give the agent SQL storage, "
                "set keys_url, or create keys through the app's own key store"
            )
        keys = open_key_store(url)
    if quotas is None:
        counted = quota_store_for(keys) if keys is not None else MemoryQuotaStore()
        quotas = Quotas(settings.quotas, counted)
    engine = serve_in_process(agent, settings, metrics=metrics, quotas=quotas)
    queue: QueueService | None = None
    if settings.execution == "queue":
        assert config is not None and engine.agent.storage is not None  # check_backend
        try:
            queue = QueueService(config, engine.agent.storage, settings, engine.manager)
        except BaseException:
            engine.close()
            if keys is not None:
                keys.close()
            raise
    return Backends(
        settings=settings,
        agent=engine.agent,
        manager=engine.manager,
        backend=queue if queue is not None else engine.backend,
        metrics=engine.manager.metrics,
        keys=keys,
        keys_url=where,
        queue=queue,
    )
