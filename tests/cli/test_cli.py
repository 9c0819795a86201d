"""The ``hermes-agent`` command as a person reads it: run as a real process (a scripted model
via config), in a temporary working folder with a temporary HOME."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hermes_agent.audit.records import AuditRecord
from hermes_agent.cli import app
from hermes_agent.demo_tools import calculator, convert_units, current_datetime
from hermes_agent.storage.sql import SqlStorage
from hermes_agent.types import Message

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "17 * 23"}}\n</tool_call>'
DIVIDE_BY_ZERO = '<tool_call>{"name": "calculator", "arguments": {"expression": "1/0"}}</tool_call>'


@dataclass
class Cli:
    """``hermes-agent`` in a process of its own, in ``cwd``, with ``home`` as HOME."""

    cwd: Path
    home: Path

    def __call__(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        stdin: str | None = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        environment = {k: v for k, v in os.environ.items() if k != "HERMES_DEBUG"}
        environment.update({"HOME": str(self.home), **(env or {})})
        return subprocess.run(
            [sys.executable, "-m", "hermes_agent", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.cwd,
            env=environment,
            input=stdin,
        )


@pytest.fixture
def hermes(tmp_path: Path) -> Cli:
    (tmp_path / "work").mkdir()
    (tmp_path / "home").mkdir()
    return Cli(tmp_path / "work", tmp_path / "home")


def scripted(folder: Path, *responses: str, name: str = "config.yaml") -> Path:
    path = folder / name
    listed = "".join(f"\n    - {json.dumps(response)}" for response in responses) or " []"
    path.write_text(f"model:\n  provider: scripted\n  responses:{listed}\n")
    return path


@pytest.fixture
def scripted_config(tmp_path: Path) -> Path:
    return scripted(tmp_path, CALL, "17 * 23 = 391")


# -- run: answers, calls, errors ----------------------------------------------------------


def test_run_json_prints_the_run_result(hermes: Cli, scripted_config: Path) -> None:
    done = hermes("run", "--config", str(scripted_config), "--json", "What is 17 * 23?")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == 200 and result["output"] == "17 * 23 = 391"
    assert result["tool_calls"][0]["name"] == "calculator"
    assert result["tool_calls"][0]["result"] == 391


def test_the_answer_goes_to_stdout_and_the_calls_to_stderr(
    hermes: Cli, scripted_config: Path
) -> None:
    done = hermes("run", "--config", str(scripted_config), "What is 17 * 23?")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "17 * 23 = 391\n"
    assert done.stderr == '✓ calculator({"expression": "17 * 23"}) → 391\n'


def test_a_failed_call_shows_its_error_not_null(hermes: Cli, tmp_path: Path) -> None:
    config = scripted(tmp_path, DIVIDE_BY_ZERO, CALL, "391")
    done = hermes("run", "--config", str(config), "What is 1/0, then 17 * 23?")
    assert done.returncode == 0, done.stderr
    failed, succeeded = done.stderr.splitlines()
    assert failed == (
        '✗ calculator({"expression": "1/0"}) → 500 '
        "tool 'calculator' raised ZeroDivisionError: division by zero"
    )
    assert succeeded == '✓ calculator({"expression": "17 * 23"}) → 391'
    assert "null" not in done.stderr


def test_a_failed_run_is_an_error_on_stderr_and_exit_1(hermes: Cli, tmp_path: Path) -> None:
    config = scripted(tmp_path)  # no responses: the model fails
    done = hermes("run", "--config", str(config), "hi")
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.startswith("error: 502 ") and "ran out of responses" in done.stderr
    assert len(done.stderr.splitlines()) == 1


def test_model_text_is_printed_as_it_is(hermes: Cli, tmp_path: Path) -> None:
    # Rich would read [bold] as markup and :smile: as an emoji code.
    answer = "Use [bold]x[/bold] or [red] and :smile: as typed"
    config = scripted(tmp_path, answer)
    done = hermes("run", "--config", str(config), "hi")
    assert done.returncode == 0, done.stderr
    assert done.stdout == answer + "\n"


# -- errors a person reads ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--config", "absent.yaml", "hi"], "cannot read the config file"),
        (["run", "--tools", "absent.py", "hi"], "error: --tools absent.py: no such file"),
        # Brackets in a file name are text, not markup.
        (["run", "--tools", "tools[bold].py", "hi"], "error: --tools tools[bold].py: no such file"),
        (["run", "--bogus", "hi"], "No such option: --bogus"),
    ],
)
def test_bad_input_is_an_error_on_stderr_and_exit_code_2(
    hermes: Cli, args: list[str], message: str
) -> None:
    done = hermes(*args)
    assert done.returncode == 2
    assert message in done.stderr
    assert done.stdout == ""
    assert "Traceback" not in done.stderr and "╭" not in done.stderr


def test_a_yaml_error_keeps_its_brackets(hermes: Cli, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [scripted\n")
    done = hermes("run", "--config", str(bad), "hi")
    assert done.returncode == 2
    assert f"error: {bad}: not valid YAML" in done.stderr
    assert "model: [scripted" in done.stderr


def test_a_long_error_is_one_line_off_a_terminal_and_names_the_config(
    hermes: Cli, tmp_path: Path
) -> None:
    config = tmp_path / "endpoint.yaml"
    config.write_text("model:\n  provider: openai\n  base_url: http://127.0.0.1:9/v1\n")
    done = hermes("run", "--config", str(config), "hi", env={"COLUMNS": "80"})
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert line.startswith(f"error: {config}: model.model_name: required with provider 'openai'")
    assert len(line) > 80


def test_the_missing_local_extra_names_the_install_command(hermes: Cli, tmp_path: Path) -> None:
    shadow = tmp_path / "shadow" / "llama_cpp"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named llama_cpp')\n")
    done = hermes("run", "hi", env={"PYTHONPATH": str(shadow.parent)})
    assert done.returncode == 1
    assert 'pip install "hermes-agent-core[local]"' in done.stderr


# -- dry runs -------------------------------------------------------------------------------


def test_a_dry_run_says_so_and_lists_the_plan(hermes: Cli, tmp_path: Path) -> None:
    refund = '<tool_call>{"name": "refund_order", "arguments": {"order": "A-17"}}</tool_call>'
    config = scripted(tmp_path, CALL + refund)
    done = hermes("run", "--dry-run", "--config", str(config), "17 * 23, and refund A-17")
    assert done.returncode == 0, done.stderr
    headline, planned, refused = done.stdout.splitlines()
    assert headline == "Dry run: the model planned 1 valid call, 1 refused; nothing was run."
    assert planned == '  ✓ calculator({"expression": "17 * 23"})'
    assert refused.startswith("  ✗ refund_order(")
    assert refused.endswith(
        "→ 404 tool 'refund_order' does not exist; available tools: "
        "calculator, current_datetime, convert_units"
    )


def test_a_dry_run_without_a_planned_call_says_so(hermes: Cli, tmp_path: Path) -> None:
    config = scripted(tmp_path, "Hello there.")
    done = hermes("run", "--dry-run", "--config", str(config), "Hello")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "Dry run: the model planned no tool call; nothing was run.",
        "Hello there.",
    ]
    as_json = hermes("run", "--dry-run", "--json", "--config", str(config), "Hello")
    assert json.loads(as_json.stdout)["tool_calls"] == []
    assert as_json.stderr == "Dry run: the model planned no tool call; nothing was run.\n"


# -- debug, tools files ---------------------------------------------------------------------


def test_debug_prints_one_line_per_stage(hermes: Cli, scripted_config: Path) -> None:
    done = hermes("run", "--config", str(scripted_config), "--debug", "What is 17 * 23?")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("[INFO]")]
    # A fresh working folder: .hermes/state.db is made without a word about its schema.
    assert (hermes.cwd / ".hermes" / "state.db").is_file()
    assert not [line for line in done.stderr.splitlines() if "storage:" in line], done.stderr
    stages = [line.split(":")[0].removeprefix("[INFO] ") for line in lines]
    assert stages == [
        "InputParser",
        "ThoughtGenerator",
        "ToolCall",  # each call the model wrote, with its arguments
        "ToolSelector",
        "ToolExecutor",
        "ThoughtGenerator",
        "OutputRenderer",
    ]
    assert "[INFO] ThoughtGenerator: status=200, selected_tools=['calculator']" in lines
    assert '[INFO] ToolCall: step=0, name=calculator, arguments={"expression": "17 * 23"}' in lines
    assert done.stdout.strip() == "17 * 23 = 391"


def test_hermes_debug_env_variable_turns_on_debug(hermes: Cli, scripted_config: Path) -> None:
    done = hermes("run", "--config", str(scripted_config), "hi", env={"HERMES_DEBUG": "1"})
    assert "[INFO] InputParser: status=200" in done.stderr


def test_user_tools_file_is_loaded(hermes: Cli, tmp_path: Path) -> None:
    tools_file = tmp_path / "my_tools.py"
    tools_file.write_text(
        "from hermes_agent import tool\n\n"
        "@tool\n"
        "def shout(text: str) -> str:\n"
        '    """Upper-case a text."""\n'
        "    return text.upper()\n",
        encoding="utf-8",
    )
    shout = '<tool_call>{"name": "shout", "arguments": {"text": "hey"}}</tool_call>'
    config = scripted(tmp_path, shout, "done")
    done = hermes("run", "--config", str(config), "--tools", str(tools_file), "--json", "shout hey")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["tool_calls"][0]["result"] == "HEY"
    listed = hermes("tools", "--tools", str(tools_file), "--json")
    names = [t["function"]["name"] for t in json.loads(listed.stdout)]
    assert names == ["calculator", "current_datetime", "convert_units", "shout"]


# -- chat -----------------------------------------------------------------------------------


def test_chat_streams_answers_and_shows_calls_as_they_happen(
    hermes: Cli, scripted_config: Path
) -> None:
    done = hermes("chat", "--config", str(scripted_config), stdin="What is 17 * 23?\n/exit\n")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert '→ calculator({"expression": "17 * 23"})' in out
    assert "← calculator [200]" in out
    assert out.index("→ calculator") < out.index("17 * 23 = 391")


@pytest.mark.parametrize("leave", ["/exit", "/quit"])
def test_chat_commands_are_not_messages_to_the_model(
    hermes: Cli, tmp_path: Path, leave: str
) -> None:
    config = scripted(tmp_path)  # a message to the model would fail: it has no responses
    done = hermes("chat", "--config", str(config), stdin=f"/help\n/frobnicate\n{leave}\nhi\n")
    assert done.returncode == 0, done.stderr
    assert "/help" in done.stdout and "/exit" in done.stdout and "/quit" in done.stdout
    assert "agent>" not in done.stdout  # nothing was sent; the chat ended before "hi"
    assert done.stderr == "error: unknown command /frobnicate; /help lists the commands\n"
    with SqlStorage(f"sqlite:///{hermes.cwd / '.hermes' / 'state.db'}") as storage:
        assert storage.requests() == []


# -- ids given by their first characters ----------------------------------------------------


def test_request_ids_are_whole_when_piped_and_taken_by_prefix(hermes: Cli, tmp_path: Path) -> None:
    config = scripted(tmp_path, CALL, "391")
    assert hermes("run", "--config", str(config), "What is 17 * 23?").returncode == 0
    listed = hermes("trace", "list")
    assert listed.returncode == 0, listed.stderr
    request_id = json.loads(hermes("trace", "list", "--json").stdout)[0]["request_id"]
    assert request_id in listed.stdout and "…" not in listed.stdout
    shown = hermes("trace", "show", request_id[:8])
    assert shown.returncode == 0, shown.stderr
    assert f"Request {request_id}" in shown.stdout and "ToolExecutor" in shown.stdout
    replayed = hermes("replay", request_id[:6], "--config", str(config))
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert f"replay of {request_id}: all 2 steps match" in replayed.stdout
    session_id = json.loads(hermes("sessions", "list", "--json").stdout)[0]["id"]
    assert session_id in hermes("sessions", "list").stdout
    assert "What is 17 * 23?" in hermes("sessions", "show", session_id[:5]).stdout


def _record(request_id: str, session_id: str = "s") -> AuditRecord:
    return AuditRecord(
        request_id, session_id, 0, "InputParser", "user", "hi", 1, 0.1, "ok", 200, "m", "0" * 64
    )


@pytest.fixture
def crafted_db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'crafted.db'}"
    with SqlStorage(url) as storage:
        storage.audit.write([_record(rid) for rid in ("abc-1", "abc-2", "ABD-3", "a%_4", "abc")])
        for session_id in ("team-alpha", "team-beta", "solo"):
            storage.sessions.append(session_id, [Message("user", f"hello from {session_id}")])
    return url


def test_id_prefixes_are_case_sensitive_and_literal(crafted_db: str) -> None:
    with SqlStorage(crafted_db) as storage:
        assert storage.request_ids_with_prefix("abc") == ["abc", "abc-1", "abc-2"]
        assert storage.request_ids_with_prefix("abc", limit=2) == ["abc", "abc-1"]
        assert storage.request_ids_with_prefix("AB") == ["ABD-3"]
        assert storage.request_ids_with_prefix("a%") == ["a%_4"]  # no LIKE wildcards
        assert storage.request_ids_with_prefix("a_") == []
        assert storage.sessions.session_ids_with_prefix("team") == ["team-beta", "team-alpha"]


def test_an_ambiguous_prefix_lists_the_candidates(crafted_db: str) -> None:
    runner = CliRunner()
    ambiguous = runner.invoke(app, ["trace", "show", "abc-", "--db", crafted_db])
    assert ambiguous.exit_code == 2
    assert ambiguous.stderr == (
        "error: request id 'abc-' is ambiguous: abc-1, abc-2 start with it; give more characters\n"
    )
    exact = runner.invoke(app, ["trace", "show", "abc", "--db", crafted_db])  # a whole id wins
    assert exact.exit_code == 0 and "Request abc\n" in exact.stdout
    unique = runner.invoke(app, ["trace", "export", "ABD", "--db", crafted_db])
    assert unique.exit_code == 0 and json.loads(unique.stdout)["request_id"] == "ABD-3"
    missing = runner.invoke(app, ["trace", "show", "zzz", "--db", crafted_db])
    assert missing.exit_code == 2 and "no audit records for request 'zzz'" in missing.stderr
    team = runner.invoke(app, ["sessions", "show", "team", "--db", crafted_db])
    assert team.exit_code == 2
    assert "session id 'team' is ambiguous: team-beta, team-alpha start with it" in team.stderr
    solo = runner.invoke(app, ["sessions", "show", "so", "--db", crafted_db])
    assert solo.exit_code == 0 and "hello from solo" in solo.stdout


def test_deleting_a_session_takes_the_whole_id(crafted_db: str) -> None:
    runner = CliRunner()
    guessed = runner.invoke(app, ["sessions", "delete", "so", "--db", crafted_db])
    assert guessed.exit_code == 2
    assert "nothing deleted (give the whole id); did you mean solo?" in guessed.stderr
    deleted = runner.invoke(app, ["sessions", "delete", "solo", "--db", crafted_db])
    assert deleted.exit_code == 0 and deleted.stdout == "deleted session solo\n"


# -- eval reports ---------------------------------------------------------------------------


def test_eval_writes_its_report_under_hermes_or_where_report_says(tmp_path: Path) -> None:
    # The conftest runs each test in its own working folder: tmp_path.
    (tmp_path / "tools.py").write_text(
        "from hermes_agent import tool\n\n@tool\ndef ping() -> str:\n"
        '    """Ping."""\n    return "pong"\n'
    )
    scripted(tmp_path, '<tool_call>{"name": "ping", "arguments": {}}</tool_call>')
    (tmp_path / "suite.yaml").write_text(
        "name: one\nconfig: config.yaml\ntools: [tools.py]\ncases:\n"
        "  - id: ping\n    question: Ping?\n    expect: [{name: ping}]\n"
    )
    runner = CliRunner()
    done = runner.invoke(app, ["eval", "suite.yaml", "--quiet"])
    assert done.exit_code == 0, done.output
    assert done.stderr == f"report: {Path('.hermes') / 'eval-report.json'}\n"
    assert json.loads((tmp_path / ".hermes" / "eval-report.json").read_text())["cases"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".hermes",
        "config.yaml",
        "suite.yaml",
        "tools.py",
    ]
    elsewhere = runner.invoke(app, ["eval", "suite.yaml", "-q", "--report", "out/r.json"])
    assert elsewhere.exit_code == 0, elsewhere.output
    assert (tmp_path / "out" / "r.json").is_file()


# -- the demo tools -------------------------------------------------------------------------


def test_calculator_is_safe_and_correct() -> None:
    assert calculator("17 * 23") == 391
    assert calculator("2 ^ 10") == 1024
    assert calculator("sqrt(16) + pi - pi") == 4
    assert calculator("7 / 2") == 3.5
    for hostile in ["__import__('os').system('true')", "(1).__class__", "9 ** 9 ** 9", "open('x')"]:
        with pytest.raises(ValueError):
            calculator(hostile)


def test_unit_conversion_and_datetime() -> None:
    assert convert_units(1, "km", "m")["value"] == 1000
    assert convert_units(100, "c", "f")["value"] == 212
    with pytest.raises(ValueError, match="cannot convert length"):
        convert_units(1, "km", "kg")
    assert current_datetime("UTC").endswith("+00:00")
    with pytest.raises(ValueError, match="unknown timezone"):
        current_datetime("Mars/Base")
