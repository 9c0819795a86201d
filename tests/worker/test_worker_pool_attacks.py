"""Attacks on the queue with real workers (issue "Service hardening, round 2", item 8):

- a poison pill — a run whose tool kills its worker process every time it runs — is
  dead-lettered after its redelivery limit, and the pool goes on running the other runs;
- an approval of a queued run answered through a second instance of the service (two
  ``create_app`` on one store and one broker) resumes the run exactly once: the tool runs once,
  two answers at once on the two instances give one 200 and one 409, and any later answer on
  either instance is 409.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from hermes_agent import build_agent
from hermes_agent.runs.keys import SqlKeyStore
from hermes_agent.server import ServiceSettings, create_app
from hermes_agent.worker import submit
from hermes_agent.worker.store import RunStore
from server_harness import serve, sse_events
from server_harness import wait_for as _wait  # the one bounded wait
from step_model import running_step_model
from worker_harness import REDIS, TOOLS, cluster, free_port

pytestmark = pytest.mark.timeout(240)

# ``step`` as in the harness, except that a job tagged ``poison...`` kills the process running
# it (after noting the execution), every time: a SIGKILL leaves no chance to clean up.
POISON_TOOLS = TOOLS.replace(
    "    key = current_call()\n",
    "    key = current_call()\n"
    "    if tag.startswith('poison'):\n"
    "        import signal\n"
    "        with psycopg.connect(DB, autocommit=True) as conn:\n"
    "            conn.execute(\n"
    "                'INSERT INTO executions(call_key, tag, n, pid, at) '\n"
    "                'VALUES (%s, %s, %s, %s, clock_timestamp())',\n"
    "                (key.id if key else tag, tag, n, os.getpid()),\n"
    "            )\n"
    "        os.kill(os.getpid(), signal.SIGKILL)\n",
    1,
)


def test_a_poison_pill_is_dead_lettered_and_the_pool_goes_on(tmp_path: Path, pg_url: str) -> None:
    assert POISON_TOOLS != TOOLS
    with (
        running_step_model(free_port(), latency=0.05) as model_url,
        cluster(tmp_path, pg_url, REDIS, model_url, lease_ttl=1.0, max_redeliveries=2) as c,
    ):
        (tmp_path / "tools.py").write_text(POISON_TOOLS, encoding="utf-8")
        # Three workers under a supervisor that starts a new worker for each one that dies,
        # as systemd or Kubernetes would. One run per process: a kill takes the whole process,
        # and with the thread pool it would take the runs beside the pill with it, each charged
        # a redelivery (docs/scale-out.md, "Poison pills").
        for _ in range(3):
            c.start_worker(concurrency=1)
        c.wait_ready()
        stopping = threading.Event()
        restarts: list[int] = []

        def supervise() -> None:
            while not stopping.wait(0.2):
                for process in list(c.workers):
                    if process.poll() is not None and process.pid not in restarts:
                        restarts.append(process.pid)
                        c.start_worker(concurrency=1)

        supervisor = threading.Thread(target=supervise, daemon=True)
        supervisor.start()
        submitter = build_agent(tmp_path / "config.yaml")
        store = RunStore(submitter.storage)  # type: ignore[arg-type]
        try:
            poison = submit(submitter, "job poison steps=1", session_id="poison")
            others = [
                submit(submitter, f"job ok{i} steps=2", session_id=f"ok{i}") for i in range(6)
            ]
            _wait(lambda: poison.status() == "dead", 90, f"poison still {poison.status()}")
            for i, handle in enumerate(others):
                assert handle.result(timeout=90).output.startswith(f"done ok{i} after 2 steps")
            # Later runs still complete on the same pool.
            late = submit(submitter, "job late steps=1", session_id="late")
            assert late.result(timeout=60).output.startswith("done late after 1 steps")
            # One process per attempt died: the first and one per redelivery allowed.
            assert len(restarts) == 3, restarts

            dead = store.get(poison.request_id)
            assert dead is not None and dead.status == "dead"
            assert "dead-lettered" in (dead.error or "") and "max_redeliveries 2" in (
                dead.error or ""
            )
            with c.effects_db() as conn:
                killed = conn.execute(
                    "SELECT count(*), count(DISTINCT pid) FROM executions WHERE tag = 'poison'"
                ).fetchone()
            # The first attempt and one per redelivery allowed, each in a process of its own.
            assert killed is not None and tuple(killed) == (3, 3), killed
            # Its trail and its events end once, with the dead letter.
            events = store.events(poison.request_id)
            assert events[-1][1]["kind"] == "run_stopped", events[-1]
            assert events[-1][1]["status"] == "dead"
            trail = submitter.storage.records(poison.request_id)  # type: ignore[union-attr]
            assert [r.role for r in trail].count("stopped") == 1 and trail[-1].role == "stopped"

            listed = CliRunner().invoke(
                __import__("hermes_agent.cli.app", fromlist=["app"]).app,
                [
                    "runs",
                    "list",
                    "--config",
                    str(tmp_path / "config.yaml"),
                    "--status",
                    "dead",
                    "--json",
                ],
            )
            assert listed.exit_code == 0, listed.output
            rows = [json.loads(line) for line in listed.output.splitlines() if line.strip()]
            assert [(r["request_id"], r["status"]) for r in rows] == [(poison.request_id, "dead")]
            assert "dead-lettered" in rows[0]["error"] and rows[0]["redeliveries"] == 2
        finally:
            stopping.set()
            supervisor.join(timeout=5)
            submitter.close()


def _keys(pg_url: str) -> dict[str, str]:
    keys = SqlKeyStore(pg_url)
    try:
        return {"alice": keys.create("alice")}
    finally:
        keys.close()


def test_an_approval_answered_on_another_instance_resumes_the_run_once(
    tmp_path: Path, pg_url: str
) -> None:
    key = _keys(pg_url)["alice"]
    headers = {"Authorization": f"Bearer {key}"}
    settings = ServiceSettings(execution="queue", auth="keys", keepalive_s=0.2)
    with (
        running_step_model(free_port(), latency=0.05) as model_url,
        cluster(tmp_path, pg_url, REDIS, model_url, step_requires_approval=True) as c,
    ):
        c.start_worker(concurrency=2)
        c.wait_ready()
        first = create_app(tmp_path / "config.yaml", settings=settings)
        second = create_app(tmp_path / "config.yaml", settings=settings)
        with (
            serve(first) as url_a,
            serve(second) as url_b,
            httpx.Client(base_url=url_a, headers=headers, timeout=60) as a,
            httpx.Client(base_url=url_b, headers=headers, timeout=60) as b,
        ):
            body = {"message": "job x steps=1", "session_id": "sx", "stream": True}
            with a.stream("POST", "/v1/runs", json=body) as reply:
                frames = (f for f in sse_events(reply.iter_lines()) if "comment" not in f)
                asked = next(f for f in frames if f["event"] == "approval_required")
                rid, approval = asked["data"]["request_id"], asked["data"]["approval_id"]
                _wait(
                    lambda: b.get(f"/v1/runs/{rid}").json()["status"] == "waiting_approval",
                    30,
                    "the run was not set aside",
                )
                # The other instance lists it and answers it; both instances answer at once.
                listed = b.get("/v1/approvals").json()["approvals"]
                assert [p["approval_id"] for p in listed] == [approval]
                codes: list[int] = []
                start = threading.Barrier(2)

                def answer(client: httpx.Client) -> None:
                    start.wait()
                    reply = client.post(f"/v1/approvals/{approval}", json={"approved": True})
                    codes.append(reply.status_code)

                racers = [threading.Thread(target=answer, args=(x,)) for x in (a, b)]
                for racer in racers:
                    racer.start()
                for racer in racers:
                    racer.join(timeout=30)
                assert sorted(codes) == [200, 409], codes
                # The stream on the first instance goes on to the resumed run's result.
                rest = list(frames)
            assert rest[-1]["event"] == "result", [f["event"] for f in rest]
            assert rest[-1]["data"]["result"]["output"].startswith("done x after 1 steps")
            for client in (a, b):
                again = client.post(f"/v1/approvals/{approval}", json={"approved": False})
                assert again.status_code == 409, again.text
            state = b.get(f"/v1/runs/{rid}").json()
            assert (state["status"], state["attempts"]) == ("completed", 2), state
            assert state["pending_approvals"] == []
        # The tool ran once, and the run was resumed by one attempt only.
        time.sleep(0.5)  # a duplicate delivery, had there been one, would have run by now
        with c.effects_db() as conn:
            runs_of_call = conn.execute(
                "SELECT call_key FROM executions WHERE tag = 'x'"
            ).fetchall()
        assert [row[0] for row in runs_of_call] == [f"{rid}/0/0"]
        store = RunStore(build_agent(tmp_path / "config.yaml").storage)  # type: ignore[arg-type]
        run = store.get(rid)
        assert run is not None and run.claims == 2
        resolved = [w for _, w in store.events(rid) if w["kind"] == "approval_resolved"]
        assert len(resolved) == 1
