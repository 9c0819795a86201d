"""Submitting runs to the workers and waiting for them: ``submit(agent, ...)`` and the service's
``execution: queue`` both go through ``QueueClient``.

    from hermes_agent.worker import submit

    handle = submit(agent, "What is 17 * 23?", session_id="alice")
    result = handle.result(timeout=300)
"""

from __future__ import annotations

import time
import uuid
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from hermes_agent.agent import Agent
from hermes_agent.config import QueueConfig
from hermes_agent.errors import HermesAgentError
from hermes_agent.runs.request import QueuedRequest
from hermes_agent.storage.base import Storage
from hermes_agent.types import RunResult, ToolCallRecord, ToolChoice, Usage
from hermes_agent.worker.app import enqueue, make_celery
from hermes_agent.worker.store import QueuedRun, RunStore


class QueueClient:
    """Puts runs on the queue and reads their state back (any process, any machine)."""

    def __init__(self, queue: QueueConfig, storage: Storage) -> None:
        from hermes_agent.storage.sql import SqlStorage

        if not isinstance(storage, SqlStorage):
            raise HermesAgentError(
                "submit() keeps runs in the agent's SQL store; create the agent with "
                "storage='postgresql+psycopg://...' (the workers' store)"
            )
        self.queue = queue
        self.store = RunStore(storage, max_redeliveries=queue.max_redeliveries)
        self.app = make_celery(queue)

    def submit(
        self,
        message: str,
        *,
        session_id: str | None = None,
        owner: str = "",
        run_timeout_s: float | None = None,
        **options: Any,
    ) -> RunHandle:
        """Queue a run; ``run_timeout_s``: it ends ``timed_out`` once it has run that long
        (counted from when a worker first starts it, across its attempts)."""
        session_id = session_id or uuid.uuid4().hex
        from hermes_agent.tracing import outgoing_context  # the submitter's trace, if any

        request = QueuedRequest(message=message, trace_context=outgoing_context(), **options)
        request_id = self.store.add(session_id, request, owner=owner, run_timeout_s=run_timeout_s)
        try:
            self.send(request_id)
        except Exception as exc:  # nothing will run it: do not leave it queued
            problem = f"the broker refused the run: {type(exc).__name__}: {exc}"
            self.store.cancel(request_id, problem)
            raise HermesAgentError(
                f"{problem}; check queue.broker ({self.queue.broker.split('@')[-1]}) is up"
            ) from exc
        return RunHandle(request_id, session_id, self)

    def send(self, request_id: str) -> None:
        enqueue(self.app, self.queue, request_id)

    def decide(
        self,
        request_id: str,
        approval_id: str,
        approved: bool,
        reason: str | None,
        admit: Callable[[Connection], None] | None = None,
    ) -> bool:
        """Answer a pending approval; the run goes back to the queue and resumes (``admit``:
        as in ``RunStore.add``)."""
        if not self.store.decide(request_id, approval_id, approved, reason, admit):
            return False
        self.send(request_id)
        return True


@dataclass(slots=True)
class RunHandle:
    """A submitted run: its ids, and ways to wait for it."""

    request_id: str
    session_id: str
    client: QueueClient

    def state(self) -> QueuedRun:
        found = self.client.store.get(self.request_id)
        if found is None:
            raise HermesAgentError(f"run {self.request_id} is not in the store")
        return found

    def status(self) -> str:
        return self.state().status

    def result(self, timeout: float | None = None, poll: float = 0.05) -> RunResult:
        """Wait for the run to finish and return its result. ``TimeoutError`` after ``timeout``
        seconds; ``HermesAgentError`` when it failed, was cancelled or was dead-lettered."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            run = self.state()
            if run.status == "completed" and run.result is not None:
                return result_from_dict(run.result)
            if run.finished:
                raise HermesAgentError(f"run {self.request_id} {run.status}: {run.error}")
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(
                    f"run {self.request_id} is still {run.status} after {timeout:g} s"
                )
            time.sleep(poll)


def result_from_dict(data: dict[str, Any]) -> RunResult:
    """The ``RunResult`` a worker stored (``RunResult.to_dict``), rebuilt: output, status,
    ids, tool calls, usage, error, approvals and warnings (the steps stay in the trail)."""
    usage = data.get("usage") or {}
    return RunResult(
        output=data.get("output", ""),
        status=int(data.get("status", 200)),
        request_id=data["request_id"],
        session_id=data["session_id"],
        tool_calls=[
            ToolCallRecord(
                c["name"],
                c.get("arguments", {}),
                c.get("result"),
                c.get("status_code", 200),
                c.get("error"),
                c.get("id", ""),
                c.get("metadata", {}),
            )
            for c in data.get("tool_calls", [])
        ],
        usage=Usage(
            usage.get("prompt_tokens", 0),
            usage.get("completion_tokens", 0),
            usage.get("requests", 0),
        ),
        duration_ms=data.get("duration_ms", 0.0),
        error=data.get("error"),
        loop_status=data.get("loop_status", "completed"),
        approvals=data.get("approvals", []),
        warnings=data.get("warnings", []),
        data=data.get("data"),
        cost=data.get("cost"),
    )


_CLIENTS: weakref.WeakKeyDictionary[Agent, QueueClient] = weakref.WeakKeyDictionary()
"""One client per agent that submits (its broker connections are reused)."""


def submit(
    agent: Agent,
    message: str,
    *,
    session_id: str | None = None,
    tool_choice: ToolChoice | None = None,
    toolsets: Iterable[str] | None = None,
    output_format: str | None = None,
    run_timeout_s: float | None = None,
) -> RunHandle:
    """Queue ``message`` for the workers (``hermes-agent worker``) and return at once with a
    handle: ``handle.result(timeout)`` waits for the ``RunResult``. Needs the agent's config's
    ``queue:`` section (or ``agent.queue``) and the workers' SQL store as its ``storage``; the
    workers run the turn with their own agent (the same config). ``run_timeout_s``: the run
    ends ``timed_out`` once it has run that long. See docs/scale-out.md."""
    if agent.queue is None:
        raise HermesAgentError(
            "submit() needs a queue: add a queue: section (broker: redis://... or "
            "amqp://...) to the config, or set agent.queue = QueueConfig(broker=...)"
        )
    if agent.storage is None:
        raise HermesAgentError(
            "submit() keeps runs in the workers' store; create the agent with storage= "
            "the URL the workers use (postgresql+psycopg://...)"
        )
    client = _CLIENTS.get(agent)
    if client is None:
        client = _CLIENTS[agent] = QueueClient(agent.queue, agent.storage)
    return client.submit(
        message,
        session_id=session_id,
        tool_choice=tool_choice,
        toolsets=list(toolsets) if toolsets is not None else None,
        output_format=output_format,
        run_timeout_s=run_timeout_s,
    )
