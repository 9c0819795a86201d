"""The collector's settings of a serving process (``hermes_agent.heap.settle_heap``): what it
does, in a fresh interpreter (never in the test process, whose heap it would freeze); that
``hermes-agent serve`` really runs with them (a tool of the running service reports its
collector); and that ``hermes-agent worker`` settles its heap before Celery takes over."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest

from hermes_agent.heap import YOUNG_COLLECTION_EVERY
from openai_server import running_server, text
from server_harness import free_port
from test_cli_serve import _folders, serving

SETTLE = """
import gc, json, weakref
from hermes_agent.heap import settle_heap

class Node:
    pass

garbage = Node(); garbage.self = garbage  # a cycle only the collector frees
gone = weakref.ref(garbage)
del garbage
kept = Node()
before = gc.get_threshold()
settle_heap()
print(json.dumps({
    "garbage_freed": gone() is None,
    "frozen": gc.get_freeze_count(),
    "kept_frozen": not any(o is kept for o in gc.get_objects()),
    "before": before,
    "after": gc.get_threshold(),
}))
gc.set_threshold(0)
settle_heap()
print(json.dumps({"off": gc.get_threshold()[0]}))
"""


def _python(code: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_settle_heap_frees_startup_garbage_freezes_the_rest_and_spaces_young_collections() -> None:
    settled, switched_off = _python(SETTLE)
    assert settled["garbage_freed"] is True  # collected first, not frozen for ever
    assert settled["frozen"] > 1000  # the interpreter's and the imports' objects
    assert settled["kept_frozen"] is True  # a live object left the generations the GC walks
    young, middle, old = settled["after"]
    assert young == YOUNG_COLLECTION_EVERY > settled["before"][0]
    assert [middle, old] == settled["before"][1:]
    assert switched_off["off"] == 0  # a program that turned collection off keeps it off


TOOLS = """
import gc, json
from hermes_agent import tool

@tool
def collector() -> str:
    \"\"\"Report the serving process's garbage collector.\"\"\"
    return json.dumps({"frozen": gc.get_freeze_count(), "young": gc.get_threshold()[0]})
"""


def test_hermes_agent_serve_runs_with_its_heap_settled(tmp_path: Path) -> None:
    cwd, home = _folders(tmp_path)
    (cwd / "tools.py").write_text(TOOLS, encoding="utf-8")
    with running_server() as endpoint:
        config = (
            f"model: {{provider: openai, model_name: m, base_url: '{endpoint.base_url}', "
            "api_key: k, mode: native}\nstorage: {url: 'memory://'}\nservice: {auth: none}\n"
        )
        (cwd / "config.yaml").write_text(config, encoding="utf-8")
        port = free_port()
        argv = ["hermes-agent", "serve", "--config", "config.yaml", "--tools", "tools.py"]
        with serving(argv, cwd, home, port):
            endpoint.push(
                text('<tool_call>\n{"name": "collector", "arguments": {}}\n</tool_call>'),
                text("reported"),
            )
            reply = httpx.post(
                f"http://127.0.0.1:{port}/v1/runs", json={"message": "report"}, timeout=60
            )
            assert reply.status_code == 200, reply.text
            reported = json.loads(reply.json()["tool_calls"][0]["result"])
    assert reported["young"] == YOUNG_COLLECTION_EVERY
    assert reported["frozen"] > 10_000  # FastAPI, the SDK, the agent: built before serving


def test_hermes_agent_worker_settles_its_heap_before_celery_takes_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hermes_agent.config import HermesConfig, QueueConfig
    from hermes_agent.worker import app as worker_module

    happened: list[str] = []

    class CeleryApp:
        def worker_main(self, argv: list[str]) -> None:
            happened.append("celery")

    monkeypatch.setattr(worker_module, "worker_app", lambda *_: CeleryApp())
    monkeypatch.setattr(worker_module, "worker_process", lambda: happened.append("agent"))
    monkeypatch.setattr(worker_module, "settle_heap", lambda: happened.append("settled"))
    config = HermesConfig(queue=QueueConfig())
    worker_module.run_worker(config, pool="threads")
    assert happened == ["agent", "settled", "celery"]


def test_a_prefork_child_settles_its_heap_once_it_has_built_its_agent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from celery.signals import worker_process_init  # type: ignore[import-untyped]

    from hermes_agent.config import HermesConfig, QueueConfig
    from hermes_agent.worker import app as worker_module

    happened: list[str] = []
    monkeypatch.setattr(worker_module, "worker_process", lambda: happened.append("agent"))
    monkeypatch.setattr(worker_module, "settle_heap", lambda: happened.append("settled"))
    # The module's state worker_app sets, put back afterwards (as the signal's receivers).
    monkeypatch.setattr(worker_module, "_settings", None)
    monkeypatch.setattr(worker_module, "_deliveries", None)
    receivers = list(worker_process_init.receivers)
    try:
        worker_module.worker_app(HermesConfig(queue=QueueConfig()))
        worker_process_init.send(sender=None)  # what Celery sends in a child after the fork
    finally:
        if worker_module._deliveries is not None:
            worker_module._deliveries.close()
        worker_process_init.receivers[:] = receivers
        worker_process_init.sender_receivers_cache.clear()
    assert happened == ["agent", "settled"]
