"""The one composition root (``hermes_agent.backends``): keys, quotas and the engine are built
in one place for every door, and the keys are kept where the agent's storage is, so a key made
with ``hermes-agent keys create`` on the agent's database is one ``create_app(agent=...)``
accepts."""

from __future__ import annotations

import logging
from pathlib import Path

import grimp
import httpx
import pytest
from typer.testing import CliRunner

from hermes_agent import Agent, ScriptedModel
from hermes_agent.backends import build_backend, keys_url_for
from hermes_agent.cli import app as cli
from hermes_agent.runs.keys import MemoryKeyStore, SqlKeyStore
from hermes_agent.runs.quotas import MemoryQuotaStore, SqlQuotaStore
from hermes_agent.server import ServiceSettings, create_app
from server_harness import make_agent, serve
from storage_backends import sqlite_url as _sqlite

DOORS = (
    "hermes_agent.server.app",
    "hermes_agent.mcp.server",
    "hermes_agent.cli.mcp",
    "hermes_agent.cli.serve",
)
"""The doors that serve an agent's runs and used to compose an engine themselves."""


def test_a_key_the_cli_makes_in_the_agents_database_is_accepted_by_create_app(
    tmp_path: Path,
) -> None:
    url = _sqlite(tmp_path)
    made = CliRunner().invoke(cli, ["keys", "create", "--user", "alice", "--db", url])
    assert made.exit_code == 0, made.output
    key = made.stdout.strip().splitlines()[-1]
    assert key.startswith("hk_")

    agent = make_agent(url)
    try:
        app = create_app(agent=agent, settings=ServiceSettings(auth="keys"))
        assert isinstance(app.state.keys, SqlKeyStore)
        with serve(app) as base, httpx.Client(base_url=base, timeout=30) as client:
            answered = client.post(
                "/v1/runs", json={"message": "hello"}, headers={"Authorization": f"Bearer {key}"}
            )
            assert answered.status_code == 200, answered.text
            assert answered.json()["output"] == "Hello!"
            assert client.post("/v1/runs", json={"message": "hello"}).status_code == 401
            # The run belongs to the key's user, as the store says after it.
            listed = client.get("/v1/runs", headers={"Authorization": f"Bearer {key}"})
            assert [row["status"] for row in listed.json()["runs"]] == ["completed"]
        # A key the CLI revokes is refused by the next app over the same database.
        key_id = key[3:19]
        revoked = CliRunner().invoke(cli, ["keys", "revoke", key_id, "--db", url])
        assert revoked.exit_code == 0, revoked.output
        app = create_app(agent=agent, settings=ServiceSettings(auth="keys"))
        with serve(app) as base, httpx.Client(base_url=base, timeout=30) as client:
            refused = client.post(
                "/v1/runs", json={"message": "hello"}, headers={"Authorization": f"Bearer {key}"}
            )
            assert refused.status_code == 401
    finally:
        agent.close()


def test_keys_in_memory_are_said_loudly_when_callers_must_present_keys(
    caplog: pytest.LogCaptureFixture,
) -> None:
    agent = Agent(model=ScriptedModel(["unused"]), storage="memory://")
    with caplog.at_level(logging.WARNING, logger="hermes_agent.server"):
        app = create_app(agent=agent, settings=ServiceSettings(auth="keys"))
    assert isinstance(app.state.keys, MemoryKeyStore)
    warned = [r.getMessage() for r in caplog.records if "API keys" in r.getMessage()]
    assert len(warned) == 1 and "hermes-agent keys create" in warned[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hermes_agent.server"):
        create_app(agent=agent, settings=ServiceSettings(auth="none"))
        create_app(agent=agent, settings=ServiceSettings(auth="keys"), keys=MemoryKeyStore())
    assert not [r for r in caplog.records if "API keys" in r.getMessage()]
    agent.close()


def test_where_keys_are_kept_the_settings_then_the_config_then_the_agents_database(
    tmp_path: Path,
) -> None:
    url = _sqlite(tmp_path)
    on_disk = Agent(model=ScriptedModel(["unused"]), storage=url)
    in_memory_sql = Agent(model=ScriptedModel(["unused"]), storage="sqlite://")
    try:
        settings = ServiceSettings()
        assert keys_url_for(settings, None, on_disk) == url
        assert keys_url_for(settings, None, in_memory_sql) == "memory://"
        elsewhere = f"sqlite:///{tmp_path / 'keys.db'}"
        chosen = ServiceSettings(keys_url=elsewhere)
        assert keys_url_for(chosen, None, on_disk) == elsewhere
    finally:
        on_disk.close()
        in_memory_sql.close()


def test_the_backend_is_one_fork_with_quotas_beside_the_keys(tmp_path: Path) -> None:
    agent = Agent(model=ScriptedModel(["unused"]), storage=_sqlite(tmp_path))
    served = build_backend(agent, ServiceSettings())
    try:
        assert served.agent is not agent and served.manager.agent is served.agent
        assert served.backend is not None and served.queue is None
        assert isinstance(served.keys, SqlKeyStore)
        assert served.keys_url == _sqlite(tmp_path)
        assert isinstance(served.manager.quotas.store, SqlQuotaStore)
    finally:
        served.close()
        agent.close()
    alone = build_backend(agent, ServiceSettings(), with_keys=False)
    try:
        assert alone.keys is None and alone.keys_url is None
        assert isinstance(alone.manager.quotas.store, MemoryQuotaStore)
    finally:
        alone.close()
        agent.close()


def test_the_doors_build_their_backend_at_the_composition_root() -> None:
    # That no door imports an engine, and only the root builds one, are import contracts
    # (pyproject.toml, tests/test_architecture.py); here, that each door does use the root.
    graph = grimp.build_graph("hermes_agent", cache_dir=None)
    composing = {
        door
        for door in DOORS
        if graph.direct_import_exists(importer=door, imported="hermes_agent.backends")
    }
    assert composing == {
        "hermes_agent.server.app",
        "hermes_agent.mcp.server",
        "hermes_agent.cli.mcp",
    }
