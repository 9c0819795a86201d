"""Every example on docs/mcp.md runs, in order, in one temporary folder.

How a block is marked: an HTML comment on the line before its fence.

- ``<!-- file: NAME -->``: the block is written to ``NAME`` in the folder (a server, a config,
  a tools file, an MCP client's configuration) before anything runs;
- ``<!-- run: python -->``: executed, in order, in one namespace; its ``assert``s are what the
  page claims;
- ``<!-- run: bash server -->``: a command that keeps serving: started with ``bash``, waited
  for until its port (8001 on the page, a free port here, in it and in the blocks after it)
  accepts connections, stopped with SIGTERM once the page has run — and it must exit 0.

The one block without a mark is the ``pip install`` line (``text``), checked against the
package's extras instead.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from doc_pages import marked_blocks
from server_harness import free_port

pytest.importorskip("mcp")

PAGE = Path(__file__).resolve().parents[2] / "docs" / "mcp.md"
PORT_ON_THE_PAGE = "8001"


def test_every_block_is_marked() -> None:
    unmarked = [(lang, body) for mark, lang, body in marked_blocks(PAGE) if not mark]
    assert unmarked == [("text", 'pip install -e ".[mcp]"\n')]
    marks = {mark.split(":")[0] for mark, _, _ in marked_blocks(PAGE) if mark}
    assert marks == {"file", "run"}


def test_the_install_line_names_the_extra() -> None:
    project = tomllib.loads((PAGE.parents[1] / "pyproject.toml").read_text())
    extra = project["project"]["optional-dependencies"]["mcp"]
    assert any(requirement.startswith("mcp>=") for requirement in extra)


def test_the_page_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # ``python`` and ``hermes-agent`` on the page are this interpreter's
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    port = str(free_port())
    for mark, _, body in marked_blocks(PAGE):
        if mark.startswith("file:"):
            (tmp_path / mark.removeprefix("file:").strip()).write_text(body, encoding="utf-8")
    namespace: dict[str, object] = {"__name__": "docs_mcp"}
    servers: list[subprocess.Popen[bytes]] = []
    try:
        for number, (mark, _, body) in enumerate(marked_blocks(PAGE), start=1):
            code = body.replace(PORT_ON_THE_PAGE, port)
            if mark == "run: python":
                exec(compile(code, f"mcp.md (block {number})", "exec"), namespace)
            elif mark == "run: bash server":
                servers.append(start_server(code, tmp_path, int(port)))
        assert servers, "the page serves over HTTP"
    finally:
        for server in servers:
            server.send_signal(signal.SIGTERM)
    assert [server.wait(30) for server in servers] == [0] * len(servers)


def start_server(command: str, folder: Path, port: int) -> subprocess.Popen[bytes]:
    # ``exec``: the signal goes to the server itself, not to a shell waiting for it
    process = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=folder)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return process
        except OSError:
            assert process.poll() is None, "the server on the page exited"
            assert time.monotonic() < deadline, "the server on the page did not start"
            time.sleep(0.1)  # the polling pace, bounded by the deadline above


def test_the_service_mcp_section_is_a_valid_service_setting() -> None:
    """The page's ``service.mcp`` block is what ``ServiceSettings`` reads (its behaviour is
    tests/runs/test_run_matrix.py's MCP row, in both engines)."""

    import yaml

    from hermes_agent.server import ServiceSettings

    text = PAGE.read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "mcp:" in b)
    settings = ServiceSettings.model_validate(yaml.safe_load(block)["service"])
    assert settings.mcp is not None
    assert (settings.mcp.path, settings.mcp.ask) == ("/mcp", True)
    assert settings.mcp.approve == ["delete_file"] and settings.mcp.toolsets == ["default"]
