"""``hermes-agent serve`` and ``hermes-agent keys`` as a person runs them: the README's pair (serve
in one terminal, curl in another) against the embedded model, the service page's commands
against a scripted OpenAI-compatible endpoint (a key made by ``keys create`` works against
``serve`` with the same config, and stops working at ``keys revoke``), and the errors.

The commands are read from README.md and docs/operating.md, not copied here. The servers listen on
a free port: ``--port`` is added to ``serve`` and the URL's port changed to match; nothing else
in a command is changed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from hermes_agent.cli import app
from hermes_agent.cli.serve import LOCAL_KEY_FILE, local_key
from hermes_agent.config import load_config
from hermes_agent.demo_tools import calculator
from hermes_agent.runs.keys import MemoryKeyStore
from hermes_agent.runs.principal import LOCAL_USER
from hermes_agent.runs.settings import service_settings
from openai_server import running_server, text
from server_harness import free_port
from test_readme_commands import CURL, README, SERVE, hermes_agent_command, readme_command

ROOT = Path(__file__).resolve().parents[2]
OPERATING_PAGE = ROOT / "docs" / "operating.md"
README_PORT = "8000"


def _section(page: Path, title: str) -> str:
    text = page.read_text(encoding="utf-8")
    return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def _blocks(markdown: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", markdown, re.S)


def _environment(home: Path) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if k != "HERMES_DEBUG"}
    environment["HOME"] = str(home)
    return environment


@contextmanager
def serving(argv: list[str], cwd: Path, home: Path, port: int) -> Iterator[list[str]]:
    """Start ``hermes-agent <argv> --port <port>`` and wait for ``/healthz``; on leaving, send
    SIGTERM and check it exits 0. Yields the lines it wrote to stderr so far (after it ends)."""
    assert argv[0] == "hermes-agent"
    log = cwd.parent / f"serve-{port}.log"
    with log.open("w", encoding="utf-8") as stderr:
        process = subprocess.Popen(
            [*hermes_agent_command(), *argv[1:], "--port", str(port)],
            cwd=cwd,
            env=_environment(home),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                raise AssertionError(f"serve exited {process.returncode}: {log.read_text()}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"serve did not answer /healthz: {log.read_text()}")
            time.sleep(0.2)  # the polling pace, bounded by the deadline above
        yield lines
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
        lines.extend(log.read_text(encoding="utf-8").splitlines())
    assert code == 0, "\n".join(lines)


def _folders(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "work").mkdir()
    (tmp_path / "home").mkdir()
    return tmp_path / "work", tmp_path / "home"


def _readme_curl_line() -> str:
    """The README's curl command as typed (its ``$(...)`` is for the shell to expand)."""
    for block in _blocks(README.read_text(encoding="utf-8"), "bash"):
        for line in block.splitlines():
            if line.startswith(CURL):
                return line
    raise AssertionError("README.md has no curl command")


# -- the README's pair, on the embedded model --------------------------------------------------


@pytest.mark.embedded
def test_the_readme_serve_and_curl_pair_answers_with_the_calculator(tmp_path: Path) -> None:
    cwd, home = _folders(tmp_path)
    serve_argv = readme_command(SERVE)
    assert serve_argv == ["hermes-agent", "serve"]
    curl = _readme_curl_line()
    assert shlex.split(curl)[: len(shlex.split(CURL))] == readme_command(CURL)[:3]
    port = free_port()
    with serving(serve_argv, cwd, home, port):
        key_file = cwd / ".hermes" / "api-key"
        assert key_file.stat().st_mode & 0o777 == 0o600  # readable only by its owner
        line = curl.replace(f"127.0.0.1:{README_PORT}", f"127.0.0.1:{port}")
        done = subprocess.run(
            ["bash", "-c", line],
            cwd=cwd,
            env=_environment(home),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        # "tool_calls holds the calculator call the model made and what it returned"
        [made] = result["tool_calls"]
        assert made["name"] == "calculator" and made["status_code"] == 200
        assert made["result"] == calculator(made["arguments"]["expression"])
        # "output the model's answer"
        assert result["status"] == 200 and result["output"].strip()
        # A second start reuses the key in the file.
        key = key_file.read_text(encoding="utf-8")
    with serving(serve_argv, cwd, home, port) as lines:
        assert key_file.read_text(encoding="utf-8") == key
        reply = httpx.get(
            f"http://127.0.0.1:{port}/v1/sessions",
            headers={"Authorization": f"Bearer {key.strip()}"},
        )
        assert reply.status_code == 200
        assert [s["id"] for s in reply.json()["sessions"]] == [result["session_id"]]
    assert key.strip() not in "\n".join(lines)  # never printed
    assert any("Bearer $(cat .hermes/api-key)" in line for line in lines)


# -- the service page's commands, on a scripted endpoint --------------------------------------

TOOLS = '''
from hermes_agent import tool


@tool
def get_weather(city: str) -> dict:
    """Get the current weather for a city."""
    return {"city": city, "temperature": 23}
'''


def _run(argv: list[str], cwd: Path, home: Path, **placeholders: str) -> Any:
    assert argv[0] == "hermes-agent"
    args = [placeholders.get(arg, arg) for arg in argv[1:]]
    return subprocess.run(
        [*hermes_agent_command(), *args],
        cwd=cwd,
        env=_environment(home),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_keys_made_by_the_cli_work_against_serve_with_the_same_config(tmp_path: Path) -> None:
    cwd, home = _folders(tmp_path)
    section = _section(OPERATING_PAGE, "Running it")
    [config] = _blocks(section, "yaml")
    [commands] = _blocks(section, "bash")
    argvs = [shlex.split(line, comments=True) for line in commands.splitlines() if line.strip()]
    create_alice, create_ops, list_keys, serve_argv, revoke = argvs
    with running_server() as endpoint:
        (cwd / "config.yaml").write_text(
            config.replace("http://localhost:8080/v1", endpoint.base_url), encoding="utf-8"
        )
        (cwd / "tools.py").write_text(TOOLS, encoding="utf-8")
        made = _run(create_alice, cwd, home)
        assert made.returncode == 0, made.stderr
        alice = made.stdout.strip()  # "prints the key, once": alone on standard output
        assert re.fullmatch(r"hk_[0-9a-f]{16}\.[A-Za-z0-9_-]+", alice)
        assert "shown only now" in made.stderr
        made = _run(create_ops, cwd, home)
        assert made.returncode == 0, made.stderr
        listed = _run(list_keys, cwd, home)
        assert listed.returncode == 0, listed.stderr
        # "ids, users, names; no keys"
        alice_id = alice[3:19]
        assert alice_id in listed.stdout and "alice" in listed.stdout
        assert "ops" in listed.stdout and "admin" in listed.stdout and "on-call" in listed.stdout
        assert "hk_" not in listed.stdout and alice.split(".")[1] not in listed.stdout
        # The keys are in the config's storage, where serve reads them.
        assert (cwd / ".hermes" / "state.db").is_file()

        port = free_port()
        with serving(serve_argv, cwd, home, port):
            client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
            endpoint.push(
                text('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}'),
                text("It is 23 degrees in Oslo."),
            )
            reply = client.post(
                "/v1/runs",
                json={"message": "Weather in Oslo?"},
                headers={"Authorization": f"Bearer {alice}"},
            )
            assert reply.status_code == 200, reply.text
            assert reply.json()["output"] == "It is 23 degrees in Oslo."
            assert reply.json()["tool_calls"][0]["result"] == {"city": "Oslo", "temperature": 23}
            assert client.post("/v1/runs", json={"message": "hi"}).status_code == 401
            # "refused (401) from now on": revoke by the first characters of the id.
            revoked = _run(revoke, cwd, home, KEY_ID=alice_id[:6])
            assert revoked.returncode == 0, revoked.stderr
            assert f"revoked key {alice_id} (user alice)" in revoked.stdout
            reply = client.post(
                "/v1/runs", json={"message": "hi"}, headers={"Authorization": f"Bearer {alice}"}
            )
            assert reply.status_code == 401
        listed = _run([*list_keys, "--json"], cwd, home)
        rows = {row["user_id"]: row for row in json.loads(listed.stdout)}
        assert rows["alice"]["revoked"] is True and rows["ops"]["admin"] is True
        assert rows["ops"]["name"] == "on-call"


def test_the_operating_page_s_quota_example_is_a_valid_service_section(tmp_path: Path) -> None:
    [example] = _blocks(_section(OPERATING_PAGE, "Quotas"), "yaml")
    (tmp_path / "config.yaml").write_text(example, encoding="utf-8")
    quotas = service_settings(load_config(tmp_path / "config.yaml")).quotas
    assert quotas.limits_for("bob").runs_per_day == 200
    assert quotas.limits_for("alice").runs_per_day == 1000
    assert quotas.limits_for("alice").tokens_per_day == 500000  # the default, kept
    assert quotas.limits_for("ops").runs_per_day is None  # null lifts the limit


# -- errors, in process -------------------------------------------------------------------------

runner = CliRunner()


def test_a_bad_service_section_names_the_file_and_the_key(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("service:\n  prot: 9000\n", encoding="utf-8")
    done = runner.invoke(app, ["serve", "--config", str(config)])
    assert done.exit_code == 2
    assert f"{config}: service.prot: unknown key; did you mean 'port'?" in done.output
    config.write_text("model: {provider: scripted}\nservice:\n  auth: none\n", encoding="utf-8")
    done = runner.invoke(app, ["serve", "--config", str(config), "--host", "0.0.0.0"])
    assert done.exit_code == 2
    assert "auth: none would let anyone who reaches 0.0.0.0 run the agent" in done.output
    config.write_text("storage: {url: 'memory://'}\n", encoding="utf-8")
    done = runner.invoke(app, ["keys", "list", "--config", str(config)])
    assert done.exit_code == 2 and "set service.keys_url" in done.output
    done = runner.invoke(app, ["keys", "create", "--user", "not a user id"])
    assert done.exit_code == 2 and "user id 'not a user id' is invalid" in done.output
    done = runner.invoke(app, ["keys", "revoke", "0123"])
    assert done.exit_code == 2 and "no key '0123'" in done.output


def test_without_the_server_extra_serve_and_keys_say_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "uvicorn" else real(name, *args),
    )
    for argv in (["serve"], ["keys", "list"]):
        done = runner.invoke(app, argv)
        assert done.exit_code == 2
        assert "needs the server extra (uvicorn is not installed)" in done.output
        assert 'pip install "hermes-agent-core[server]"' in done.output


def test_the_local_key_is_kept_reused_and_replaced_once_revoked() -> None:
    keys = MemoryKeyStore()
    path = local_key(keys)
    assert path == LOCAL_KEY_FILE and path.stat().st_mode & 0o777 == 0o600
    key = path.read_text(encoding="utf-8").strip()
    principal = keys.lookup(key)
    assert principal is not None and principal.user_id == LOCAL_USER and not principal.admin
    assert local_key(keys).read_text(encoding="utf-8").strip() == key
    [info] = keys.list()
    keys.revoke(info.key_id)
    replaced = local_key(keys).read_text(encoding="utf-8").strip()
    assert replaced != key and keys.lookup(replaced) is not None
