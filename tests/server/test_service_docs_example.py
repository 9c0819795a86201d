"""docs/service.md's curl examples run as written against the service the page says to start
for them: ``python examples/service_docs.py`` (its scripted model and the approval tool), with
the key made by ``hermes-agent keys create --user alice`` in the same folder — each a real
process, as a reader would run them. The approval flows are among them: the 202 with the
pending call, the approval and the events that follow, the cancel."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from server_harness import free_port
from test_service_docs import PAGE, Block, Service, matches, page_blocks, run_block

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "service_docs.py"


def curl_blocks() -> list[Block]:
    """The runnable blocks of the page's "curl" section, in order."""
    text = PAGE.read_text(encoding="utf-8")
    start = text.index("\n## curl\n")
    end = text.index("\n## ", start + 1)
    offset = text[:start].count("\n") + 1
    last = offset + text[start:end].count("\n")
    return [
        block
        for block in page_blocks(text)
        if block.marker == "run" and offset <= block.line <= last
    ]


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, Path]]:
    folder = tmp_path_factory.mktemp("service-docs-example")
    environment = {**os.environ, "HOME": str(folder)}
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--port", str(port)],
        cwd=folder,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "examples/service_docs.py did not start"
            time.sleep(0.2)  # the polling pace, bounded by the deadline above
        made = subprocess.run(
            [sys.executable, "-m", "hermes_agent", "keys", "create", "--user", "alice"],
            cwd=folder,
            env=environment,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        yield Service(url, made.stdout.strip()), folder
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_the_curl_examples_include_the_approval_flows() -> None:
    codes = "".join(block.code for block in curl_blocks())
    assert '"Delete old.txt"' in codes and "/v1/approvals/$APPROVAL" in codes
    assert "/cancel" in codes


@pytest.mark.parametrize("block", curl_blocks(), ids=lambda block: block.label)
def test_a_curl_example_prints_what_the_page_says(
    example: tuple[Service, Path], block: Block
) -> None:
    service, folder = example
    printed = run_block(block, service, None, folder)
    if block.expected is not None:
        assert matches(block.expected, printed), f"{block.label} printed:\n{printed}"
