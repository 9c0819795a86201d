"""A run stopped by its approver says so: when the calls of the last turns were refused by the
approver (denied, or the approval expired), the run ends with 403 and the denial — never 502,
"the model produced no usable tool call" — on the facade, the in-process service and a queued
worker. And an identical call approved earlier in the run is not asked for again: the run's
approvals record the reuse."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from hermes_agent import Agent, ScriptedModel
from hermes_agent.pipeline.status import Status
from hermes_agent.runs.request import QueuedRequest
from hermes_agent.server import ServiceSettings, create_app
from hermes_agent.storage.sql import SqlStorage
from hermes_agent.testing import tool_call as call
from hermes_agent.tools.registry import Tool
from hermes_agent.types import Message, ToolCall
from hermes_agent.worker.runner import RunWorker
from hermes_agent.worker.store import RunStore
from server_harness import delete_file, poll_run, serve

BLAMED_ON_MODEL = "the model produced no usable tool call"


def insisting(messages: Sequence[Message], _tools: Sequence[dict[str, Any]]) -> str:
    """A model that asks to delete the same file on every turn, whatever it is told."""
    return call("delete_file", path="/tmp/report.txt")


def agent_with(script: Any, storage: str = "memory://", **options: Any) -> Agent:
    agent = Agent(model=ScriptedModel(script), storage=storage, **options)
    agent.add_tool(Tool.from_function(delete_file, requires_approval=True))
    return agent


# -- the pipeline (facade) ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        ((False, "not on Fridays"), "was denied (not on Fridays)"),
        ((False, "expired"), "its approval expired with no answer"),
        ("no", "was denied (the approver returned 'no'"),
    ],
)
def test_turns_refused_by_the_approver_end_the_run_with_403_and_the_denial(
    answer: Any, said: str
) -> None:
    asked: list[ToolCall] = []

    def approver(proposed: ToolCall, _tool: Tool) -> Any:
        asked.append(proposed)
        return answer

    result = agent_with(insisting, approver=approver).run("clean up")
    assert result.status == Status.DENIED == 403
    assert result.loop_status == "failed"
    assert result.error is not None and said in result.error
    assert "'delete_file'" in result.error and BLAMED_ON_MODEL not in result.error
    assert said in result.output
    assert len(asked) == 3  # max_retries (2) + 1 turns, each asked again: denials are not kept
    assert [c.status_code for c in result.tool_calls] == [403, 403, 403]


def test_no_approver_at_all_is_a_denial_too() -> None:
    result = agent_with(insisting).run("clean up")
    assert result.status == 403
    assert result.error is not None and "no approver is configured" in result.error


def test_malformed_turns_mixed_with_denials_still_end_as_a_denial_that_says_both() -> None:
    turns = iter(['<tool_call>{"name": "delete_file", "arguments": {', insisting([], [])])

    def script(messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> str:
        return next(turns, insisting(messages, tools))

    result = agent_with(script, approver=lambda *_: (False, "nope")).run("clean up")
    assert result.status == 403
    assert result.error is not None
    assert "denied (nope)" in result.error and "in 1 of them the model's calls" in result.error


def test_a_model_that_only_writes_malformed_calls_is_still_the_models_fault() -> None:
    broken = '<tool_call>{"name": "delete_file", "arguments": {'
    result = agent_with([broken] * 3, approver=lambda *_: True).run("clean up")
    assert result.status == Status.MODEL_ERROR
    assert result.error is not None and BLAMED_ON_MODEL in result.error


def test_a_denial_the_model_accepts_is_an_ordinary_answer() -> None:
    result = agent_with(
        [insisting([], []), "I was not allowed to delete it."], approver=lambda *_: False
    ).run("clean up")
    assert result.status == 200 and result.output == "I was not allowed to delete it."


# -- one approval per identical call in a run ---------------------------------------------------


def test_an_identical_call_just_approved_is_not_asked_again_in_the_run() -> None:
    script = [
        call("delete_file", path="/tmp/a"),
        call("delete_file", path="/tmp/a"),  # the same call: approved already
        call("delete_file", path="/tmp/b"),  # other arguments: asked
        call("delete_file", path="/tmp/a") + call("delete_file", path="/tmp/a"),
        "done",
    ]
    asked: list[dict[str, Any]] = []

    def approver(proposed: ToolCall, _tool: Tool) -> tuple[bool, str]:
        asked.append(proposed.arguments)
        return True, f"ok {len(asked)}"

    result = agent_with(script, approver=approver, max_iterations=6).run("clean up")
    assert result.status == 200, result.error
    assert asked == [{"path": "/tmp/a"}, {"path": "/tmp/b"}]
    assert [c.status_code for c in result.tool_calls] == [200] * 5
    trail = [
        (a["arguments"]["path"], a["reason"], a.get("reused", False)) for a in result.approvals
    ]
    assert trail == [
        ("/tmp/a", "ok 1", False),
        ("/tmp/a", "ok 1", True),
        ("/tmp/b", "ok 2", False),
        ("/tmp/a", "ok 1", True),
        ("/tmp/a", "ok 1", True),
    ]


def test_a_denied_call_is_asked_again_and_argument_types_count() -> None:
    flag_tool = Tool.from_function(flag, requires_approval=True)
    script = [
        call("flag", value=1),
        call("flag", value=1),  # denied the first time: asked again, approved now
        call("flag", value=True),  # true is not 1: asked
        "done",
    ]
    answers = iter([False, True, True])
    asked: list[Any] = []

    def approver(proposed: ToolCall, _tool: Tool) -> bool:
        asked.append(proposed.arguments["value"])
        return next(answers)

    agent = Agent(model=ScriptedModel(script), approver=approver)
    agent.add_tool(flag_tool)
    result = agent.run("flag it")
    assert result.status == 200, result.error
    assert asked == [1, 1, True] and [type(v) for v in asked] == [int, int, bool]
    assert not any(a.get("reused") for a in result.approvals)


def flag(value: int | bool) -> str:
    """Set a flag."""
    return f"set {value!r}"


# -- the in-process service: an approval nobody answers ---------------------------------------


def test_the_service_ends_a_run_whose_approvals_expire_with_403_and_says_they_expired(
    tmp_path: Path,
) -> None:
    agent = agent_with(insisting, storage=f"sqlite:///{tmp_path / 'state.db'}")
    settings = ServiceSettings(auth="none", approval_policy="wait", approval_timeout_s=0.2)
    with serve(create_app(agent=agent, settings=settings)) as url:
        client = httpx.Client(base_url=url, timeout=30)
        reply = client.post("/v1/runs", json={"message": "clean up"})
        assert reply.status_code == 202, reply.text
        body = poll_run(client, reply.json()["request_id"], timeout=20)
    assert body["status"] == "failed"
    result = body["result"]
    assert result["status"] == 403
    assert "its approval expired with no answer" in result["error"]
    assert BLAMED_ON_MODEL not in result["error"]
    assert [a["reason"] for a in result["approvals"]] == ["expired"] * 3


def test_the_openai_facade_streams_the_denial_of_a_run_its_approver_stopped(
    tmp_path: Path,
) -> None:
    agent = agent_with(insisting, storage=f"sqlite:///{tmp_path / 'state.db'}")
    settings = ServiceSettings(auth="none", approval_policy="wait", approval_timeout_s=0.2)
    body = {
        "model": "hermes-agent",
        "messages": [{"role": "user", "content": "clean up"}],
        "stream": True,
    }
    with (
        serve(create_app(agent=agent, settings=settings)) as url,
        httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30) as r,
    ):
        frames = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    chunks = [json.loads(f) for f in frames if f != "[DONE]"]
    errors = [c["error"] for c in chunks if "error" in c]
    assert len(errors) == 1, frames
    assert "its approval expired with no answer" in errors[0]["message"]
    assert BLAMED_ON_MODEL not in errors[0]["message"]


# -- the queued engine -------------------------------------------------------------------------


def test_a_queued_run_denied_by_its_owner_ends_failed_with_403(
    url: str, cleanup: list[Any]
) -> None:
    agent = agent_with(insisting, storage=url)
    assert isinstance(agent.storage, SqlStorage)
    store = RunStore(agent.storage, max_redeliveries=1)
    worker = RunWorker(agent, store, lambda _rid: None, name="w:1", lease_ttl=5.0)
    cleanup.extend([agent, worker])
    rid = store.add("s-denied", QueuedRequest(message="clean up"))
    for _ in range(3):  # each turn asks; the owner says no each time
        assert worker.execute(rid) == "waiting_approval"
        (pending,) = store.pending_approvals(rid)
        assert store.decide(rid, pending["approval_id"], False, "not that file")
    assert worker.execute(rid) == "failed"
    run = store.get(rid)
    assert run is not None and run.status == "failed" and run.result is not None
    assert run.result["status"] == 403
    assert "was denied (not that file)" in run.result["error"]
    assert BLAMED_ON_MODEL not in run.result["error"]
