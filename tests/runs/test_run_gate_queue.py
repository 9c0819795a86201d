"""The gate with ``execution: queue``: real ``hermes-agent worker`` processes on Redis, PostgreSQL
as their store, the step model as the endpoint. The same refusals as in process: a toolset the
operator did not offer is 422 before anything is queued, and a run cancelled before its answer
still spends the tokens of every model turn its worker took."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from hermes_agent.runs.keys import SqlKeyStore
from hermes_agent.server import ServiceSettings, create_app
from hermes_agent.storage import open_storage
from hermes_agent.worker.store import RunStore
from server_harness import asking, serve, sse_events
from step_model import running_step_model
from worker_harness import REDIS, cluster, free_port, wait_finished

pytestmark = pytest.mark.timeout(240)


def _alice(pg_url: str) -> str:
    store = SqlKeyStore(pg_url)
    try:
        return store.create("alice")
    finally:
        store.close()


def test_queued_runs_pass_the_same_gate(tmp_path: Path, pg_url: str) -> None:
    key = _alice(pg_url)
    settings = ServiceSettings(
        execution="queue", auth="keys", keepalive_s=0.2, quotas={"tokens_per_day": 50}
    )
    with (
        running_step_model(free_port(), latency=0.05) as model_url,
        cluster(tmp_path, pg_url, REDIS, model_url, step_sleep=5) as c,
    ):
        c.start_worker(concurrency=2)
        c.wait_ready()
        app = create_app(tmp_path / "config.yaml", settings=settings)
        auth = {"Authorization": f"Bearer {key}"}
        with serve(app) as url, httpx.Client(base_url=url, headers=auth, timeout=60) as alice:
            wider = alice.post("/v1/runs", json={"message": "job w", "toolsets": ["admin"]})
            assert wider.status_code == 422, wider.text
            assert "'admin': not offered by this service" in wider.json()["detail"]
            assert alice.get("/v1/runs").json()["runs"] == []  # nothing was queued

            # Each run is cancelled after its first model turn (30 tokens), while its tool
            # sleeps: two such runs spend the day's 50 tokens, and the third is refused.
            for attempt in range(2):
                request = {"message": f"job q{attempt} steps=3", "stream": True}
                with alice.stream("POST", "/v1/runs", json=request) as reply:
                    assert reply.status_code == 200, reply.read()
                    rid = reply.headers["location"].rsplit("/", 1)[1]
                    frames = sse_events(reply.iter_lines())
                    thought = next(f for f in frames if f.get("event") == "thought")
                    assert thought["data"]["tokens"] == 30
                    assert alice.post(f"/v1/runs/{rid}/cancel").json()["cancelled"] is True
            refused = alice.post("/v1/runs", json={"message": "job r steps=1"})
            assert refused.status_code == 429, refused.text
            assert "tokens_per_day" in refused.json()["detail"]
            assert app.state.manager.quotas.usage("alice").tokens == 60


def test_answering_parked_approvals_cannot_pass_the_limit(tmp_path: Path, pg_url: str) -> None:
    """A run waiting for an approval holds no worker and does not count; its answer puts it
    back on the queue, so the answer needs room like a new run (429 while there is none)."""
    key = _alice(pg_url)
    settings = ServiceSettings(
        execution="queue", auth="keys", keepalive_s=0.2, max_runs_in_flight_per_user=1
    )
    with (
        running_step_model(free_port(), latency=0.02) as model_url,
        cluster(tmp_path, pg_url, REDIS, model_url, step_sleep=3, step_requires_approval=True) as c,
    ):
        c.start_worker(concurrency=4)
        c.wait_ready()
        app = create_app(tmp_path / "config.yaml", settings=settings)
        auth = {"Authorization": f"Bearer {key}"}
        with serve(app) as url, httpx.Client(base_url=url, headers=auth, timeout=60) as alice:
            refs = []
            for tag in ("a", "b", "c"):
                rid = alice.post("/v1/runs", json={"message": f"job {tag} steps=1"}).json()[
                    "request_id"
                ]
                view = asking(alice, rid)
                refs.append(view["pending_approvals"][0]["approval_id"])
            # Three parked runs; the first answer takes the one slot while its step sleeps.
            first = alice.post(f"/v1/approvals/{refs[0]}", json={"approved": True})
            assert first.status_code == 200, first.text
            second = alice.post(f"/v1/approvals/{refs[1]}", json={"approved": True})
            assert second.status_code == 429 and "in flight" in second.json()["detail"]
            # The refused answer left its approval pending: it can be given once there is room.
            pending = {p["approval_id"] for p in alice.get("/v1/approvals").json()["approvals"]}
            assert {refs[1], refs[2]} <= pending


def test_runs_nobody_read_back_still_count_before_the_next_is_admitted(
    tmp_path: Path, pg_url: str
) -> None:
    """A run's tokens count whether or not anyone reads it back, however many runs came after
    it: the next submit settles every finished run of the user's day first."""
    key = _alice(pg_url)
    # No reservation: the cheap runs are admitted beside the big one (what is tested here is
    # that finished runs count, not what runs in flight hold back).
    quotas = {"tokens_per_day": 50, "tokens_reserved_per_run": 0}
    settings = ServiceSettings(execution="queue", auth="keys", keepalive_s=0.2, quotas=quotas)
    with (
        running_step_model(free_port(), latency=0.02) as model_url,
        cluster(tmp_path, pg_url, REDIS, model_url, step_sleep=2) as c,
    ):
        c.start_worker(concurrency=2)
        c.wait_ready()
        app = create_app(tmp_path / "config.yaml", settings=settings)
        auth = {"Authorization": f"Bearer {key}"}
        with serve(app) as url, httpx.Client(base_url=url, headers=auth, timeout=60) as alice:
            big = alice.post("/v1/runs", json={"message": "job big steps=1"}).json()["request_id"]
            # While it runs, more runs than any "latest few" window, each cancelled at once.
            for i in range(25):
                queued = alice.post("/v1/runs", json={"message": f"job cheap{i} steps=1"})
                assert queued.status_code == 202, queued.text
                alice.post(f"/v1/runs/{queued.json()['request_id']}/cancel")
            store = RunStore(open_storage(pg_url))  # watched from outside: nobody reads it
            try:
                wait_finished(store, [big], 60)
            finally:
                store.storage.close()
            refused = alice.post("/v1/runs", json={"message": "job next steps=1"})
            assert refused.status_code == 429, refused.text
            assert "tokens_per_day" in refused.json()["detail"]
    assert app.state.manager.quotas.usage("alice").tokens >= 60, "the big run was not counted"
