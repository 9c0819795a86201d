"""Every example on docs/service.md that is marked runnable runs against a real service (uvicorn
on loopback) and prints what the page says it prints; every example on docs/openai-facade.md and
docs/operating.md names the test that runs it.

How a block is marked: an HTML comment (invisible on the rendered page) on the line before its
fence.

- ``<!-- run: bash -->``: run by ``bash -eu -o pipefail``; ``$KEY`` holds an API key.
- ``<!-- run: python -->``: run by a fresh Python interpreter; ``key`` holds an API key.
- ``<!-- run: javascript -->``: run in Chromium on a page served from the service's origin, as
  the body of an async function (``await`` works); ``KEY`` holds an API key; its output is
  what it logs with ``console.log``. An error (thrown, or logged by the browser: a failed
  request), or a block still running after ``BLOCK_TIMEOUT_S``, fails the test.
- ``<!-- run: python server -->``: a program that starts the service and keeps serving. It runs
  in a folder holding ``config.yaml`` (a scripted model) and ``tools.py`` (one tool); the test
  waits until it answers ``GET /healthz`` and a run, then stops it.
- ``with NAME=path ...`` after the language (``<!-- run: bash with RUN=request_id -->``): the
  variable is set from the JSON the page's previous runnable block printed, at that dotted path
  (list items by number: ``pending_approvals.0.approval_id``); the previous block runs first.
- ``<!-- output -->`` before a fenced block right after a runnable one: what that block prints.
  ``...`` stands for any text (doctest's ELLIPSIS); spaces at line ends and blank lines at
  either end do not count. Without one the block must only succeed.
- ``<!-- tested: tests/test_file.py -->``: the block is run by that test file, which reads this
  page.

Every ``bash``, ``python`` and ``javascript`` block on the page carries ``run:`` or ``tested:``.

The service the examples talk to: the address ``127.0.0.1:8000`` (also ``localhost:8000``,
``ws://``, ``port=8000``) is replaced by the test server's; API keys belong to the user
``alice``; the model is scripted (``docs_script``): it answers "What is 17 * 23?" with the
demo ``calculator`` tool and "Delete old.txt" with a ``delete_file`` tool that needs approval.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.responses import HTMLResponse

from hermes_agent import Agent, ScriptedModel
from hermes_agent.demo_tools import demo_tools
from hermes_agent.runs.keys import MemoryKeyStore
from hermes_agent.server import ServiceSettings, create_app
from hermes_agent.tools.registry import Tool
from hermes_agent.types import Message
from server_harness import call, free_port, serve

PAGE = Path(__file__).resolve().parents[2] / "docs" / "service.md"
ROOT = PAGE.parents[1]
SERVICE_PAGES = (PAGE, ROOT / "docs" / "openai-facade.md", ROOT / "docs" / "operating.md")
"""The service's pages: the API (whose examples this file runs), the OpenAI-compatible facade
and operating the service (whose examples other tests run)."""
BLOCK_TIMEOUT_S = 30
CHROMIUM = "/usr/bin/chromium"
DOCS_PAGE = "/docs-examples"
"""A blank page of the test service's origin, where the JavaScript examples run."""

_MARKER = re.compile(r"^<!--\s*(run|tested|output)\b:?\s*(.*?)\s*-->\s*$")
_FENCE = re.compile(r"^```(\w*)\s*$")
_PORT = re.compile(r"\b(127\.0\.0\.1|localhost):8000\b|(?<=port=)8000\b")


@dataclass
class Block:
    """A fenced block of the page and what its marker says."""

    line: int
    language: str
    code: str
    marker: str | None = None
    """``run``, ``tested`` or ``output``."""
    argument: str = ""
    expected: str | None = None
    """The output block that follows a runnable one."""
    previous: Block | None = field(default=None, repr=False)
    """The page's runnable block before this one."""

    @property
    def runner(self) -> str:
        return self.argument.split(" with ", 1)[0].strip()

    @property
    def variables(self) -> dict[str, str]:
        _, _, names = self.argument.partition(" with ")
        return dict(item.split("=", 1) for item in names.split())

    @property
    def label(self) -> str:
        return f"line {self.line} ({self.runner})"


def page_blocks(text: str) -> list[Block]:
    """Every fenced block of the page, with its marker; output blocks attached to the
    runnable block before them."""
    lines = text.splitlines()
    blocks: list[Block] = []
    marker: tuple[str, str] | None = None
    index = 0
    while index < len(lines):
        line = lines[index]
        found = _MARKER.match(line)
        if found:
            marker = (found.group(1), found.group(2))
            index += 1
            continue
        fence = _FENCE.match(line)
        if fence and line.startswith("```"):
            end = index + 1
            while end < len(lines) and lines[end].rstrip() != "```":
                end += 1
            block = Block(index + 1, fence.group(1), "\n".join(lines[index + 1 : end]) + "\n")
            if marker is not None:
                block.marker, block.argument = marker
            blocks.append(block)
            marker = None
            index = end + 1
            continue
        if line.strip():
            marker = None  # a marker belongs to the fence right after it
        index += 1
    runnable: list[Block] = []
    last: Block | None = None
    for block in blocks:
        if block.marker == "output":
            assert last is not None, f"line {block.line}: an output block with no example before it"
            last.expected = block.code
            last = None
        elif block.marker == "run":
            block.previous = runnable[-1] if runnable else None
            runnable.append(block)
            last = block
        else:
            last = None
    return blocks


def runnable_blocks() -> list[Block]:
    return [b for b in page_blocks(PAGE.read_text(encoding="utf-8")) if b.marker == "run"]


def matches(expected: str, actual: str) -> bool:
    """Whether ``actual`` is ``expected`` where each ``...`` may stand for any text."""

    def clean(text: str) -> str:
        return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())

    pattern = ".*?".join(re.escape(part) for part in clean(expected).split("..."))
    return re.fullmatch(pattern, clean(actual), re.S) is not None


def at_path(data: Any, path: str) -> str:
    for part in path.split("."):
        data = data[int(part)] if isinstance(data, list) else data[part]
    return str(data)


# -- the service the examples talk to ------------------------------------------------------


def docs_script(messages: Sequence[Message], _tools: Sequence[dict[str, Any]]) -> str:
    """The model the examples talk to: "What is A op B?" → the calculator, then "A op B =
    <result>"; "Delete X" → delete_file (which needs approval), then "Deleted X." or why not;
    anything else → "Hello!"."""
    last = max(i for i, m in enumerate(messages) if m.role == "user")
    user = str(messages[last].content).strip()
    results = [r for m in messages[last:] if m.role == "tool" for r in m.tool_results]
    arithmetic = re.fullmatch(r"What is (.+)\?", user)
    delete = re.fullmatch(r"Delete (\S+)", user)
    if arithmetic and not results:
        return call("calculator", expression=arithmetic.group(1))
    if arithmetic:
        return f"{arithmetic.group(1)} = {results[0].content['data']}"
    if delete and not results:
        return call("delete_file", path=delete.group(1))
    if delete and results[0].content.get("error"):
        return f"I did not delete {delete.group(1)}: {results[0].content['error']}"
    if delete:
        return f"Deleted {delete.group(1)}."
    return "Hello!"


def delete_file(path: str) -> str:
    """Delete a file (this one only says it did)."""
    return f"deleted {path}"


def docs_agent(storage: str) -> Agent:
    agent = Agent(model=ScriptedModel(docs_script, chunk_size=6), storage=storage)
    for tool in demo_tools():
        agent.add_tool(tool)
    agent.add_tool(Tool.from_function(delete_file, requires_approval=True))
    return agent


@dataclass
class Service:
    url: str
    key: str


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    keys = MemoryKeyStore()
    key = keys.create("alice")
    folder = tmp_path_factory.mktemp("docs-service")
    app = create_app(
        agent=docs_agent(f"sqlite:///{folder / 'state.db'}"),
        settings=ServiceSettings(shutdown_grace_s=1),  # runs left waiting for approval
        keys=keys,
    )

    @app.get(DOCS_PAGE, include_in_schema=False)
    def blank_page() -> HTMLResponse:
        return HTMLResponse(
            '<!doctype html><meta charset="utf-8"><link rel="icon" href="data:,">'
            "<title>examples</title>"
        )

    with serve(app) as url:
        yield Service(url, key)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    playwright_api = pytest.importorskip("playwright.sync_api")
    assert Path(CHROMIUM).exists(), f"the JavaScript examples run in Chromium at {CHROMIUM}"
    with playwright_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield launched
        finally:
            launched.close()


# -- running a block -------------------------------------------------------------------------


def localize(code: str, url: str) -> str:
    """The block with the documented address replaced by the test server's."""
    host_port = url.removeprefix("http://")
    port = host_port.rsplit(":", 1)[1]
    return _PORT.sub(lambda m: port if m.group(1) is None else host_port, code)


def run_block(block: Block, service: Service, browser: Any, folder: Path) -> str:
    """Run one block; returns what it printed. Fails the test when it fails."""
    code = localize(block.code, service.url)
    environment = {**os.environ, "KEY": service.key}
    if block.variables:
        assert block.previous is not None, f"{block.label}: 'with' needs a block before it"
        printed = json.loads(run_block(block.previous, service, browser, folder))
        for name, path in block.variables.items():
            environment[name] = at_path(printed, path)
    if block.runner == "bash":
        return _subprocess(["bash", "-euo", "pipefail", "-c", code], environment, folder, block)
    if block.runner == "python":
        prelude = "import os\nkey = os.environ['KEY']\n"
        return _subprocess([sys.executable, "-c", prelude + code], environment, folder, block)
    if block.runner == "javascript":
        return _in_browser(code, service, browser, block)
    if block.runner == "python server":  # on a port of its own
        return _server_program(block.code, environment, folder, block)
    raise AssertionError(f"{block.label}: unknown runner {block.runner!r}")


def _subprocess(argv: list[str], environment: dict[str, str], folder: Path, block: Block) -> str:
    done = subprocess.run(
        argv,
        env=environment,
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"{block.label} failed ({done.returncode}):\n{done.stderr}"
    return done.stdout


_RUN_IN_PAGE = """async ([KEY, code, seconds]) => {
    const AsyncFunction = (async () => {}).constructor;
    const example = new AsyncFunction("KEY", code);
    const late = new Promise((_, reject) => setTimeout(
        () => reject(new Error(`still running after ${seconds} s`)), seconds * 1000));
    try {
        await Promise.race([example(KEY), late]);
        return null;
    } catch (error) {
        return String((error && error.stack) || error);
    }
}"""
"""Runs a JavaScript example as the body of an async function; ``null``, or what it threw."""


def _in_browser(code: str, service: Service, browser: Any, block: Block) -> str:
    page = browser.new_page()
    logged: list[str] = []
    errors: list[str] = []
    page.on(
        "console",
        lambda message: (logged if message.type == "log" else errors).append(message.text),
    )
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        page.goto(service.url + DOCS_PAGE)
        outcome = page.evaluate(_RUN_IN_PAGE, [service.key, code, BLOCK_TIMEOUT_S])
    finally:
        page.close()
    assert outcome is None, f"{block.label} threw: {outcome}"
    assert not errors, f"{block.label}: errors on the page: {errors}"
    return "\n".join(logged) + "\n"


SERVER_CONFIG = """\
model:
  provider: scripted
  responses: ["Hello from the scripted model!"]
"""
SERVER_TOOLS = '''\
from hermes_agent import tool


@tool
def shout(text: str) -> str:
    """Say it louder."""
    return text.upper()
'''


def _server_program(code: str, environment: dict[str, str], folder: Path, block: Block) -> str:
    (folder / "config.yaml").write_text(SERVER_CONFIG)
    (folder / "tools.py").write_text(SERVER_TOOLS)
    port = free_port()
    code = _PORT.sub(lambda m: str(port) if m.group(1) is None else f"127.0.0.1:{port}", code)
    process = subprocess.Popen(
        [sys.executable, "-c", code],
        env=environment,
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + BLOCK_TIMEOUT_S
        while True:
            assert process.poll() is None, f"{block.label} exited: {process.communicate()[0]}"
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"{block.label} did not start serving"
            time.sleep(0.1)  # the polling pace, bounded by the deadline above
        reply = httpx.post(f"{url}/v1/runs", json={"message": "hi"}, timeout=30)
        assert reply.status_code == 200, reply.text
        assert reply.json()["output"] == "Hello from the scripted model!"
        return ""
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# -- the tests -------------------------------------------------------------------------------


@pytest.mark.parametrize("page", SERVICE_PAGES, ids=lambda p: p.name)
def test_every_code_block_is_run_by_a_test(page: Path) -> None:
    blocks = page_blocks(page.read_text(encoding="utf-8"))
    unmarked = [
        f"line {b.line} ({b.language})"
        for b in blocks
        if b.language in ("bash", "sh", "python", "javascript", "js") and b.marker is None
    ]
    assert not unmarked, f"examples that no test runs (mark them, see {__name__}): {unmarked}"
    for block in blocks:
        if block.marker == "tested":
            test_file = ROOT / block.argument
            assert test_file.is_file(), f"line {block.line}: no test file {block.argument}"
            assert page.name in test_file.read_text(encoding="utf-8"), block.argument
        if block.marker == "run":
            assert page == PAGE, f"{page.name} line {block.line}: run: blocks live on service.md"
            assert block.runner in ("bash", "python", "javascript", "python server"), block
    if page == PAGE:
        languages = {b.runner for b in blocks if b.marker == "run"}
        assert {"bash", "python", "javascript"} <= languages


@pytest.mark.parametrize("block", runnable_blocks(), ids=lambda b: b.label)
def test_example_runs_and_prints_what_the_page_shows(
    block: Block, service: Service, browser: Any, tmp_path: Path
) -> None:
    printed = run_block(block, service, browser, tmp_path)
    if block.expected is not None:
        assert matches(block.expected, printed), (
            f"{block.label} printed:\n{printed}\nthe page shows:\n{block.expected}"
        )


def test_the_output_check_catches_a_difference() -> None:
    assert matches("a ... c\n", "a b c")
    assert matches('{"x": ..., "y": 2}', '{"x": [1, 2], "y": 2}  \n\n')
    assert not matches("a ... c", "a b d")
    assert not matches("17 * 23 = 391", "17 * 23 = 392")
