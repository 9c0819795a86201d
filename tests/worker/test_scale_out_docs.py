"""Every example on docs/scale-out.md runs, in order, in one temporary folder, against a real
worker (the embedded model), Redis and a throwaway PostgreSQL database.

How a block is marked: an HTML comment on the line before its fence.

- ``<!-- file: NAME -->``: written to ``NAME`` before anything runs (the page's database and
  queue name are swapped for the test's own);
- ``<!-- run: python -->``: executed, in order, in one namespace; its ``assert``s are what the
  page claims;
- ``<!-- run: bash -->``: a command that must exit 0;
- ``<!-- run: bash worker -->``: a worker, started with ``bash`` and waited for until it is
  ready; stopped with SIGTERM once the page has run.

Unmarked blocks: the ``text`` diagram and the ``pip install`` line (checked against the extras).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import tomllib
import uuid
from pathlib import Path

import pytest

from doc_pages import marked_blocks
from worker_harness import REDIS, broker_up, drop_queue

PAGE = Path(__file__).resolve().parents[2] / "docs" / "scale-out.md"
PAGE_DB = "postgresql+psycopg://postgres@127.0.0.1:5432/hermes"
PAGE_QUEUE = "queue_name: hermes-runs"


def test_every_block_is_marked() -> None:
    unmarked = [(lang, body) for mark, lang, body in marked_blocks(PAGE) if not mark]
    assert [lang for lang, _ in unmarked] == ["text", "text"]
    assert unmarked[1][1] == (
        'pip install -e ".[worker,local]"\ncreatedb -h 127.0.0.1 -U postgres hermes\n'
    )
    assert PAGE_DB.endswith("@127.0.0.1:5432/hermes")  # the database createdb makes
    project = tomllib.loads((PAGE.parents[1] / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    assert any(r.startswith("celery[redis]>=") for r in extras["worker"])
    assert "local" in extras


@pytest.mark.timeout(600)
def test_the_page_runs(tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("llama_cpp")
    if not broker_up(REDIS):
        pytest.skip("no Redis")
    db = pg_url
    queue = f"hermes-docs-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    for mark, _, body in marked_blocks(PAGE):
        if mark.startswith("file:"):
            text = body.replace(PAGE_DB, db).replace(PAGE_QUEUE, f"queue_name: {queue}")
            (tmp_path / mark.removeprefix("file:").strip()).write_text(text, encoding="utf-8")
    namespace: dict[str, object] = {"__name__": "docs_scale_out"}
    workers: list[subprocess.Popen[bytes]] = []
    try:
        for number, (mark, _, body) in enumerate(marked_blocks(PAGE), start=1):
            if mark == "run: python":
                exec(compile(body, f"scale-out.md (block {number})", "exec"), namespace)
            elif mark == "run: bash worker":
                workers.append(start_worker(body, tmp_path))
            elif mark == "run: bash":
                done = subprocess.run(
                    ["bash", "-c", body], cwd=tmp_path, capture_output=True, timeout=120
                )
                assert done.returncode == 0, done.stderr.decode()
                assert done.stdout.strip(), f"block {number} printed nothing"
        assert workers, "the page starts a worker"
    finally:
        codes = []
        for worker in workers:
            os.killpg(worker.pid, signal.SIGTERM)
            try:
                codes.append(worker.wait(timeout=20))
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()
        _drop_queue(queue)
    assert codes == [0], "SIGTERM stops a worker cleanly"
    assert "Traceback" not in (tmp_path / "worker.log").read_text()


def start_worker(command: str, folder: Path) -> subprocess.Popen[bytes]:
    log = folder / "worker.log"
    process = subprocess.Popen(
        ["bash", "-c", f"exec {command.strip()}"],
        cwd=folder,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while b" ready." not in log.read_bytes():
        if process.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"the worker did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)  # the polling pace, bounded by the deadline above
    return process


def _drop_queue(name: str) -> None:
    drop_queue(REDIS, name)
