"""The service with ``execution: queue`` (docs/operating.md, "Queued runs"): a real uvicorn on
loopback queues runs on real ``hermes-agent worker`` processes over Redis, with PostgreSQL as the
store they share and the step model (tests/harness/step_model.py) as the model. ``POST /v1/runs``
answers 202 at once; the run's events reach the caller from the store (SSE, WebSocket, ``GET``)
whichever worker ran it; another user's run is a 404; a cancel stops the worker's run; and an
approval sets the run aside, frees its worker, and resumes it on the answer."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from hermes_agent.errors import ConfigError
from hermes_agent.runs.keys import SqlKeyStore
from hermes_agent.server import ServiceSettings, create_app
from hermes_agent.worker.backend import approval_ref, parse_approval_ref
from server_harness import serve, sse_events, wait_for
from step_model import running_step_model
from worker_harness import REDIS, Cluster, cluster, free_port

pytestmark = pytest.mark.timeout(240)


def _settings(**overrides: Any) -> ServiceSettings:
    values: dict[str, Any] = {"execution": "queue", "auth": "keys", "keepalive_s": 0.2}
    values.update(overrides)
    return ServiceSettings(**values)


def _keys(pg_url: str) -> dict[str, str]:
    store = SqlKeyStore(pg_url)
    try:
        return {"alice": store.create("alice"), "bob": store.create("bob")}
    finally:
        store.close()


def _client(url: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def _frames(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    return (f for f in sse_events(lines) if "comment" not in f)


def _until(client: httpx.Client, request_id: str, status: str, timeout: float = 60) -> Any:
    """The run once its status is ``status``; it must not end in another one meanwhile."""

    def reached() -> Any:
        body = client.get(f"/v1/runs/{request_id}").json()
        if body["status"] == status:
            return body
        assert body["status"] not in ("completed", "failed", "dead", "cancelled"), body
        return None

    return wait_for(reached, timeout, f"run {request_id} {status}", pace=0.05)


def _executions(c: Cluster, tag: str) -> int:
    with c.effects_db() as conn:
        row = conn.execute("SELECT count(*) FROM executions WHERE tag = %s", (tag,)).fetchone()
    return int(row[0]) if row else 0


def test_queue_mode_needs_a_queue_section_and_a_sql_store(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("storage: {url: 'memory://'}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"queue: section"):
        create_app(config, settings=ServiceSettings(execution="queue"))
    config.write_text("queue: {broker: 'redis://127.0.0.1:6379/0'}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"SQL store; set storage.url"):
        create_app(config, settings=ServiceSettings(execution="queue"))
    # The service: section of the file says it too.
    config.write_text(
        "queue: {broker: 'redis://127.0.0.1:6379/0'}\nservice: {execution: queue}\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError, match=r"SQL store"):
        create_app(config)


def test_an_approval_id_names_its_run_and_its_key() -> None:
    ref = approval_ref("0b6c-run", "3/abcdef0123")
    assert "/" not in ref
    assert parse_approval_ref(ref) == ("0b6c-run", "3/abcdef0123")
    assert parse_approval_ref("no-tilde") is None
    assert parse_approval_ref("run~%%%") is None


def test_queued_runs_over_http_and_websocket(tmp_path: Path, pg_url: str) -> None:
    keys = _keys(pg_url)
    settings = _settings(quotas={"tokens_per_day": 1_000_000})
    with (
        running_step_model(free_port(), latency=0.2) as model_url,
        cluster(tmp_path, pg_url, REDIS, model_url, step_sleep=0.3) as c,
    ):
        c.start_worker(concurrency=2)
        c.start_worker(concurrency=2)
        c.wait_ready()
        app = create_app(tmp_path / "config.yaml", settings=settings)
        with (
            serve(app) as url,
            _client(url, keys["alice"]) as alice,
            _client(url, keys["bob"]) as bob,
        ):
            # A plain POST is queued: 202 at once, with where to follow the run.
            queued = alice.post("/v1/runs", json={"message": "job p steps=1", "session_id": "s1"})
            assert queued.status_code == 202, queued.text
            body = queued.json()
            plain = body["request_id"]
            assert body["status"] == "queued" and body["session_id"] == "s1"
            assert queued.headers["location"] == body["status_url"] == f"/v1/runs/{plain}"
            assert body["events_url"] == f"/v1/runs/{plain}/events"

            # A stream: the run's events from whichever worker runs it, ending with its result.
            request = {"message": "job s steps=2", "session_id": "s2", "stream": True}
            with alice.stream("POST", "/v1/runs", json=request) as reply:
                assert reply.status_code == 200
                assert reply.headers["content-type"].startswith("text/event-stream")
                streamed = reply.headers["location"].rsplit("/", 1)[1]
                frames = list(_frames(reply.iter_lines()))
            kinds = [f["event"] for f in frames]
            assert kinds[0] == "input" and kinds[-1] == "result", kinds
            assert kinds.count("tool_results") == 2, kinds
            ids = [int(f["id"]) for f in frames]
            assert ids == list(range(1, len(ids) + 1))
            result = frames[-1]["data"]["result"]
            assert result["request_id"] == streamed
            assert result["output"] == "done s after 2 steps; user turns seen: 1"
            assert result["session_id"] == "s2"  # the caller's id, not the store's
            assert _executions(c, "s") == 2

            # The run read back from the store; its events again after Last-Event-ID.
            state = alice.get(f"/v1/runs/{streamed}").json()
            assert (state["status"], state["source"], state["attempts"]) == (
                "completed",
                "queue",
                1,
            )
            assert state["result"]["output"] == result["output"]
            assert state["session_id"] == "s2" and state["pending_approvals"] == []
            with alice.stream(
                "GET", f"/v1/runs/{streamed}/events", headers={"Last-Event-ID": str(ids[-3])}
            ) as reply:
                again = list(_frames(reply.iter_lines()))
            assert [int(f["id"]) for f in again] == ids[-2:]
            assert again[-1]["event"] == "result"

            # The plain run finished meanwhile; the list has both, newest first.
            assert _until(alice, plain, "completed")["result"]["output"].startswith("done p")
            listed = alice.get("/v1/runs").json()["runs"]
            assert [r["request_id"] for r in listed] == [streamed, plain]
            assert {r["source"] for r in listed} == {"queue"}
            assert [
                r["request_id"] for r in alice.get("/v1/runs?session_id=s1").json()["runs"]
            ] == [plain]
            # The session is kept under the owner's id, as in process.
            session = alice.get("/v1/sessions/s2").json()
            users = [m["content"] for m in session["messages"] if m["role"] == "user"]
            assert users == ["job s steps=2"]

            # The workers' audit trail is in the shared store: the run's trace is there.
            stages = [r["stage"] for r in alice.get(f"/v1/runs/{streamed}/trace").json()["records"]]
            assert stages[0] == "InputParser" and stages[-1] == "OutputRenderer"
            assert bob.get(f"/v1/runs/{streamed}/trace").status_code == 404

            # Someone else's run is a 404 everywhere.
            assert bob.get(f"/v1/runs/{streamed}").status_code == 404
            assert bob.get(f"/v1/runs/{streamed}/events").status_code == 404
            assert bob.post(f"/v1/runs/{plain}/cancel").status_code == 404
            assert bob.get("/v1/runs").json()["runs"] == []
            assert alice.get("/v1/runs/no-such-run").status_code == 404

            # The tokens of each run count once against the daily quota, however often read.
            alice.get(f"/v1/runs/{streamed}")
            spent = sum(
                alice.get(f"/v1/runs/{rid}").json()["result"]["usage"]["total_tokens"]
                for rid in (plain, streamed)
            )
            assert spent > 0
            assert app.state.manager.quotas.usage("alice").tokens == spent

            # Cancel: the run is marked at once; its worker stops; the stream ends with it.
            request = {"message": "job c steps=5", "session_id": "s3", "stream": True}
            with alice.stream("POST", "/v1/runs", json=request) as reply:
                cancelled = reply.headers["location"].rsplit("/", 1)[1]
                # A run of the same session waits (parked) behind this one; it is cancelled
                # before any worker runs it.
                parked = alice.post(
                    "/v1/runs", json={"message": "job q steps=1", "session_id": "s3"}
                ).json()["request_id"]
                assert alice.post(f"/v1/runs/{parked}/cancel").json()["cancelled"]
                seen: list[dict[str, Any]] = []
                answer: dict[str, Any] | None = None
                for frame in _frames(reply.iter_lines()):
                    seen.append(frame)
                    if frame["event"] == "tool_results" and answer is None:
                        answer = alice.post(f"/v1/runs/{cancelled}/cancel").json()
                        at_cancel = _executions(c, "c")
                        # A step the worker had started runs on: the answer names it.
                        running = answer.pop("still_running", [])
                        assert answer == {
                            "request_id": cancelled,
                            "cancelled": True,
                            "status": "cancelled",
                        }
                        assert all(r["call_id"].startswith(f"{cancelled}/") for r in running)
                        assert {r["name"] for r in running} <= {"step"}, running
            assert seen[-1]["event"] == "run_stopped", [f["event"] for f in seen]
            assert seen[-1]["data"]["status"] == "cancelled"
            assert alice.post(f"/v1/runs/{cancelled}/cancel").json()["cancelled"] is False
            time.sleep(2.5)  # well past a heartbeat: the worker has let go of the run
            in_all = _executions(c, "c")
            print(f"\nsteps of the cancelled run: {at_cancel} at the cancel, {in_all} in all")
            # A step already started may finish; no new one starts once the run is cancelled.
            assert in_all <= min(at_cancel + 1, 4)
            # The parked run never ran: the cancel wrote its last event to its log.
            with alice.stream("GET", f"/v1/runs/{parked}/events") as stopped:
                ended = list(_frames(stopped.iter_lines()))
            assert [(f["event"], f.get("id")) for f in ended] == [("run_stopped", "1")]
            assert ended[0]["data"]["status"] == "cancelled"
            assert _executions(c, "q") == 0
            state = alice.get(f"/v1/runs/{cancelled}").json()
            assert (state["status"], state["error"], state["worker"]) == (
                "cancelled",
                "cancelled by the client",
                None,
            )

            # Refused as in process: a dry run cannot be queued, a long message is 413.
            assert alice.post("/v1/runs", json={"message": "x", "dry_run": True}).status_code == 422
            big = {"message": "x" * (settings.max_message_chars + 1)}
            assert alice.post("/v1/runs", json=big).status_code == 413

            # The WebSocket queues runs too, and sends their events from the store.
            ws_url = url.replace("http://", "ws://") + "/v1/ws"
            auth = {"Authorization": f"Bearer {keys['alice']}"}
            with connect(ws_url, additional_headers=auth) as socket:
                socket.send(
                    json.dumps({"type": "run", "message": "job w steps=1", "client_ref": 7})
                )
                started = json.loads(socket.recv(timeout=20))
                assert started["type"] == "started" and started["client_ref"] == 7
                events = []
                while not events or events[-1]["kind"] not in ("result", "run_stopped"):
                    message = json.loads(socket.recv(timeout=30))
                    assert message["type"] == "event", message
                    assert message["request_id"] == started["request_id"]
                    events.append(message["event"])
                # Cancel and approve on the socket reach the store too.
                socket.send(json.dumps({"type": "cancel", "request_id": started["request_id"]}))
                assert json.loads(socket.recv(timeout=20)) == {
                    "type": "cancelled",
                    "request_id": started["request_id"],
                    "cancelled": False,  # it had finished
                }
                socket.send(
                    json.dumps({"type": "approve", "approval_id": "x~eA", "approved": True})
                )
                refused = json.loads(socket.recv(timeout=20))
                assert (refused["type"], refused["status"]) == ("error", 404)
            assert events[-1]["result"]["output"] == "done w after 1 steps; user turns seen: 1"

            # The OpenAI-compatible facade runs through the same backend: on the workers.
            question = {"role": "user", "content": "job f steps=1"}
            facade = alice.post(
                "/v1/chat/completions", json={"model": "hermes-agent", "messages": [question]}
            )
            assert facade.status_code == 200, facade.text
            answer = facade.json()
            assert answer["choices"][0]["message"]["content"].startswith("done f after 1 steps")
            assert answer["hermes"]["status"] == "completed"
            streamed_body = {"model": "hermes-agent", "messages": [question], "stream": True}
            with alice.stream("POST", "/v1/chat/completions", json=streamed_body) as reply:
                assert reply.status_code == 200
                chunks = [
                    json.loads(line[6:])
                    for line in reply.iter_lines()
                    if line.startswith("data: {")
                ]
            text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
            assert text.startswith("done f after 1 steps"), chunks
            assert _executions(c, "f") == 2

        # Two workers shared the runs; every one ran on a worker, none in the service.
        with c.effects_db() as conn:
            pids = {row[0] for row in conn.execute("SELECT DISTINCT pid FROM executions")}
        assert pids <= {w.pid for w in c.workers}


def test_an_approval_frees_the_worker_and_resumes_the_run_across_processes(
    tmp_path: Path, pg_url: str
) -> None:
    keys = _keys(pg_url)
    with (
        running_step_model(free_port(), latency=0.1) as model_url,
        cluster(tmp_path, pg_url, REDIS, model_url, step_requires_approval=True) as c,
    ):
        worker = c.start_worker(concurrency=1)
        c.wait_ready()
        app = create_app(tmp_path / "config.yaml", settings=_settings())
        with (
            serve(app) as url,
            _client(url, keys["alice"]) as alice,
            _client(url, keys["bob"]) as bob,
        ):
            request = {"message": "job a steps=1", "session_id": "sa", "stream": True}
            with alice.stream("POST", "/v1/runs", json=request) as reply:
                lines = reply.iter_lines()
                frames = _frames(lines)
                asked = next(f for f in frames if f["event"] == "approval_required")
                waiting = asked["data"]["request_id"]
                approval = asked["data"]["approval_id"]
                assert asked["data"]["tool"] == "step"
                assert asked["data"]["arguments"] == {"tag": "a", "n": 1}

                # The run is set aside: no worker holds it, and the call did not run.
                state = _until(alice, waiting, "waiting_approval")
                assert state["worker"] is None
                assert [p["approval_id"] for p in state["pending_approvals"]] == [approval]
                listed = alice.get("/v1/approvals").json()["approvals"]
                assert [(p["approval_id"], p["session_id"]) for p in listed] == [(approval, "sa")]
                assert bob.get("/v1/approvals").json()["approvals"] == []
                assert _executions(c, "a") == 0

                # Its only worker (concurrency 1) is free: another run completes meanwhile.
                other = alice.post("/v1/runs", json={"message": "job b steps=0"}).json()
                done = _until(alice, other["request_id"], "completed")
                assert done["result"]["output"] == "done b after 0 steps; user turns seen: 1"
                assert alice.get(f"/v1/runs/{waiting}").json()["status"] == "waiting_approval"

                # Only the owner answers it, once; the answer puts the run back on the queue.
                answer = {"approved": True}
                assert bob.post(f"/v1/approvals/{approval}", json=answer).status_code == 404
                assert alice.post("/v1/approvals/nothing", json=answer).status_code == 404
                answered = alice.post(f"/v1/approvals/{approval}", json=answer)
                assert answered.json() == {
                    "approval_id": approval,
                    "approved": True,
                    "reason": "approved by alice",
                }
                assert alice.post(f"/v1/approvals/{approval}", json=answer).status_code == 409

                # The same stream goes on: the resumed run's events, then its result.
                rest = list(frames)
            assert rest[-1]["event"] == "result", [f["event"] for f in rest]
            result = rest[-1]["data"]["result"]
            assert result["output"] == "done a after 1 steps; user turns seen: 1"
            assert result["approvals"][0]["approved"] is True
            assert _executions(c, "a") == 1
            state = alice.get(f"/v1/runs/{waiting}").json()
            assert (state["status"], state["attempts"]) == ("completed", 2)

            # Denied: the call never runs, and the model is told it was refused and why.
            denied = alice.post(
                "/v1/runs", json={"message": "job d steps=1", "session_id": "sd"}
            ).json()["request_id"]
            pending = _until(alice, denied, "waiting_approval")["pending_approvals"]
            no = {"approved": False, "reason": "not today"}
            assert (
                alice.post(f"/v1/approvals/{pending[0]['approval_id']}", json=no).status_code == 200
            )
            result = _until(alice, denied, "completed")["result"]
            assert result["output"] == "done d after 1 steps; user turns seen: 1"
            assert result["tool_calls"][0]["status_code"] == 403
            assert "not today" in result["tool_calls"][0]["error"]
            assert _executions(c, "d") == 0
            messages = alice.get("/v1/sessions/sd").json()["messages"]
            told = [json.dumps(m["tool_results"]) for m in messages if m["role"] == "tool"]
            assert len(told) == 1 and "was denied (not today)" in told[0], told
        assert worker.poll() is None  # one worker did it all
