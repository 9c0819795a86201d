"""The audit trail on every store (in memory, SQLite, PostgreSQL): every stage recorded, failures
too, secrets redacted, export lossless, replay as a regression check (library and
``hermes-agent replay``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sqlalchemy import select

from hermes_agent import Agent, ScriptedModel
from hermes_agent.replay import replay
from hermes_agent.storage import SqlStorage, open_storage, parse_jsonl
from hermes_agent.storage.sql import audit_table, messages_table
from hermes_agent.testing import tool_call as call
from hermes_agent.tools.registry import Tool
from storage_backends import database_url  # noqa: F401  (the db_url fixture)


def lookup(city: str) -> dict[str, object]:
    """Weather for a city."""
    return {"city": city, "celsius": 21}


def double(x: int) -> int:
    """Twice x."""
    return 2 * x


def broken(x: int) -> int:
    """Always fails."""
    raise RuntimeError(f"disk on fire while handling {x}")


def test_every_stage_has_a_record_with_content_and_latency(db_url: str) -> None:
    with open_storage(db_url) as storage:
        model = ScriptedModel([call("lookup", city="Oslo"), "It is 21 °C in Oslo."])
        agent = Agent(model=model, tools=[lookup], storage=storage)
        result = agent.run("Weather in Oslo?", session_id="s1")
        records = storage.records(result.request_id)
        assert [(r.step, r.stage, r.role) for r in records] == [
            (0, "InputParser", "user"),
            (0, "ThoughtGenerator", "prompt"),
            (0, "ThoughtGenerator", "completion"),
            (0, "ToolSelector", "selection"),
            (0, "ToolExecutor", "tool"),
            (0, "ToolExecutor", "tool_calls"),
            (1, "ThoughtGenerator", "prompt_added"),
            (1, "ThoughtGenerator", "completion"),
            (1, "OutputRenderer", "output"),
        ]
        assert [r.seq for r in records] == list(range(len(records)))
        for record in records:
            assert record.content
            assert record.latency_ms >= 0 and record.timestamp_ns > 0
            assert record.request_id == result.request_id and record.session_id == "s1"
            assert record.status == "ok" and record.status_code == 200
            assert record.model_name == "scripted" and len(record.system_prompt_sha256) == 64
        assert records[0].content == "Weather in Oslo?"
        assert "<tools>" in records[1].content and "lookup" in records[1].content
        assert records[2].content == call("lookup", city="Oslo")
        assert '"celsius": 21' in records[4].content
        assert records[-1].content == "It is 21 °C in Oslo."
        summary = storage.requests()[0]
        assert summary["request_id"] == result.request_id
        assert (
            summary["steps"] == 2 and summary["status"] == "ok" and summary["model"] == "scripted"
        )
        agent.close()


def test_a_run_that_fails_in_a_tool_keeps_all_records(db_url: str) -> None:
    with open_storage(db_url) as storage:
        model = ScriptedModel([call("broken", x=7), "Sorry, the tool failed."])
        agent = Agent(model=model, tools=[broken], storage=storage)
        result = agent.run("Do it", session_id="s")
        records = storage.records(result.request_id)
        stages = [r.stage for r in records]
        assert stages == [
            "InputParser",
            "ThoughtGenerator",
            "ThoughtGenerator",
            "ToolSelector",
            "ToolExecutor",
            "ToolExecutor",
            "ThoughtGenerator",
            "ThoughtGenerator",
            "OutputRenderer",
        ]
        tool = records[4]
        assert "disk on fire while handling 7" in tool.content
        assert tool.status_code >= 400 and tool.status == "error"
        agent.close()


def test_a_run_whose_model_fails_keeps_its_records(db_url: str) -> None:
    with open_storage(db_url) as storage:
        model = ScriptedModel([call("double", x=2)])  # runs out after one turn: 502
        agent = Agent(model=model, tools=[double], storage=storage)
        result = agent.run("Double 2 twice", session_id="s")
        assert result.status == 502
        records = storage.records(result.request_id)
        assert [r.stage for r in records][-1] == "OutputRenderer"
        assert {r.step for r in records if r.stage == "ToolExecutor"} == {0}
        assert storage.requests()[0]["status_code"] == 502
        agent.close()


def test_secrets_never_reach_the_database(tmp_path: Path) -> None:
    api_key = "sk-live-4f9a8b7c6d5e4f3a2b1c"
    ssn = "123-45-6789"
    config = tmp_path / "config.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            model:
              provider: openai
              model_name: hermes-3
              api_key: {api_key}
            storage:
              url: sqlite:///{tmp_path / "state.db"}
            audit:
              redact_patterns: ['\\b\\d{{3}}-\\d{{2}}-\\d{{4}}\\b']
            """
        ),
        encoding="utf-8",
    )

    def account(owner: str) -> str:
        """Look up an account."""
        return f"owner={owner} ssn={ssn} token={api_key}"

    model = ScriptedModel([call("account", owner=f"me {ssn}"), f"Your SSN is {ssn}, key {api_key}"])
    agent = Agent.from_config(config, model=model, tools=[account])
    result = agent.run(f"My key is {api_key} and my SSN {ssn}; show my account", session_id="s")
    assert result.status == 200
    storage = agent.storage
    assert storage is not None
    records = storage.records(result.request_id)
    assert len(records) == 9 and any("[REDACTED]" in r.content for r in records)
    with storage.engine.connect() as conn:
        stored = [row[0] for row in conn.execute(select(messages_table.c.content))]
    assert any("[REDACTED]" in text for text in stored)
    storage.close()
    agent.close()
    raw = b"".join(path.read_bytes() for path in tmp_path.glob("state.db*"))
    assert raw, "the database file is missing"
    for secret in (api_key, ssn, "4f9a8b7c6d5e"):
        assert secret.encode() not in raw, f"{secret} found in the database file"


def test_export_is_lossless(db_url: str) -> None:
    with open_storage(db_url) as storage:
        model = ScriptedModel(
            [call("lookup", city='Zürich\u2028東京 "quoted"\n'), "Done:\n\ttabs, ünïcode ✓"]
        )
        agent = Agent(model=model, tools=[lookup], storage=storage)
        result = agent.run("Weather, please", session_id="s")
        records = storage.records(result.request_id)
        exported = storage.export_jsonl(result.request_id)
        assert exported.count("\n") == len(records) == 9
        assert parse_jsonl(exported) == records
        assert json.loads(exported.split("\n")[0])["stage"] == "InputParser"
        agent.close()


def test_replay_of_an_unchanged_agent_matches(db_url: str) -> None:
    with open_storage(db_url) as storage:
        script = [
            "Hello!",
            call("double", x=3),
            call("double", x=6),
            "Twice twice 3 is 12.",
        ]
        agent = Agent(model=ScriptedModel(script), tools=[double], storage=storage)
        agent.run("hi", session_id="s")
        result = agent.run("Double 3, then double that.", session_id="s")
        before = storage.sessions.load("s")
        report = replay(agent, result.request_id, storage)
        assert report.matched, report.summary()
        assert report.first_difference is None
        assert [s.step for s in report.steps] == [0, 1, 2]
        assert report.history_messages == 2  # the first turn, as the original run saw it
        assert report.actual_output == report.expected_output == "Twice twice 3 is 12."
        assert "all 3 steps match" in report.summary()
        # The replay left the real session and the trail as they were.
        assert storage.sessions.load("s") == before
        assert len(storage.requests()) == 2
        agent.close()


def test_replay_after_a_tool_change_reports_the_first_step_that_differs(db_url: str) -> None:
    with open_storage(db_url) as storage:
        script = [call("double", x=3), call("double", x=6), "12"]
        agent = Agent(model=ScriptedModel(script), tools=[double], storage=storage)
        result = agent.run("Double 3, then double that.", session_id="s")

        def changed(x: int) -> int:
            """Twice x (but not for 6 any more)."""
            return 2 * x if x != 6 else -1

        agent.add_tool(Tool.from_function(changed, name="double"), replace=True)
        report = replay(agent, result.request_id, storage)
        assert not report.matched
        assert report.first_difference == 1
        assert [s.matched for s in report.steps] == [True, False, True]
        step = report.steps[1]
        assert "tool results differ" in step.differences[0]
        assert "12" in step.differences[0] and "-1" in step.differences[0]
        assert "first at step 1" in report.summary()
        agent.close()


TOOLS_V1 = '''
from hermes_agent import tool

@tool
def double(x: int) -> int:
    """Twice x."""
    return 2 * x
'''


def test_replay_command_exits_non_zero_when_a_step_differs(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "model:\n  provider: scripted\n  responses:\n"
        f"    - {json.dumps(call('double', x=21))}\n"
        "    - 'It is 42.'\n"
        f"storage:\n  url: sqlite:///{tmp_path / 'state.db'}\n",
        encoding="utf-8",
    )
    v1, v2 = tmp_path / "v1.py", tmp_path / "v2.py"
    v1.write_text(TOOLS_V1, encoding="utf-8")
    v2.write_text(TOOLS_V1.replace("return 2 * x", "return 2 * x + 1"), encoding="utf-8")

    def hermes(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "hermes_agent", *args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            env={**os.environ, "COLUMNS": "200"},
        )

    ran = hermes("run", "-c", str(config), "-t", str(v1), "--no-demo-tools", "Double 21")
    assert ran.returncode == 0, ran.stderr
    listed = hermes("trace", "list", "-c", str(config), "--json")
    assert listed.returncode == 0, listed.stderr
    request_id = json.loads(listed.stdout)[0]["request_id"]

    same = hermes("replay", request_id, "-c", str(config), "-t", str(v1), "--no-demo-tools")
    assert same.returncode == 0, same.stdout + same.stderr
    assert "match" in same.stdout

    changed = hermes("replay", request_id, "-c", str(config), "-t", str(v2), "--no-demo-tools")
    assert changed.returncode == 1, changed.stdout + changed.stderr
    assert "first difference at step 0" in changed.stderr
    assert "42" in changed.stderr and "43" in changed.stderr

    shown = hermes("trace", "show", request_id, "--db", f"sqlite:///{tmp_path / 'state.db'}")
    assert shown.returncode == 0, shown.stderr
    for stage in ("InputParser", "ThoughtGenerator", "ToolSelector", "ToolExecutor"):
        assert stage in shown.stdout
    out = tmp_path / "trace.jsonl"
    exported = hermes("trace", "export", request_id, "-c", str(config), "-o", str(out))
    assert exported.returncode == 0, exported.stderr
    with SqlStorage(f"sqlite:///{tmp_path / 'state.db'}") as storage:
        assert parse_jsonl(out.read_text(encoding="utf-8")) == storage.records(request_id)
        session_id = storage.records(request_id)[0].session_id
    sessions = hermes("sessions", "list", "-c", str(config), "--json")
    assert [s["id"] for s in json.loads(sessions.stdout)] == [session_id]
    shown_session = hermes("sessions", "show", session_id, "-c", str(config))
    assert shown_session.returncode == 0 and "Double 21" in shown_session.stdout
    deleted = hermes("sessions", "delete", session_id, "-c", str(config))
    assert deleted.returncode == 0
    assert hermes("sessions", "show", session_id, "-c", str(config)).returncode == 2
    missing = hermes("replay", "no-such-request", "-c", str(config), "--no-demo-tools")
    assert missing.returncode == 2 and "no audit records" in missing.stderr


@pytest.mark.parametrize("rows", [0, 3])
def test_requests_lists_newest_first(tmp_path: Path, rows: int) -> None:
    with SqlStorage(f"sqlite:///{tmp_path / 'state.db'}") as storage:
        agent = Agent(model=ScriptedModel(lambda m, t: "ok"), storage=storage)
        ids = [agent.run(f"q{n}", session_id="s").request_id for n in range(rows)]
        listed = storage.requests(limit=2)
        assert [r["request_id"] for r in listed] == list(reversed(ids))[:2]
        with storage.engine.connect() as conn:
            assert len(conn.execute(select(audit_table.c.id)).all()) == 4 * rows
        agent.close()
