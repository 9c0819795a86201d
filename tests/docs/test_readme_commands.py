"""Every command example in README.md, run as written (in a temporary working folder, with a
temporary HOME), checked against what the README says it shows.

The commands are read from the README's ``bash`` blocks, not copied here: each test names the
start of the command it runs, and ``test_every_readme_command_is_run_by_a_test`` fails when the
README gains a command no test runs. Not run: installing (``pip install``, ``--setup``: the
network and the environment) and ``pytest`` (this suite). Placeholders are filled in:
``REQUEST_ID`` with a recorded request, ``config.yaml`` and ``my_tools.py`` are written first.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from hermes_agent.demo_tools import calculator
from hermes_agent.runs.settings import ServiceSettings
from hermes_agent.storage.sql import SqlStorage
from openai_server import ScriptedServer, running_fixture, server_fixture, text  # noqa: F401  (the fixtures)

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

# The start of each README command a test here runs (one command each).
RUN_QUICK = 'hermes-agent run "What is 17 * 23?"'
RUN_JSON_DEBUG = "hermes-agent run --json --debug"
RUN_CONFIG = "hermes-agent run --config config.yaml --tools my_tools.py"
CHAT = "hermes-agent chat"
TOOLS = "hermes-agent tools"
DRY_RUN = "hermes-agent run --dry-run"
SESSIONS_LIST = "hermes-agent sessions list"
TRACE_LIST = "hermes-agent trace list"
TRACE_SHOW = "hermes-agent trace show REQUEST_ID"
REPLAY = "hermes-agent replay REQUEST_ID"
EVAL_SUITE = "hermes-agent eval examples/eval_cases.yaml"
EVAL_BFCL = "hermes-agent eval bfcl"
SERVE = "hermes-agent serve"  # with CURL: run as a pair by test_cli_serve.py
CURL = "curl -s http://127.0.0.1:8000/v1/runs"
RUN_BY_TESTS = (
    RUN_QUICK,
    RUN_JSON_DEBUG,
    RUN_CONFIG,
    CHAT,
    TOOLS,
    DRY_RUN,
    SESSIONS_LIST,
    TRACE_LIST,
    TRACE_SHOW,
    REPLAY,
    EVAL_SUITE,
    EVAL_BFCL,
    SERVE,
    CURL,
)
STAGES = ("InputParser", "ThoughtGenerator", "ToolSelector", "ToolExecutor", "OutputRenderer")


# -- the README's commands ------------------------------------------------------------------


def readme_commands() -> list[list[str]]:
    """Every command in the README's bash blocks, as argv: comments dropped, ``&&`` chains
    split."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    commands: list[list[str]] = []
    for block in blocks:
        for line in block.splitlines():
            current: list[str] = []
            for token in [*shlex.split(line, comments=True), "&&"]:
                if token == "&&":
                    if current:
                        commands.append(current)
                    current = []
                else:
                    current.append(token)
    return commands


def is_not_run(argv: list[str]) -> bool:
    """Installing needs the network and changes the environment; ``pytest`` is this suite.
    (Variables set for the command, ``CMAKE_ARGS=... pip ...``, do not hide what it is.)"""
    while argv and re.fullmatch(r"[A-Z_]+=.*", argv[0]):
        argv = argv[1:]
    return argv[0] in ("pip", "pytest") or "--setup" in argv


def readme_command(start: str) -> list[str]:
    """The one README command that begins with ``start``."""
    assert start in RUN_BY_TESTS
    wanted = shlex.split(start)
    found = {
        tuple(argv)
        for argv in readme_commands()
        if not is_not_run(argv) and argv[: len(wanted)] == wanted
    }
    assert len(found) == 1, f"README.md has {len(found)} commands starting {start!r}: {found}"
    return list(found.pop())


def test_every_readme_command_is_run_by_a_test() -> None:
    commands = [argv for argv in readme_commands() if not is_not_run(argv)]
    assert len(commands) >= len(RUN_BY_TESTS)
    for argv in commands:
        starts = [s for s in RUN_BY_TESTS if argv[: len(shlex.split(s))] == shlex.split(s)]
        assert len(starts) == 1, f"README command {shlex.join(argv)!r} is run by {starts}"
    for start in RUN_BY_TESTS:
        readme_command(start)


# -- running them ---------------------------------------------------------------------------


def hermes_agent_command() -> list[str]:
    # The console script installed beside this Python (as the README uses it), else the module.
    script = Path(sys.executable).with_name("hermes-agent")
    if script.is_file():
        return [str(script)]
    found = shutil.which("hermes-agent")
    return [found] if found else [sys.executable, "-m", "hermes_agent"]


@dataclass
class Shell:
    """Runs README commands in ``cwd`` with ``home`` as HOME, as a person would type them."""

    cwd: Path
    home: Path

    def __call__(
        self,
        argv: list[str],
        *,
        stdin: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 300,
        **placeholders: str,
    ) -> subprocess.CompletedProcess[str]:
        assert argv[0] == "hermes-agent"
        args = [placeholders.get(arg, arg) for arg in argv[1:]]
        environment = {k: v for k, v in os.environ.items() if k != "HERMES_DEBUG"}
        environment.update({"HOME": str(self.home), **(env or {})})
        return subprocess.run(
            [*hermes_agent_command(), *args],
            cwd=self.cwd,
            env=environment,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def make_shell(folder: Path) -> Shell:
    (folder / "work").mkdir()
    (folder / "home").mkdir()
    return Shell(folder / "work", folder / "home")


@pytest.fixture
def shell(tmp_path: Path) -> Shell:
    return make_shell(tmp_path)


@dataclass
class QuickStart:
    """The quick start's command, run once in a folder of its own: the state that the
    ``sessions``, ``trace`` and ``replay`` examples read."""

    shell: Shell
    done: subprocess.CompletedProcess[str]

    def storage(self) -> SqlStorage:
        return SqlStorage(f"sqlite:///{self.shell.cwd / '.hermes' / 'state.db'}")


@pytest.fixture(scope="module")
def quick_start(tmp_path_factory: pytest.TempPathFactory) -> QuickStart:
    shell = make_shell(tmp_path_factory.mktemp("readme-quick-start"))
    return QuickStart(shell, shell(readme_command(RUN_QUICK)))


# -- the embedded model ---------------------------------------------------------------------


@pytest.mark.embedded
def test_quick_start_shows_the_call_the_model_made_and_its_answer(
    quick_start: QuickStart,
) -> None:
    done = quick_start.done
    assert done.returncode == 0, done.stderr
    # "The ✓ calculator({"expression": "17 * 23"}) → 391 line is the tool call the model made
    # (valid by construction) and what the tool returned" — the model chooses the expression.
    line = next(line for line in done.stderr.splitlines() if line.startswith("✓ "))
    matched = re.fullmatch(r'✓ calculator\(\{"expression": (".*")\}\) → (.+)', line)
    assert matched, line
    expression = json.loads(matched[1])
    assert json.loads(matched[2]) == calculator(expression)
    # "the text after it is the 135M model's own answer"
    assert done.stdout.strip()


@pytest.mark.embedded
def test_sessions_list_shows_the_conversation_kept_in_state_db(quick_start: QuickStart) -> None:
    assert (quick_start.shell.cwd / ".hermes" / "state.db").is_file()
    with quick_start.storage() as storage:
        [session_id] = storage.sessions.session_ids()
    done = quick_start.shell(readme_command(SESSIONS_LIST))
    assert done.returncode == 0, done.stderr
    assert "Sessions (1)" in done.stdout and session_id in done.stdout


@pytest.mark.embedded
def test_trace_list_shows_the_recorded_request(quick_start: QuickStart) -> None:
    with quick_start.storage() as storage:
        [request] = storage.requests()
    done = quick_start.shell(readme_command(TRACE_LIST))
    assert done.returncode == 0, done.stderr
    assert "Requests (1)" in done.stdout
    assert request["request_id"] in done.stdout  # whole, since this is not a terminal


@pytest.mark.embedded
def test_trace_show_prints_every_stage_of_the_request(quick_start: QuickStart) -> None:
    with quick_start.storage() as storage:
        [request] = storage.requests()
    request_id = request["request_id"]
    for given in (request_id, request_id[:5]):  # its first characters name it too
        done = quick_start.shell(readme_command(TRACE_SHOW), REQUEST_ID=given)
        assert done.returncode == 0, done.stderr
        assert f"Request {request_id}" in done.stdout
        for stage in STAGES:
            assert stage in done.stdout


@pytest.mark.embedded
def test_replay_reruns_the_request_and_every_step_matches(quick_start: QuickStart) -> None:
    with quick_start.storage() as storage:
        [request] = storage.requests()
    done = quick_start.shell(readme_command(REPLAY), REQUEST_ID=request["request_id"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.fullmatch(
        rf"replay of {request['request_id']}: all {request['steps']} steps match\n", done.stdout
    )


@pytest.mark.embedded
def test_json_and_debug_print_the_run_result_and_one_line_per_stage(shell: Shell) -> None:
    done = shell(readme_command(RUN_JSON_DEBUG))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)  # stdout holds the RunResult and nothing else
    assert result["status"] == 200 and result["output"] == result["output"].strip() != ""
    assert {"request_id", "session_id", "tool_calls", "usage", "steps"} <= result.keys()
    stages = {
        line.split(":")[0].removeprefix("[INFO] ")
        for line in done.stderr.splitlines()
        if line.startswith("[INFO] ") and not line.startswith("[INFO] storage:")
    }
    # Each stage, and each tool call with its arguments, as the README says.
    assert {"InputParser", "ThoughtGenerator", "OutputRenderer"} <= stages <= {*STAGES, "ToolCall"}


@pytest.mark.embedded
def test_dry_run_lists_the_planned_calls_and_runs_none(shell: Shell) -> None:
    done = shell(readme_command(DRY_RUN))
    assert done.returncode == 0, done.stderr
    headline, *plan = done.stdout.splitlines()
    assert re.fullmatch(r"Dry run: the model planned 1 valid call; nothing was run\.", headline)
    assert plan and re.fullmatch(r'  ✓ calculator\(\{"expression": ".*"\}\)', plan[0])
    assert "→" not in done.stdout + done.stderr  # no result: nothing ran


@pytest.mark.embedded
def test_chat_streams_answers_and_takes_help_and_exit(shell: Shell) -> None:
    done = shell(readme_command(CHAT), stdin="/help\nHello!\n/exit\n")
    assert done.returncode == 0, done.stderr
    banner, *rest = done.stdout.splitlines()
    assert banner.startswith("Hermes Agent — session ") and "/help" in banner
    assert any(line.strip().startswith("/exit") for line in rest)
    answer = done.stdout.split("agent> ", 1)[1]
    assert answer.split("you> ")[0].strip()  # the model's streamed answer to "Hello!"


# -- no model, or a scripted one --------------------------------------------------------------


def test_tools_lists_the_tools_and_their_schemas(shell: Shell) -> None:
    done = shell(readme_command(TOOLS))
    assert done.returncode == 0, done.stderr
    for name in ("calculator", "current_datetime", "convert_units"):
        assert name in done.stdout
    assert '"expression"' in done.stdout and '"type": "string"' in done.stdout


MY_TOOLS = '''
from hermes_agent import tool


@tool
def get_weather(city: str) -> dict:
    """Get the current weather for a city."""
    return {"city": city, "temperature": 23}
'''


def test_run_with_your_config_and_tools(shell: Shell, server: ScriptedServer) -> None:
    endpoint = server  # the module's scripted server (openai_server's fixtures), cleared
    # The README's own config.yaml, pointed at a scripted OpenAI-compatible server.
    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    config = next(block for block in blocks if "provider: openai" in block)
    (shell.cwd / "config.yaml").write_text(
        config.replace("http://localhost:8080/v1", endpoint.base_url), encoding="utf-8"
    )
    (shell.cwd / "my_tools.py").write_text(MY_TOOLS, encoding="utf-8")
    endpoint.push(
        text('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'),
        text("It is 23 degrees in Oslo."),
    )
    done = shell(readme_command(RUN_CONFIG), env={"OPENAI_API_KEY": "sk-readme"})
    assert done.returncode == 0, done.stderr
    assert done.stdout == "It is 23 degrees in Oslo.\n"
    assert done.stderr == '✓ get_weather({"city": "Oslo"}) → {"city": "Oslo", "temperature": 23}\n'
    assert '"name": "get_weather"' in endpoint.requests[0]["messages"][0]["content"]


def test_eval_runs_the_example_suite_and_reports_under_hermes(shell: Shell) -> None:
    shutil.copytree(ROOT / "examples", shell.cwd / "examples")
    done = shell(readme_command(EVAL_SUITE))
    # "one case built to fail": the suite fails, and says which case and why.
    assert done.returncode == 1, done.stdout + done.stderr
    assert "✗ tokyo-built-to-fail: " in done.stdout
    report_path = Path(".hermes") / "eval-report.json"
    assert f"report: {report_path}" in done.stderr
    report = json.loads((shell.cwd / report_path).read_text(encoding="utf-8"))
    assert (report["summary"]["total"], report["summary"]["correct"]) == (5, 4)
    assert sorted(p.name for p in shell.cwd.iterdir()) == [".hermes", "examples"]


def _bfcl_available() -> bool:
    from hermes_agent.evals import bfcl_compat

    available = getattr(bfcl_compat, "available", None)
    if callable(available):
        return bool(available())
    return importlib.util.find_spec("bfcl_eval") is not None


@pytest.mark.skipif(not _bfcl_available(), reason="needs BFCL's data and checkers (bfcl-eval)")
def test_eval_bfcl_with_the_oracle_scores_100_percent(shell: Shell) -> None:
    done = shell(readme_command(EVAL_BFCL))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "100.0%" in done.stdout
    report = json.loads((shell.cwd / ".hermes" / "bfcl-report.json").read_text(encoding="utf-8"))
    assert report["summary"]["total"] == 20 and report["summary"]["accuracy"] == 1.0


def test_the_library_example_points_at_a_port_serve_did_not_take() -> None:
    """The README starts ``hermes-agent serve`` (on its default port) one section before the
    library example's config: a reader who follows both must not point the config at the
    service, which answers that path with a 404 (or serves its own tools, not theirs)."""
    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    config = next(block for block in blocks if "provider: openai" in block)
    base_url = re.search(r"base_url:\s*(\S+)", config)
    assert base_url is not None
    served = ServiceSettings().port
    assert urlsplit(CURL.split()[-1]).port == served  # the README's curl talks to serve
    assert urlsplit(base_url.group(1)).port not in (served, None), base_url.group(1)
