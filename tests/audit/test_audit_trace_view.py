"""``audit.trace_view``: a run's records read back per step, the one reading the console and
``hermes-agent trace show`` share: stages, prompt, thought and notes, each call paired with its
decision, result and approval; and the cheap summary the runs list shows."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from hermes_agent import Agent, ScriptedModel
from hermes_agent.audit.records import AuditRecord, Role
from hermes_agent.audit.trace_view import (
    CallApproval,
    trace_summary,
    trace_view,
)
from hermes_agent.cli import app
from hermes_agent.protocol.parser import NOTE_CALL_IN_THOUGHT
from hermes_agent.storage.sql import SqlStorage
from hermes_agent.testing import tool_call
from hermes_agent.tools.registry import Tool
from hermes_agent.types import Message, ToolCall

THOUGHT = "Maybe " + tool_call("lookup", city="Oslo") + " no."


def script(messages: Sequence[Message], _tools: object) -> str:
    user = str(next(m.content for m in reversed(messages) if m.role == "user"))
    if messages[-1].role == "tool":
        return "done"
    if user == "mixed":  # a call the selector refuses, then one that runs
        return (
            f"<think>{THOUGHT}</think>\n"
            + tool_call("no_such_tool", x=1)
            + "\n"
            + tool_call("lookup", city="Rome")
        )
    if user == "delete":  # two calls that need approval: one is approved, one is not
        return tool_call("delete_file", path="/a") + tool_call("delete_file", path="/b")
    return "hello"


def make_agent(db: str) -> Agent:
    def lookup(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    def delete_file(path: str) -> str:
        """Delete a file (pretend)."""
        return f"deleted {path}"

    def approver(call: ToolCall, _tool: Tool) -> tuple[bool, str]:
        return (call.arguments["path"] == "/a", f"asked about {call.arguments['path']}")

    agent = Agent(model=ScriptedModel(script), storage=db, approver=approver)
    agent.add_tool(Tool.from_function(lookup))
    agent.add_tool(Tool.from_function(delete_file, requires_approval=True))
    return agent


def recorded(tmp_path: Path, message: str) -> tuple[str, list[AuditRecord]]:
    db = f"sqlite:///{tmp_path / 'state.db'}"
    agent = make_agent(db)
    try:
        request_id = agent.run(message).request_id
    finally:
        agent.close()
    storage = SqlStorage(db)
    try:
        return db, storage.records(request_id)
    finally:
        storage.close()


def test_a_run_reads_back_per_step_with_each_call_paired(tmp_path: Path) -> None:
    _, records = recorded(tmp_path, "mixed")
    view = trace_view(records)

    assert view.model == "scripted" and len(view.system_prompt_sha256 or "") == 64
    assert (view.user_message, view.output) == ("mixed", "done")
    assert view.pipeline_records == len(records) == len(view.records)
    assert [step.step for step in view.steps] == [0, 1]
    first, last = view.steps
    assert [s.stage for s in first.stages if s.ran] == [
        "InputParser",
        "ThoughtGenerator",
        "ToolSelector",
        "ToolExecutor",
    ]
    assert [s.stage for s in last.stages if s.ran] == ["ThoughtGenerator", "OutputRenderer"]
    selector = next(s for s in first.stages if s.stage == "ToolSelector")
    assert selector.status_code == 206  # one of the two calls was refused
    not_run = next(s for s in first.stages if s.stage == "OutputRenderer")
    assert (not_run.ran, not_run.status_code, not_run.latency_ms) == (False, None, None)
    # The whole prompt first, then only the turns added to it.
    assert first.prompt is not None and last.prompt is not None
    assert (first.prompt.kind, last.prompt.kind) == (Role.PROMPT, Role.PROMPT_ADDED)
    # The thought and the call inside it are read from the completion; that call never ran.
    assert (first.thought, first.notes) == (THOUGHT, (NOTE_CALL_IN_THOUGHT,))
    refused, ran = first.calls
    assert (refused.name, refused.refused, refused.ran, refused.status_code) == (
        "no_such_tool",
        True,
        False,
        404,
    )
    assert refused.arguments == {"x": 1} and "no_such_tool" in str(refused.error)
    assert (ran.name, ran.ran, ran.status_code, ran.result) == (
        "lookup",
        True,
        200,
        "sunny in Rome",
    )
    assert ran.arguments == {"city": "Rome"} and ran.cache_hit is False
    assert ran.execution_time_ms is not None and "tool_name" not in ran.metadata
    assert (last.calls, last.output, last.thought) == ((), "done", None)
    # Each step's records are the run's, in order, split by step.
    assert [r for step in view.steps for r in step.records] == records
    # JSON-ready, without the records.
    shown = json.loads(json.dumps(first.to_dict()))
    assert shown["calls"][1]["result"] == "sunny in Rome" and "records" not in shown


def test_each_of_two_equal_looking_calls_gets_its_own_answer(tmp_path: Path) -> None:
    _, records = recorded(tmp_path, "delete")
    answers = [
        {"tool": "delete_file", "arguments": {"path": "/b"}, "approved": False, "reason": "no"},
        {"tool": "delete_file", "arguments": {"path": "/a"}, "approved": True, "reason": "ok"},
    ]
    approved, denied = trace_view(records, answers).steps[0].calls
    assert (approved.ran, approved.approval) == (True, CallApproval(True, "ok"))
    assert (denied.refused, denied.status_code) == (True, 403)
    assert denied.approval == CallApproval(False, "no")
    assert len(answers) == 2  # the caller's list is left as it was

    # Without the answers the refusal still says it was an approval that was not given.
    approved, denied = trace_view(records).steps[0].calls
    assert approved.approval is None
    assert denied.approval is not None and denied.approval.approved is False
    assert "approval" in str(denied.approval.reason)


def accepted(first: AuditRecord) -> AuditRecord:
    """The record a service writes when it admits a run, before the pipeline's."""
    return dataclasses.replace(
        first,
        stage="RunManager",
        role=Role.ACCEPTED,
        content=json.dumps({"status": "running"}),
        timestamp_ns=first.timestamp_ns - 5_000_000_000,  # it waited 5 s in a queue
        latency_ms=0.0,
        status_code=202,
        system_prompt_sha256="",
        seq=-1,
    )


def test_the_services_acceptance_record_is_no_part_of_the_steps(tmp_path: Path) -> None:
    db, records = recorded(tmp_path, "mixed")
    alone = trace_view(records)
    with_service = trace_view([accepted(records[0]), *records])

    assert with_service.steps == alone.steps
    assert with_service.started == alone.started
    assert with_service.duration_ms == alone.duration_ms
    assert with_service.system_prompt_sha256 == alone.system_prompt_sha256 != ""
    assert (with_service.pipeline_records, len(with_service.records)) == (
        len(records),
        len(records) + 1,
    )
    # Before the pipeline wrote anything, the trail knows only the run's ids.
    waiting = trace_view([accepted(records[0])])
    assert waiting.steps == () and waiting.request_id == records[0].request_id
    assert (waiting.model, waiting.started, waiting.duration_ms) == (None, None, None)

    # `trace show`'s caption names the pipeline's prompt hash, not the acceptance's empty one.
    storage = SqlStorage(db)
    try:
        storage.audit.write([accepted(records[0])])
        storage.audit.flush()
    finally:
        storage.close()
    shown = CliRunner().invoke(
        app, ["trace", "show", records[0].request_id, "--db", db], env={"COLUMNS": "200"}
    )
    assert shown.exit_code == 0, shown.output
    assert f"system prompt sha256 {records[0].system_prompt_sha256[:12]}" in shown.stdout
    assert "RunManager" in shown.stdout  # the table still lists every record


def test_the_summary_a_list_shows(tmp_path: Path) -> None:
    _, records = recorded(tmp_path, "mixed")
    summary = trace_summary([accepted(records[0]), *records])
    assert summary.steps == 2 and summary.status_code == 200
    assert summary.tools == ("lookup", "no_such_tool")  # a step's planned calls come first
    assert summary.duration_ms is not None and summary.duration_ms >= 5000  # the wait counts
    running = trace_summary(records[:3])
    assert (running.steps, running.status_code, running.tools) == (1, None, ())
    empty = trace_summary([])
    assert (empty.duration_ms, empty.steps, empty.tools, empty.status_code) == (None, 0, (), None)


def record(step: int, stage: str, role: Role, content: Any, at_ms: int) -> AuditRecord:
    text = content if isinstance(content, str) else json.dumps(content)
    return AuditRecord(
        request_id="r",
        session_id="s",
        step=step,
        stage=stage,
        role=role,
        content=text,
        timestamp_ns=at_ms * 1_000_000,
        latency_ms=1.0,
        status="ok",
        status_code=200,
        model_name="m",
        system_prompt_sha256="h",
    )


def test_calls_selected_but_not_run_and_unreadable_records() -> None:
    # A dry run: the selector decided, the executor never ran.
    selection = {
        "planned": [{"name": "lookup", "arguments": {"city": "Rome"}}, "not a call"],
        "rejected": [{"name": "nope", "status": 404, "error": "tool 'nope' does not exist"}],
    }
    view = trace_view(
        [
            record(0, "InputParser", Role.USER, "hi", 10),
            record(0, "ThoughtGenerator", Role.COMPLETION, "<tool_call>…", 20),
            record(0, "ToolSelector", Role.SELECTION, selection, 30),
            record(1, "ToolSelector", Role.SELECTION, "{not json", 40),
        ]
    )
    planned, rejected = view.steps[0].calls
    assert (planned.name, planned.arguments, planned.ran, planned.refused) == (
        "lookup",
        {"city": "Rome"},
        False,
        False,
    )
    assert (rejected.name, rejected.refused, rejected.status_code) == ("nope", True, 404)
    assert view.steps[1].calls == ()
    assert view.steps[0].offset_ms == 0.0 and view.steps[1].offset_ms == 30.0
    assert view.duration_ms == 31.0  # from the first stage's start to the last record
    assert trace_view([]).steps == () and trace_view([]).request_id is None
