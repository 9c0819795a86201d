"""Per-user daily quotas: over a real uvicorn on loopback with SQLite and PostgreSQL (429 with
Retry-After, counts that survive a restart, two users apart, session ids that are not users, the
WebSocket gate, refunds, metrics), the stores' atomic admission under concurrency, and the
day's reset by the clock."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from hermes_agent.config import load_config
from hermes_agent.errors import ConfigError
from hermes_agent.runs.keys import KeyStore, MemoryKeyStore, SqlKeyStore
from hermes_agent.runs.quotas import (
    MemoryQuotaStore,
    Quotas,
    QuotaStore,
    SqlQuotaStore,
    quota_store_for,
)
from hermes_agent.runs.settings import QuotaLimits, QuotaSettings, service_settings
from hermes_agent.server import ServiceSettings, create_app, open_key_store
from server_harness import bearer as _bearer
from server_harness import make_agent, only_run_id, post_in_background, serve
from storage_backends import database_url, sql_database_url  # noqa: F401  (fixtures)


def _seconds_to_utc_midnight() -> float:
    now = datetime.now(UTC)
    return 86400 - (now.hour * 3600 + now.minute * 60 + now.second + now.microsecond / 1e6)


def _app(url: str, keys: KeyStore | None = None, **quotas: Any) -> Any:
    settings = ServiceSettings(keys_url=url, quotas=QuotaSettings(**quotas))
    return create_app(agent=make_agent(url), settings=settings, keys=keys)


def test_runs_per_day_gives_429_with_retry_after_per_user_and_survives_a_restart(
    sql_url: str,
) -> None:
    keys = open_key_store(sql_url)
    alice, bob = keys.create("alice"), keys.create("bob")
    keys.close()
    with serve(_app(sql_url, runs_per_day=2)) as url:
        client = httpx.Client(base_url=url, timeout=30)
        # A new session id for every message (as a chat channel might send): still alice.
        for session in ("s1", "s2"):
            reply = client.post(
                "/v1/runs", json={"message": "hello", "session_id": session}, headers=_bearer(alice)
            )
            assert reply.status_code == 200, reply.text
        refused = client.post(
            "/v1/runs", json={"message": "hello", "session_id": "s3"}, headers=_bearer(alice)
        )
        assert refused.status_code == 429
        retry = int(refused.headers["retry-after"])
        assert abs(retry - _seconds_to_utc_midnight()) <= 5
        detail = refused.json()["detail"]
        assert "2 of 2 runs" in detail and "runs_per_day" in detail and "00:00 UTC" in detail
        # Bob's count is his own.
        reply = client.post("/v1/runs", json={"message": "hello"}, headers=_bearer(bob))
        assert reply.status_code == 200, reply.text
        metrics = client.get("/metrics").text
        assert 'hermes_quota_rejections_total{quota="runs_per_day"} 1.0' in metrics
        assert 'hermes_rejections_total{reason="runs_per_day"} 1.0' in metrics

    # A new process on the same database: the counts are still there.
    with serve(_app(sql_url, runs_per_day=2)) as url:
        client = httpx.Client(base_url=url, timeout=30)
        refused = client.post("/v1/runs", json={"message": "hello"}, headers=_bearer(alice))
        assert refused.status_code == 429
        assert (
            client.post("/v1/runs", json={"message": "hello"}, headers=_bearer(bob)).status_code
            == 200
        )
        assert (
            client.post("/v1/runs", json={"message": "hello"}, headers=_bearer(bob)).status_code
            == 429
        )
    store = SqlKeyStore(sql_url)
    try:
        quotas = Quotas(QuotaSettings(), quota_store_for(store))
        assert (quotas.usage("alice").runs, quotas.usage("bob").runs) == (2, 2)
        assert quotas.usage("s1").runs == 0  # a session id is never a user
    finally:
        store.close()


def test_tokens_per_day_counts_each_run_s_tokens_when_it_ends(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    keys = open_key_store(url)
    alice = keys.create("alice")
    with serve(_app(url, keys, tokens_per_day=1)) as base:
        client = httpx.Client(base_url=base, timeout=30, headers=_bearer(alice))
        first = client.post("/v1/runs", json={"message": "hello"})
        assert first.status_code == 200, first.text
        spent = first.json()["usage"]["total_tokens"]
        assert spent > 1
        refused = client.post("/v1/runs", json={"message": "hello"})
        assert refused.status_code == 429
        assert f"{spent:,} of 1 tokens" in refused.json()["detail"]
        assert "tokens_per_day" in refused.json()["detail"]
        assert int(refused.headers["retry-after"]) > 0
    keys = open_key_store(url)
    quotas = Quotas(QuotaSettings(), quota_store_for(keys))
    assert quotas.usage("alice").tokens == spent
    assert quotas.usage("alice").runs == 1  # the refused run was not counted
    keys.close()


def test_a_runs_tokens_are_counted_before_its_answer_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The answer (and the ending's event) waits for the run's tokens to reach the quota
    store, however slow it is: the owner's next run, sent the moment the answer arrives, is
    checked against a day that counts them."""
    keys = MemoryKeyStore()
    alice = keys.create("alice")
    slow_add = MemoryQuotaStore.add_tokens

    def add_tokens(self: MemoryQuotaStore, *args: Any) -> None:
        threading.Event().wait(0.3)  # a quota store on a busy database
        slow_add(self, *args)

    monkeypatch.setattr(MemoryQuotaStore, "add_tokens", add_tokens)
    with serve(_app("memory://", keys, tokens_per_day=1)) as base:
        client = httpx.Client(base_url=base, timeout=30, headers=_bearer(alice))
        first = client.post("/v1/runs", json={"message": "hello"})
        assert first.status_code == 200, first.text
        refused = client.post("/v1/runs", json={"message": "hello"})
        assert refused.status_code == 429, refused.text
        assert "tokens_per_day" in refused.json()["detail"]


def test_a_cancel_while_the_tokens_are_counted_is_too_late_and_frees_the_slot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cancel that lands while an ending run's tokens are being counted does not cut the
    ending short: the run ends completed, the cancel says it did not cancel, and the run's
    slot is given back (the owner's next run is not refused for one still in flight)."""
    keys = MemoryKeyStore()
    alice = keys.create("alice")
    slow_add = MemoryQuotaStore.add_tokens
    counting = threading.Event()

    def add_tokens(self: MemoryQuotaStore, *args: Any) -> None:
        counting.set()
        threading.Event().wait(0.5)
        slow_add(self, *args)

    monkeypatch.setattr(MemoryQuotaStore, "add_tokens", add_tokens)
    settings = ServiceSettings(
        keys_url="memory://",
        quotas=QuotaSettings(tokens_per_day=10**6),
        max_runs_in_flight_per_user=1,
    )
    app = create_app(agent=make_agent("memory://"), settings=settings, keys=keys)
    with serve(app) as base:
        client = httpx.Client(base_url=base, timeout=30, headers=_bearer(alice))
        poster, answers = post_in_background(client, {"message": "hello"})
        assert counting.wait(10)
        request_id = only_run_id(client)
        cancel = client.post(f"/v1/runs/{request_id}/cancel")
        poster.join(10)
        ending = {"request_id": request_id, "cancelled": False, "status": "completed"}
        assert cancel.json() == ending
        assert answers[0].status_code == 200, answers[0].text
        again = client.post("/v1/runs", json={"message": "hello"})
        assert again.status_code == 200, again.text


def test_the_websocket_and_streams_pass_the_same_gate(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    keys = MemoryKeyStore()
    key = keys.create("alice")
    with serve(_app(url, keys, runs_per_day=1)) as base:
        with connect(
            base.replace("http", "ws") + "/v1/ws", additional_headers=_bearer(key)
        ) as socket:
            socket.send(json.dumps({"type": "run", "message": "hello", "client_ref": 1}))
            socket.send(json.dumps({"type": "run", "message": "hello", "client_ref": 2}))
            seen: dict[str, Any] = {}
            while len(seen) < 2:
                message = json.loads(socket.recv(timeout=20))
                if message["type"] == "error":
                    seen["error"] = message
                elif message["type"] == "event" and message["event"]["kind"] == "result":
                    seen["result"] = message
        assert seen["error"]["status"] == 429
        assert seen["error"]["retry_after"] > 0
        assert "runs_per_day" in seen["error"]["detail"]
        client = httpx.Client(base_url=base, timeout=30, headers=_bearer(key))
        streamed = client.post("/v1/runs", json={"message": "hello", "stream": True})
        assert streamed.status_code == 429


def test_a_run_the_agent_refuses_before_it_starts_is_not_counted(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    keys = MemoryKeyStore()
    key = keys.create("alice")
    with serve(_app(url, keys, runs_per_day=1)) as base:
        client = httpx.Client(base_url=base, timeout=30, headers=_bearer(key))
        refused = client.post("/v1/runs", json={"message": "hello", "output_format": "nope"})
        assert refused.status_code == 422
        assert client.post("/v1/runs", json={"message": "hello"}).status_code == 200
        assert client.post("/v1/runs", json={"message": "hello"}).status_code == 429


def test_overrides_per_user_and_auth_none_counts_the_local_user(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    keys = MemoryKeyStore()
    alice, ops = keys.create("alice"), keys.create("ops", admin=True)
    quotas = {"runs_per_day": 1, "users": {"ops": {"runs_per_day": None}}}
    with serve(_app(url, keys, **quotas)) as base:
        client = httpx.Client(base_url=base, timeout=30)
        for _ in range(3):
            assert (
                client.post("/v1/runs", json={"message": "hello"}, headers=_bearer(ops)).status_code
                == 200
            )
        assert (
            client.post("/v1/runs", json={"message": "hello"}, headers=_bearer(alice)).status_code
            == 200
        )
        assert (
            client.post("/v1/runs", json={"message": "hello"}, headers=_bearer(alice)).status_code
            == 429
        )
    settings = ServiceSettings(auth="none", quotas=QuotaSettings(runs_per_day=1))
    with serve(create_app(agent=make_agent(url), settings=settings)) as base:
        client = httpx.Client(base_url=base, timeout=30)
        assert client.post("/v1/runs", json={"message": "hello"}).status_code == 200
        assert client.post("/v1/runs", json={"message": "hi", "session_id": "x"}).status_code == 429


def test_the_config_s_service_section_sets_the_quotas(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'state.db'}"
    config = tmp_path / "config.yaml"
    config.write_text(
        "model: {provider: scripted, responses: ['Hi!', 'Hi!', 'Hi!']}\n"
        f"storage: {{url: '{storage}'}}\n"
        "service:\n  auth: keys\n  quotas: {runs_per_day: 1}\n",
        encoding="utf-8",
    )
    keys = open_key_store(storage)
    key = keys.create("alice")
    keys.close()
    with serve(create_app(config)) as base:  # keys and quotas in the config's storage
        client = httpx.Client(base_url=base, timeout=30, headers=_bearer(key))
        assert client.post("/v1/runs", json={"message": "hello"}).status_code == 200
        assert client.post("/v1/runs", json={"message": "hello"}).status_code == 429

    config.write_text("service:\n  quotas: {runs_per_dya: 1}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as raised:
        service_settings(load_config(config))
    message = str(raised.value)
    assert f"{config}: service.quotas.runs_per_dya: unknown key" in message
    assert "did you mean 'runs_per_day'?" in message
    config.write_text("service:\n  port: 70000\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"service\.port: .*65535"):
        service_settings(load_config(config))


# -- the stores ------------------------------------------------------------------------------


def _store(db_url: str) -> tuple[QuotaStore, KeyStore]:
    keys = open_key_store(db_url)
    return quota_store_for(keys), keys


def test_admission_is_atomic_under_concurrency(db_url: str) -> None:
    store, keys = _store(db_url)
    assert isinstance(store, MemoryQuotaStore if db_url.startswith("memory") else SqlQuotaStore)
    limits = QuotaLimits(runs_per_day=5)
    admitted: list[bool] = []
    start = threading.Barrier(12)

    def one() -> None:
        start.wait()
        ok, _ = store.admit("alice", "2030-01-01", limits)
        admitted.append(ok)

    threads = [threading.Thread(target=one) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    try:
        assert sorted(admitted) == [False] * 7 + [True] * 5
        assert store.usage("alice", "2030-01-01").runs == 5
        assert store.usage("bob", "2030-01-01").runs == 0
        store.refund("alice", "2030-01-01")
        store.add_tokens("alice", "2030-01-01", 40)
        assert store.usage("alice", "2030-01-01").runs == 4
        assert store.usage("alice", "2030-01-01").tokens == 40
    finally:
        keys.close()


def test_the_day_resets_at_utc_midnight_and_retry_after_says_when(db_url: str) -> None:
    store, keys = _store(db_url)
    now = [datetime(2030, 1, 1, 23, 59, 30, tzinfo=UTC).timestamp()]
    quotas = Quotas(QuotaSettings(runs_per_day=1), store, clock=lambda: now[0])
    try:
        assert quotas.admit("alice") == ("2030-01-01", None)
        day, exceeded = quotas.admit("alice")
        assert day == "2030-01-01"
        assert exceeded is not None
        assert (exceeded.quota, exceeded.used, exceeded.limit) == ("runs_per_day", 1, 1)
        assert exceeded.retry_after == 30
        assert "in 0 h 1 min" in exceeded.message
        now[0] += 31  # a new UTC day
        assert quotas.admit("alice") == ("2030-01-02", None)
        assert quotas.usage("alice").runs == 1
    finally:
        keys.close()


def test_limits_for_a_user_take_the_override_s_keys_and_the_defaults_for_the_rest() -> None:
    settings = QuotaSettings.model_validate(
        {
            "runs_per_day": 10,
            "tokens_per_day": 1000,
            "users": {"ops": {"runs_per_day": None}, "bob": {"tokens_per_day": 5}},
        }
    )
    assert settings.limits_for("alice") == QuotaLimits(runs_per_day=10, tokens_per_day=1000)
    assert settings.limits_for("ops") == QuotaLimits(runs_per_day=None, tokens_per_day=1000)
    assert settings.limits_for("bob") == QuotaLimits(runs_per_day=10, tokens_per_day=5)
    assert settings.enabled and not QuotaSettings().enabled
    quotas = Quotas(QuotaSettings(users={"bob": QuotaLimits(runs_per_day=1)}), MemoryQuotaStore())
    assert quotas.applies_to("bob") and not quotas.applies_to("alice")


def test_an_unreachable_quota_store_refuses_the_run_with_503(tmp_path: Path) -> None:
    class Broken(MemoryQuotaStore):
        def admit(self, user_id: str, day: str, limits: QuotaLimits) -> Any:
            raise OSError("the database is gone")

    app = create_app(
        agent=make_agent(f"sqlite:///{tmp_path / 'state.db'}"),
        settings=ServiceSettings(auth="none", quotas=QuotaSettings(runs_per_day=5)),
    )
    app.state.manager.quotas.store = Broken()
    with serve(app) as base:
        reply = httpx.post(f"{base}/v1/runs", json={"message": "hello"}, timeout=30)
    assert reply.status_code == 503
    assert "quota store cannot be reached" in reply.json()["detail"]
