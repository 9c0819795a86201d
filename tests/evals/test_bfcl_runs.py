"""Long BFCL runs: an endpoint in both modes, several cases at once, a report written as cases
finish, a killed run that resumes where it stopped, and reports compared side by side."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from hermes_agent import ScriptedModel
from hermes_agent.cli import app
from hermes_agent.errors import HermesAgentError
from hermes_agent.evals import bfcl_compat, bfcl_install
from hermes_agent.evals.bfcl import BfclHarness, load_cases, shared_model
from hermes_agent.evals.report import CaseResult
from hermes_agent.evals.resume import ReportWriter, journal_path
from openai_server import ScriptedServer, call, running_server, text, tool_calls

runner = CliRunner()
needs_bfcl = pytest.mark.skipif(not bfcl_compat.available(), reason=bfcl_install.missing_message())
TRIANGLE = {"base": 10, "height": 5}  # simple_python_0: calculate_triangle_area, right answer
CLI = [sys.executable, "-c", "from hermes_agent.cli import main; main()"]


@pytest.fixture()
def server() -> Iterator[ScriptedServer]:
    with running_server() as scripted:
        yield scripted


def _config(folder: Path, base_url: str, mode: str) -> Path:
    path = folder / f"{mode}.yaml"
    path.write_text(
        "model:\n"
        "  provider: openai\n"
        "  model_name: scripted-model\n"
        f"  base_url: {base_url}\n"
        "  api_key: test-key\n"
        f"  mode: {mode}\n"
        "  max_retries: 0\n",
        encoding="utf-8",
    )
    return path


# -- the report writer ------------------------------------------------------------------------


def _result(case_id: str, correct: bool = True, **fields: Any) -> CaseResult:
    return CaseResult(case_id, "simple_python", correct, **fields)


def test_the_journal_keeps_every_finished_case_and_resume_reads_it_back(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    settings = {"model": "m", "mode": "native", "limit": 3}
    writer = ReportWriter(path, "BFCL · m", settings, interval=0.0)
    writer.start()
    writer.add(_result("a"))
    writer.add(_result("b", False, error="harness error: ConnectionError: down"))
    writer.add(_result("c", False, model_error="endpoint unreachable"))
    writer.add(_result("d", False, error="wrong value"))
    journal = journal_path(path)
    lines = journal.read_text(encoding="utf-8").splitlines()
    assert json.loads(lines[0]) == {"settings": settings}
    assert [json.loads(line)["id"] for line in lines[1:]] == ["a", "b", "c", "d"]
    partial = json.loads(path.read_text(encoding="utf-8"))  # rewritten as cases finish
    assert partial["settings"]["complete"] is False and len(partial["cases"]) == 4
    writer.close()
    with journal.open("a", encoding="utf-8") as handle:
        handle.write('{"id": "e", "categ')  # the line a killed run was writing

    again = ReportWriter(path, "BFCL · m", {**settings, "limit": 10})  # limit may change
    done = again.resume(["model", "mode"])
    assert sorted(done) == ["a", "d"]  # harness and model errors are asked again
    assert done["d"].error == "wrong value"

    other = ReportWriter(path, "BFCL · m", {**settings, "mode": "hermes"})
    with pytest.raises(HermesAgentError, match="mode: 'native' then, 'hermes' now"):
        other.resume(["model", "mode"])

    again.start(done.values())
    report = again.finish([done["a"], _result("b"), done["d"]])
    assert not journal.exists()
    final = json.loads(path.read_text(encoding="utf-8"))
    assert final["settings"]["complete"] is True
    assert [case["id"] for case in final["cases"]] == ["a", "b", "d"]
    assert report.correct == 2
    # A finished run resumes from its report: nothing left to do.
    assert sorted(ReportWriter(path, "x", settings).resume(["model"])) == ["a", "b", "d"]


# -- workers --------------------------------------------------------------------------------


class _Gate(ScriptedModel):
    """Answers only once ``count`` model calls are in flight at the same time."""

    def __init__(self, count: int) -> None:
        super().__init__(lambda messages, tools: "No call.")
        self.count = count
        self.waiting = 0
        self.most = 0

    async def complete(self, messages: Any, tools: Any, settings: Any) -> Any:
        self.waiting += 1
        self.most = max(self.most, self.waiting)
        async with asyncio.timeout(20):  # fewer workers than ``count``: a harness error
            while self.most < self.count:
                await asyncio.sleep(0.01)  # a barrier: each call waits for all (bounded above)
        self.waiting -= 1
        return await super().complete(messages, tools, settings)


@needs_bfcl
def test_workers_run_cases_at_the_same_time() -> None:
    cases = load_cases("simple_python", 6)
    gate = _Gate(3)
    seen: list[str] = []
    harness = BfclHarness(shared_model(gate))
    report = harness.run(cases, workers=3, on_result=lambda result: seen.append(result.id))
    assert gate.most == 3  # never more than --workers
    assert [r.id for r in report.results] == [c.id for c in cases]  # in case order
    assert sorted(seen) == sorted(c.id for c in cases)
    assert all(r.error == "no function call" for r in report.results), report.failures()


@needs_bfcl
@pytest.mark.parametrize("mode", ["native", "hermes"])
def test_an_endpoint_runs_bfcl_in_both_modes_with_workers(
    tmp_path: Path, server: ScriptedServer, mode: str
) -> None:
    if mode == "native":
        server.default = tool_calls(call("calculate_triangle_area", TRIANGLE))
    else:
        body = json.dumps({"name": "calculate_triangle_area", "arguments": TRIANGLE})
        server.default = text(f"<tool_call>{body}</tool_call>")
    out = tmp_path / f"{mode}.json"
    config = _config(tmp_path, server.base_url, mode)
    args = ["eval", "bfcl", "--category", "simple_python,irrelevance", "--limit", "4"]
    done = runner.invoke(app, [*args, "--config", str(config), "-w", "3", "-r", str(out), "-q"])
    assert done.exit_code == 0, done.output
    report = json.loads(out.read_text(encoding="utf-8"))
    settings = report["settings"]
    assert (settings["mode"], settings["endpoint"], settings["workers"]) == (
        mode,
        server.base_url,
        3,
    )
    assert settings["complete"] is True and report["title"] == f"BFCL · scripted-model ({mode})"
    assert len(server.requests) == 8  # one model turn per single-turn case
    if mode == "native":
        assert all("tools" in body for body in server.requests)
    else:
        assert all("<tools>" in body["messages"][0]["content"] for body in server.requests)
    verdicts = {case["id"]: case["correct"] for case in report["cases"]}
    assert verdicts["simple_python_0"] is True
    assert [verdicts[f"simple_python_{i}"] for i in (1, 2, 3)] == [False] * 3
    # The same call where no function fits: every irrelevance case is wrong, and says why.
    irrelevance = [c for c in report["cases"] if c["category"] == "irrelevance"]
    assert [c["error"] for c in irrelevance] == ["the model called a function where none fits"] * 4
    assert not journal_path(out).exists()


# -- killed and resumed -----------------------------------------------------------------------


def _wait_for_lines(path: Path, count: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if path.is_file() and len(path.read_text(encoding="utf-8").splitlines()) >= count:
            return
        if process.poll() is not None:
            pytest.fail(f"the run ended early: {process.stderr.read() if process.stderr else ''}")
        time.sleep(0.1)  # the polling pace, bounded by the deadline above
    pytest.fail(f"{path} never reached {count} lines")


@needs_bfcl
def test_a_killed_run_continues_where_it_stopped(tmp_path: Path, server: ScriptedServer) -> None:
    body = json.dumps({"name": "calculate_triangle_area", "arguments": TRIANGLE})
    server.default = text(f"<tool_call>{body}</tool_call>", delay=0.2)
    config = _config(tmp_path, server.base_url, "hermes")
    out = tmp_path / "slow.json"
    args = ["eval", "bfcl", "--category", "simple_python", "--limit", "24", "-w", "2"]
    args += ["--config", str(config), "-r", str(out), "-q"]
    process = subprocess.Popen([*CLI, *args], cwd=tmp_path, stderr=subprocess.PIPE)
    try:
        _wait_for_lines(journal_path(out), 1 + 6, process)  # the settings, then six cases
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(30)
    kept = len(journal_path(out).read_text(encoding="utf-8").splitlines()) - 1
    asked_before = len(server.requests)
    assert 6 <= kept < 24

    resumed = runner.invoke(app, [*args, "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert f"resuming {out}: {kept} of 24 cases already done" in resumed.output
    report = json.loads(out.read_text(encoding="utf-8"))
    assert [c["id"] for c in report["cases"]] == [f"simple_python_{i}" for i in range(24)]
    assert report["settings"]["complete"] is True
    # simple_python_0 and _11 both ask for the area of a triangle of base 10, height 5.
    assert [c["id"] for c in report["cases"] if c["correct"]] == [
        "simple_python_0",
        "simple_python_11",
    ]
    assert len(server.requests) - asked_before == 24 - kept  # only the rest was asked
    assert asked_before - kept <= 2  # at most the two cases in flight were lost
    assert not journal_path(out).exists()


@needs_bfcl
def test_ctrl_c_writes_the_report_so_far_and_says_how_to_resume(
    tmp_path: Path, server: ScriptedServer
) -> None:
    # A second per case: the 40 cases outlast the wait for three, however slow the machine.
    server.default = text("No call.", delay=1.0)
    config = _config(tmp_path, server.base_url, "native")
    out = tmp_path / "interrupted.json"
    args = ["eval", "bfcl", "--category", "irrelevance", "--limit", "40", "-w", "2"]
    # Ctrl-C as a terminal gives it, even where this run was started in the background (whose
    # children inherit SIGINT ignored, and Python then raises no KeyboardInterrupt).
    takes_ctrl_c = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    command = [sys.executable, "-c", takes_ctrl_c + CLI[-1], *args]
    process = subprocess.Popen(
        [*command, "--config", str(config), "-r", str(out), "-q"],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200"},
    )
    _wait_for_lines(journal_path(out), 1 + 3, process)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    message = " ".join(stderr.decode().split())
    assert "interrupted:" in message and "run the same command with --resume" in message
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["settings"]["complete"] is False
    assert 3 <= len(report["cases"]) < 40
    assert all(case["correct"] for case in report["cases"])


# -- compare ----------------------------------------------------------------------------------


@needs_bfcl
def test_compare_puts_reports_side_by_side_as_a_table_and_a_chart(
    tmp_path: Path, server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    reports = []
    for mode, reply in (
        ("native", tool_calls(call("calculate_triangle_area", TRIANGLE))),
        ("hermes", text("I would work it out by hand.")),
    ):
        server.default = reply
        out = tmp_path / f"{mode}.json"
        config = _config(tmp_path, server.base_url, mode)
        args = ["eval", "bfcl", "--category", "simple_python,irrelevance", "-n", "2", "-q"]
        assert runner.invoke(app, [*args, "--config", str(config), "-r", str(out)]).exit_code == 0
        reports.append(str(out))

    chart = tmp_path / "compare.png"
    done = runner.invoke(app, ["eval", "--compare", *reports, "--chart", str(chart)])
    assert done.exit_code == 0, done.output
    rows = {line.split("│")[1].strip(): line for line in done.output.splitlines() if "│" in line}
    assert {"simple_python", "irrelevance", "total"} <= set(rows)
    cells = [cell.strip() for cell in rows["simple_python"].split("│")[2:-1]]
    # cases, accuracy A/B, malformed A/B, invalid A/B, no call A/B
    # native: right on case 0, an unknown tool on case 1; hermes: prose both times.
    assert cells == ["2", "50.0%", "0.0%", "0.0%", "0.0%", "50.0%", "0.0%", "0.0%", "100.0%"]
    assert "A: scripted-model (native)" in done.output
    assert "B: scripted-model (hermes)" in done.output
    assert chart.read_bytes().startswith(b"\x89PNG")

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    bare = runner.invoke(app, ["eval", "--compare", *reports, "--chart", str(tmp_path / "x.png")])
    assert bare.exit_code == 0 and "no chart" in bare.output and "matplotlib" in bare.output
    assert "total" in bare.output and not (tmp_path / "x.png").exists()

    alone = runner.invoke(app, ["eval", "--compare", reports[0]])
    assert alone.exit_code == 2 and "two or more reports" in alone.output


def test_workers_are_refused_for_the_embedded_model_and_one_target_is_needed() -> None:
    embedded = runner.invoke(app, ["eval", "bfcl", "--model", "embedded", "--workers", "2"])
    assert embedded.exit_code == 2 and "one case at a time" in embedded.output
    two = runner.invoke(app, ["eval", "a.yaml", "b.yaml"])
    assert two.exit_code == 2 and "or use --compare" in two.output
