"""The OpenAI-compatible model on the SDK's aiohttp client (``transport: aiohttp``): whoever owns
an event loop closes the connections its runs opened there before the loop ends — the sync
facade's ``Agent.close``, the service at shutdown, a worker as it stops — so no process logs
aiohttp's "Unclosed client session" (or connector). (tests/models/test_openai_model.py runs the
model's own tests on both clients.)"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from hermes_agent import Agent, build_agent
from hermes_agent.config import HermesConfig, OpenAIConfig, load_config, parse_config
from hermes_agent.errors import ConfigError
from hermes_agent.loading import on_owned_loops
from hermes_agent.models.openai import OpenAICompatible
from hermes_agent.models.registry import build_model
from hermes_agent.server import ServiceSettings, create_app
from openai_server import (  # noqa: F401  (the fixtures)
    ScriptedServer,
    running_fixture,
    server_fixture,
    text,
)
from server_harness import serve
from step_model import running_step_model
from worker_harness import REDIS, cluster, free_port

UNCLOSED = "Unclosed"  # aiohttp's "Unclosed client session" and "Unclosed connector"

FACADE = """
import gc, sys
from hermes_agent import Agent
from hermes_agent.models.openai import OpenAICompatible

model = OpenAICompatible("m", base_url=sys.argv[1], transport="aiohttp", max_retries=0)
agent = Agent(model=model)
print(agent.run("one").output, agent.run("two").output)
if sys.argv[2] == "close":
    agent.close()
del agent, model
gc.collect()
print("collected", flush=True)
"""


def test_the_config_picks_the_transport_and_a_wrong_one_is_named() -> None:
    model = build_model(OpenAIConfig(model_name="m", transport="aiohttp"))
    assert isinstance(model, OpenAICompatible) and model.transport == "aiohttp"
    # ``auto`` (the default) is httpx for an agent built anywhere but the service or a worker.
    assert build_model(OpenAIConfig(model_name="m")).transport == "httpx"  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="transport must be one of"):
        OpenAICompatible("m", transport="curl")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="transport"):
        parse_config({"model": {"provider": "openai", "model_name": "m", "transport": "curl"}})


def test_auto_is_aiohttp_on_owned_loops_and_an_explicit_choice_stays() -> None:
    def section(**model: str) -> HermesConfig:
        return parse_config({"model": {"provider": "openai", "model_name": "m", **model}})

    automatic = section()
    owned = on_owned_loops(automatic)
    assert owned.model.transport == "aiohttp"  # type: ignore[attr-defined]
    assert automatic.model.transport == "auto"  # type: ignore[attr-defined]  (a copy)
    assert on_owned_loops(section(transport="httpx")).model.transport == "httpx"  # type: ignore[attr-defined]
    with_answer = parse_config(
        {
            "model": {"provider": "openai", "model_name": "m", "transport": "httpx"},
            "answer_model": {"provider": "openai", "model_name": "a"},
        }
    )
    both = on_owned_loops(with_answer)
    assert both.model.transport == "httpx"  # type: ignore[attr-defined]
    assert both.answer_model.transport == "aiohttp"  # type: ignore[union-attr]


def test_the_service_built_from_a_config_uses_aiohttp_and_closes_it(
    server: ScriptedServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import gc

    gc.collect()  # what earlier tests left to the collector is not this test's to judge
    caplog.clear()
    server.push(text("served"))
    config = parse_config(
        {
            "model": {"provider": "openai", "model_name": "m", "base_url": server.base_url},
            "service": {"auth": "none"},
        }
    )
    app = create_app(config)
    model = app.state.manager.agent.model
    assert isinstance(model, OpenAICompatible) and model.transport == "aiohttp"
    with serve(app) as url:
        reply = httpx.post(f"{url}/v1/runs", json={"message": "hi"}, timeout=30)
        assert reply.status_code == 200 and reply.json()["output"] == "served"
    assert not model._clients
    caplog.set_level("ERROR", logger="asyncio")
    del app, model
    gc.collect()
    assert UNCLOSED not in caplog.text


@pytest.mark.parametrize("closing", ["close", "no-close"])
def test_the_sync_facade_closes_its_sessions_in_agent_close(
    server: ScriptedServer, closing: str
) -> None:
    """``Agent.close`` closes what the sync facade's runs opened on the thread's loop; left
    open, aiohttp says so when the session is collected (so this test can tell)."""
    server.push(text("first"), text("second"))
    done = subprocess.run(
        [sys.executable, "-c", FACADE, server.base_url, closing],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["first second", "collected"]
    assert (UNCLOSED in done.stderr) is (closing == "no-close"), done.stderr


def test_the_service_closes_its_models_sessions_at_shutdown(
    server: ScriptedServer, caplog: pytest.LogCaptureFixture
) -> None:
    import gc

    gc.collect()  # what earlier tests left to the collector is not this test's to judge
    caplog.clear()
    server.push(text("served"))
    model = OpenAICompatible("m", base_url=server.base_url, transport="aiohttp", max_retries=0)
    agent = Agent(model=model)
    with serve(create_app(agent=agent, settings=ServiceSettings(auth="none"))) as url:
        reply = httpx.post(f"{url}/v1/runs", json={"message": "hi"}, timeout=30)
        assert reply.status_code == 200 and reply.json()["output"] == "served"
        assert model._clients  # a client was opened on the service's loop
    assert not model._clients  # ...and closed at shutdown
    caplog.set_level("ERROR", logger="asyncio")
    del agent, model
    gc.collect()
    assert UNCLOSED not in caplog.text


def test_the_worker_process_and_hermes_agent_serve_resolve_auto_to_aiohttp(
    tmp_path: Path,
) -> None:
    from hermes_agent.cli._common import cli_agent
    from hermes_agent.worker.app import WorkerProcess

    config = tmp_path / "config.yaml"
    config.write_text(
        f"""
model: {{provider: openai, model_name: m, base_url: "http://127.0.0.1:9/v1"}}
storage: {{url: "sqlite:///{tmp_path / "state.db"}"}}
queue: {{broker: "{REDIS}", queue_name: hermes-test-transport}}
""",
        encoding="utf-8",
    )
    process = WorkerProcess(load_config(config))
    try:
        assert process.agent.model.transport == "aiohttp"  # type: ignore[attr-defined]
    finally:
        process.close()
    served = cli_agent(config, None, True, owned_loop=True)
    plain = cli_agent(config, None, True)
    try:
        assert served.model.transport == "aiohttp"  # type: ignore[attr-defined]
        assert plain.model.transport == "httpx"  # type: ignore[attr-defined]  (hermes-agent run)
    finally:
        served.close()
        plain.close()


@pytest.mark.timeout(180)
def test_a_worker_on_auto_runs_on_aiohttp_and_stops_with_its_sessions_closed(
    tmp_path: Path, pg_url: str
) -> None:
    from hermes_agent.worker import submit

    with (
        running_step_model(free_port(), latency=0.01) as model_url,
        cluster(tmp_path, pg_url, REDIS, model_url, transport="auto") as c,
    ):
        worker = c.start_worker(concurrency=2)
        c.wait_ready()
        submitter = build_agent(tmp_path / "config.yaml")
        try:
            handles = [submit(submitter, f"job a{i} steps=2", session_id=f"s{i}") for i in range(4)]
            outputs = [handle.result(timeout=60).output for handle in handles]
        finally:
            submitter.close()
        assert [o.startswith(f"done a{i} after 2 steps") for i, o in enumerate(outputs)] == [
            True
        ] * 4
        c.stop()  # SIGTERM: a warm shutdown
        assert worker.wait(timeout=30) is not None
        time.sleep(0.1)  # the worker's pool children, ending with it, write their last lines
        log = (tmp_path / "worker0.log").read_text(errors="replace")
        assert UNCLOSED not in log, textwrap.shorten(log, 2000)
