"""The service over a real uvicorn on loopback: runs (JSON, SSE, reconnect, cancel, timeout),
sessions and traces through the store (SQLite and PostgreSQL, across a restart), approvals over
HTTP, limits, auth and isolation, health, metrics and access logs."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from hermes_agent.errors import ConfigError
from hermes_agent.runs.keys import MemoryKeyStore
from hermes_agent.server import ServiceSettings, create_app
from server_harness import (
    local,
    make_agent,
    pid_from,
    poll_run,
    process_gone,
    serve,
    sse_events,
    wait_for,
)
from storage_backends import sql_database_url  # noqa: F401  (the sql_url fixture)
from storage_backends import sqlite_url as sqlite


def test_a_run_round_trips_through_the_store_and_survives_a_restart(sql_url: str) -> None:
    with serve(create_app(agent=make_agent(sql_url), settings=local())) as url:
        client = httpx.Client(base_url=url, timeout=30)
        reply = client.post("/v1/runs", json={"message": "hello", "session_id": "s1"})
        assert reply.status_code == 200, reply.text
        result = reply.json()
        assert result["output"] == "Hello!"
        assert result["session_id"] == "s1"
        request_id = result["request_id"]
        status = client.get(f"/v1/runs/{request_id}").json()
        assert (status["status"], status["source"]) == ("completed", "memory")
        assert status["result"]["output"] == "Hello!"
        listed = client.get("/v1/runs", params={"session_id": "s1"}).json()["runs"]
        assert [r["request_id"] for r in listed] == [request_id]

    # A new process on the same store: the run, its session and trace come from the store.
    with serve(create_app(agent=make_agent(sql_url), settings=local())) as url:
        client = httpx.Client(base_url=url, timeout=30)
        status = client.get(f"/v1/runs/{request_id}").json()
        assert status["source"] == "store"
        assert (status["status"], status["output"]) == ("completed", "Hello!")
        assert status["session_id"] == "s1"
        assert (
            client.get("/v1/runs", params={"status": "completed"}).json()["runs"][0]["request_id"]
            == request_id
        )
        sessions = client.get("/v1/sessions").json()["sessions"]
        assert [s["id"] for s in sessions] == ["s1"]
        shown = client.get("/v1/sessions/s1").json()
        assert [m["role"] for m in shown["messages"]] == ["user", "assistant"]
        assert shown["runs"] == [request_id]
        trace = client.get(f"/v1/runs/{request_id}/trace").json()["records"]
        assert [r["stage"] for r in trace[:2]] == ["RunManager", "InputParser"]
        assert trace[-1]["stage"] == "OutputRenderer"
        assert {r["session_id"] for r in trace} == {"s1"}
        lines = client.get(f"/v1/runs/{request_id}/trace.jsonl").text.splitlines()
        assert len(lines) == len(trace)
        assert json.loads(lines[0])["request_id"] == request_id
        assert client.delete("/v1/sessions/s1").status_code == 204
        assert client.get("/v1/sessions/s1").json()["messages"] == []
        assert client.get("/v1/runs/no-such-run").status_code == 404
        assert client.delete("/v1/sessions/never").status_code == 404


def test_a_stream_sends_typed_events_and_a_dropped_client_gets_every_missed_one(
    tmp_path: Path,
) -> None:
    settings = local(keepalive_s=0.2)
    with serve(create_app(agent=make_agent(sqlite(tmp_path)), settings=settings)) as url:
        client = httpx.Client(base_url=url, timeout=30)
        seen: list[dict[str, Any]] = []
        with client.stream("POST", "/v1/runs", json={"message": "slow", "stream": True}) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            assert r.headers["x-accel-buffering"] == "no"
            assert r.headers["cache-control"] == "no-cache"
            for frame in sse_events(r.iter_lines()):
                if "comment" in frame:
                    continue
                seen.append(frame)
                if frame["event"] == "selection":  # the 1 s tool is about to run: drop
                    break
        assert seen[0]["event"] == "input"
        assert all(f["event"] == f["data"]["kind"] for f in seen)
        request_id = seen[0]["data"]["request_id"]
        last = seen[-1]["id"]
        poll_run(client, request_id)  # the run goes on to its end without anyone listening
        rest: list[dict[str, Any]] = []
        comments = 0
        headers = {"Last-Event-ID": last}
        with client.stream("GET", f"/v1/runs/{request_id}/events", headers=headers) as r:
            for frame in sse_events(r.iter_lines()):
                if "comment" in frame:
                    comments += 1
                else:
                    rest.append(frame)
        ids = [int(f["id"]) for f in seen + rest]
        assert ids == list(range(1, len(ids) + 1))  # nothing lost, nothing twice
        assert rest[-1]["event"] == "result"
        assert rest[-1]["data"]["result"]["output"].startswith("done")
        results = next(f for f in seen + rest if f["event"] == "tool_results")
        assert results["data"]["results"][0]["content"]["data"] == "waited"
        assert "output" in [f["event"] for f in rest]
        # A stream that waits long enough gets keep-alive comments.
        with client.stream("POST", "/v1/runs", json={"message": "slow", "stream": True}) as r:
            comments = sum(1 for f in sse_events(r.iter_lines()) if "comment" in f)
        assert comments >= 2


def _counting_calls(agent: Any) -> list[str]:
    """Which model call (``complete`` or ``stream``) each turn of ``agent`` makes, in order."""
    asked: list[str] = []
    model = agent.model
    complete, stream = model.complete, model.stream

    async def whole(*args: Any, **kwargs: Any) -> Any:
        asked.append("complete")
        return await complete(*args, **kwargs)

    def pieces(*args: Any, **kwargs: Any) -> Any:
        asked.append("stream")
        return stream(*args, **kwargs)

    model.complete, model.stream = whole, pieces
    return asked


PIECES = ("_delta", "tool_call_")  # the kinds of events that carry the reply piece by piece


def test_a_plain_post_asks_the_model_whole_and_a_streamed_one_gets_the_pieces(
    tmp_path: Path,
) -> None:
    """The model's reply streams (delta events) only while someone reads the run's events; a
    plain POST nobody follows gets the same stages' events, and asks for the reply whole."""
    agent = make_agent(sqlite(tmp_path))
    asked = _counting_calls(agent)
    with serve(create_app(agent=agent, settings=local())) as url:
        client = httpx.Client(base_url=url, timeout=30)
        plain = client.post("/v1/runs", json={"message": "slow"})
        assert plain.status_code == 200, plain.text
        with client.stream("GET", f"/v1/runs/{plain.json()['request_id']}/events") as r:
            kinds = [f["event"] for f in sse_events(r.iter_lines()) if "event" in f]
        assert asked == ["complete", "complete"]
        assert not [k for k in kinds if k.endswith(PIECES[0]) or k.startswith(PIECES[1])]
        assert {"input", "thought", "selection", "tool_results", "output", "result"} <= set(kinds)

        asked.clear()
        with client.stream("POST", "/v1/runs", json={"message": "slow", "stream": True}) as r:
            streamed = [f["event"] for f in sse_events(r.iter_lines()) if "event" in f]
        assert asked == ["stream", "stream"]
        assert {"text_delta", "tool_call_started", "tool_call_parsed"} <= set(streamed)
        assert set(kinds) <= set(streamed)


def test_a_plain_post_wakes_at_its_runs_milestones_not_at_each_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain POST waits for its run's end or a pending approval, and is woken only then: each
    wake resumes its whole request (route, middleware), and a run emits a dozen events. The
    approval still ends the wait at once, after a slow tool's events came and went."""
    from hermes_agent.runs.local import Run

    wakes = {"milestone": 0, "changed": 0}
    milestone, changed = Run.milestone, Run.changed

    async def counting_milestone(run: Run) -> None:
        await milestone(run)
        wakes["milestone"] += 1

    async def counting_changed(run: Run) -> None:
        await changed(run)
        wakes["changed"] += 1

    monkeypatch.setattr(Run, "milestone", counting_milestone)
    monkeypatch.setattr(Run, "changed", counting_changed)
    keys = MemoryKeyStore()
    alice = {"Authorization": f"Bearer {keys.create('alice')}"}
    with serve(_approval_app(tmp_path, keys, approval_timeout_s=30)) as url:
        client = httpx.Client(base_url=url, timeout=30, headers=alice)
        plain = client.post("/v1/runs", json={"message": "slow"})
        assert plain.status_code == 200, plain.text
        with client.stream("GET", f"/v1/runs/{plain.json()['request_id']}/events") as r:
            events = [f for f in sse_events(r.iter_lines()) if "event" in f]
        assert len(events) >= 6  # input, thoughts, selection, tool results, output, result
        assert wakes["milestone"] == 1  # the run's end, and nothing before
        assert wakes["changed"] == 0  # nobody streamed it while it ran

        wakes["milestone"] = 0
        reply = client.post("/v1/runs", json={"message": "slow delete /tmp/z"})
        assert reply.status_code == 202, reply.text  # back as soon as the approval is asked
        (pending,) = reply.json()["pending_approvals"]
        assert wakes["milestone"] == 1
        answer = client.post(f"/v1/approvals/{pending['approval_id']}", json={"approved": True})
        assert answer.status_code == 200
        result = poll_run(client, reply.json()["request_id"])["result"]
        assert [c["status_code"] for c in result["tool_calls"]] == [200, 200]


def test_a_client_that_follows_a_run_midway_gets_the_pieces_of_its_next_turns(
    tmp_path: Path,
) -> None:
    """A run started without a stream (``Prefer: respond-async``) streams its model turns from
    the moment someone follows its events: the turn after the follower came is streamed."""
    agent = make_agent(sqlite(tmp_path))
    asked = _counting_calls(agent)
    with serve(create_app(agent=agent, settings=local())) as url:
        client = httpx.Client(base_url=url, timeout=30)
        started = client.post(
            "/v1/runs", json={"message": "slow"}, headers={"Prefer": "respond-async"}
        )
        assert started.status_code == 202, started.text
        rid = started.json()["request_id"]
        with client.stream("GET", f"/v1/runs/{rid}/events") as r:  # during its 1 s tool call
            kinds = [f["event"] for f in sse_events(r.iter_lines()) if "event" in f]
        # The first turn may have started before the follower came, or after: either way, the
        # turn that starts while it follows (after the 1 s tool call) is streamed.
        assert len(asked) == 2 and asked[1] == "stream", asked
        assert "text_delta" in kinds
        first_delta = kinds.index("text_delta")
        assert kinds.index("tool_results") < first_delta < kinds.index("output")
        assert client.get(f"/v1/runs/{rid}").json()["result"]["output"].startswith("done:")


def _start_nap(client: httpx.Client, pid_file: Path) -> str:
    with client.stream(
        "POST", "/v1/runs", json={"message": f"nap {pid_file}", "stream": True}
    ) as r:
        first = next(f for f in sse_events(r.iter_lines()) if "data" in f)
    request_id: str = first["data"]["request_id"]
    return request_id


def test_cancel_stops_a_run_whose_tool_is_sleeping(tmp_path: Path) -> None:
    pid_file = tmp_path / "sleeper.pid"
    with serve(create_app(agent=make_agent(sqlite(tmp_path)), settings=local())) as url:
        client = httpx.Client(base_url=url, timeout=30)
        request_id = _start_nap(client, pid_file)
        pid_from(pid_file)  # the tool is running
        started = time.monotonic()
        answer = client.post(f"/v1/runs/{request_id}/cancel").json()
        assert answer == {"request_id": request_id, "cancelled": True, "status": "cancelled"}
        assert time.monotonic() - started < 5
        assert client.get(f"/v1/runs/{request_id}").json()["status"] == "cancelled"
        with client.stream("GET", f"/v1/runs/{request_id}/events") as r:
            frames = [f for f in sse_events(r.iter_lines()) if "data" in f]
        assert frames[-1]["event"] == "run_stopped"
        assert frames[-1]["data"]["status"] == "cancelled"
        assert client.post(f"/v1/runs/{request_id}/cancel").json()["cancelled"] is False
        assert client.post("/v1/runs/nope/cancel").status_code == 404


def test_cancel_kills_the_sleeping_subprocess_of_a_tool(tmp_path: Path) -> None:
    pid_file = tmp_path / "sleeper.pid"
    with serve(create_app(agent=make_agent(sqlite(tmp_path)), settings=local())) as url:
        client = httpx.Client(base_url=url, timeout=30)
        request_id = _start_nap(client, pid_file)
        sleeper = pid_from(pid_file)
        client.post(f"/v1/runs/{request_id}/cancel")
        wait_for(lambda: process_gone(sleeper), 5, "the sleeper killed with its run")


def test_a_run_past_its_wall_clock_limit_is_stopped(tmp_path: Path) -> None:
    settings = local(run_timeout_s=0.3)
    with serve(create_app(agent=make_agent(sqlite(tmp_path)), settings=settings)) as url:
        reply = httpx.post(f"{url}/v1/runs", json={"message": "slow"}, timeout=30)
        assert reply.status_code == 504
        assert reply.json()["status"] == "timed_out"
        assert "run_timeout_s" in reply.json()["error"]


def _approval_app(tmp_path: Path, keys: MemoryKeyStore, **overrides: Any) -> Any:
    settings = ServiceSettings(auth="keys", approval_policy="wait", **overrides)
    return create_app(agent=make_agent(sqlite(tmp_path)), settings=settings, keys=keys)


def test_approvals_over_http_approve_deny_expire_single_use_and_owner_only(
    tmp_path: Path,
) -> None:
    keys = MemoryKeyStore()
    alice = {"Authorization": f"Bearer {keys.create('alice')}"}
    bob = {"Authorization": f"Bearer {keys.create('bob')}"}
    with serve(_approval_app(tmp_path, keys, approval_timeout_s=1.0)) as url:
        client = httpx.Client(base_url=url, timeout=30, headers=alice)
        outcomes = {}
        for approved in (True, False):
            reply = client.post("/v1/runs", json={"message": "delete /tmp/report.txt"})
            assert reply.status_code == 202, reply.text
            body = reply.json()
            (pending,) = body["pending_approvals"]
            assert (pending["tool"], pending["arguments"]) == (
                "delete_file",
                {"path": "/tmp/report.txt"},
            )
            assert pending["request_id"] == body["request_id"]
            answer_url = f"/v1/approvals/{pending['approval_id']}"
            assert client.post(answer_url, json={"approved": True}, headers=bob).status_code == 404
            answer = client.post(answer_url, json={"approved": approved, "reason": "checked"})
            assert answer.status_code == 200
            again = client.post(answer_url, json={"approved": True})
            assert again.status_code == 409
            outcomes[approved] = poll_run(client, body["request_id"])["result"]
        assert outcomes[True]["tool_calls"][0]["status_code"] == 200
        assert outcomes[True]["approvals"][0]["approved"] is True
        assert outcomes[False]["tool_calls"][0]["status_code"] == 403
        assert outcomes[False]["approvals"][0]["reason"] == "checked"
        assert client.post("/v1/approvals/nope", json={"approved": True}).status_code == 404

        # Nobody answers: the approval expires as a denial, and a late answer is refused.
        body = client.post("/v1/runs", json={"message": "delete /tmp/x"}).json()
        approval_id = body["pending_approvals"][0]["approval_id"]
        result = poll_run(client, body["request_id"])["result"]
        assert result["approvals"][0]["reason"] == "expired"
        assert result["tool_calls"][0]["status_code"] == 403
        late = client.post(f"/v1/approvals/{approval_id}", json={"approved": True})
        assert late.status_code == 409


def test_with_policy_deny_an_approval_nobody_listens_for_is_denied_at_once(
    tmp_path: Path,
) -> None:
    settings = local(approval_policy="deny", approval_timeout_s=60)
    with serve(create_app(agent=make_agent(sqlite(tmp_path)), settings=settings)) as url:
        client = httpx.Client(base_url=url, timeout=30)
        with client.stream(
            "POST", "/v1/runs", json={"message": "slow delete /tmp/y", "stream": True}
        ) as r:
            first = next(f for f in sse_events(r.iter_lines()) if "data" in f)
        started = time.monotonic()
        result = poll_run(client, first["data"]["request_id"])["result"]
        assert time.monotonic() - started < 10
        assert "nobody was listening" in result["approvals"][0]["reason"]
        assert result["tool_calls"][-1]["status_code"] == 403


def test_keys_scope_everything_to_its_owner(tmp_path: Path) -> None:
    keys = MemoryKeyStore()
    alice = {"Authorization": f"Bearer {keys.create('alice')}"}
    bob = {"Authorization": f"Bearer {keys.create('bob')}"}
    app = create_app(
        agent=make_agent(sqlite(tmp_path)), settings=ServiceSettings(auth="keys"), keys=keys
    )
    with serve(app) as url:
        client = httpx.Client(base_url=url, timeout=30)
        assert client.post("/v1/runs", json={"message": "hello"}).status_code == 401
        wrong = {"Authorization": "Bearer hk_0123456789abcdef.not-the-right-secret-at-all"}
        assert client.get("/v1/sessions", headers=wrong).status_code == 401
        result = client.post(
            "/v1/runs", json={"message": "hello", "session_id": "shared"}, headers=alice
        ).json()
        request_id = result["request_id"]
        for path in (
            f"/v1/runs/{request_id}",
            f"/v1/runs/{request_id}/trace",
            f"/v1/runs/{request_id}/trace.jsonl",
            f"/v1/runs/{request_id}/events",
            "/v1/sessions/shared",
        ):
            assert client.get(path, headers=bob).status_code == 404, path
            assert client.get(path, headers=alice).status_code == 200, path
        assert client.post(f"/v1/runs/{request_id}/cancel", headers=bob).status_code == 404
        assert client.delete("/v1/sessions/shared", headers=bob).status_code == 404
        assert client.get("/v1/sessions", headers=bob).json()["sessions"] == []
        assert client.get("/v1/runs", headers=bob).json()["runs"] == []
        # Bob's session of the same name is his own conversation.
        client.post("/v1/runs", json={"message": "hello", "session_id": "shared"}, headers=bob)
        bobs = client.get("/v1/sessions/shared", headers=bob).json()
        assert len(bobs["messages"]) == 2
        assert len(client.get("/v1/sessions/shared", headers=alice).json()["messages"]) == 2


def test_the_caller_is_known_on_the_loop_without_keys_and_off_it_with_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``auth: none`` reads nothing to know the caller, so no thread hop per request; a key is
    looked up in its store, which may wait on a database, so never on the event loop."""
    import asyncio

    from hermes_agent.server import auth

    on_loop: list[bool] = []
    known = auth.current_user

    def noting(request: Any) -> Any:
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(False)
        return known(request)

    monkeypatch.setattr(auth, "current_user", noting)
    with serve(create_app(agent=make_agent(sqlite(tmp_path)), settings=local())) as url:
        assert httpx.post(f"{url}/v1/runs", json={"message": "hello"}).status_code == 200
    assert on_loop == [True]

    on_loop.clear()
    keys = MemoryKeyStore()
    key = keys.create("alice")
    settings = ServiceSettings(auth="keys")
    app = create_app(agent=make_agent(sqlite(tmp_path)), settings=settings, keys=keys)
    with serve(app) as url:
        asked = httpx.post(
            f"{url}/v1/runs",
            json={"message": "hello"},
            headers={"Authorization": f"Bearer {key}"},
        )
        assert asked.status_code == 200
        assert httpx.post(f"{url}/v1/runs", json={"message": "hello"}).status_code == 401
    assert on_loop == [False, False]


def test_keys_are_stored_hashed_in_the_agents_database(tmp_path: Path) -> None:
    from hermes_agent.runs.keys import SqlKeyStore

    store = SqlKeyStore(sqlite(tmp_path))
    key = store.create("carol", admin=True)
    with store.engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT key_sha256, user_id FROM hermes_api_keys").all()
    assert key not in str(rows) and rows[0][1] == "carol"
    principal = store.lookup(key)
    assert principal is not None and (principal.user_id, principal.admin) == ("carol", True)
    assert store.lookup(key[:-1] + ("A" if key[-1] != "A" else "B")) is None
    assert store.revoke(store.list()[0].key_id)
    assert store.lookup(key) is None
    store.close()


def test_auth_none_is_refused_off_loopback() -> None:
    with pytest.raises(ConfigError, match="auth: none"):
        create_app(
            agent=make_agent("memory://"), settings=ServiceSettings(auth="none", host="0.0.0.0")
        )


def test_size_and_in_flight_limits(tmp_path: Path) -> None:
    settings = local(max_body_bytes=2000, max_message_chars=100, max_runs_in_flight_per_user=1)
    with serve(create_app(agent=make_agent(sqlite(tmp_path)), settings=settings)) as url:
        client = httpx.Client(base_url=url, timeout=30)
        big = client.post("/v1/runs", json={"message": "x" * 5000})
        assert big.status_code == 413 and "max_body_bytes" in big.json()["detail"]
        long = client.post("/v1/runs", json={"message": "x" * 500})
        assert long.status_code == 413 and "max_message_chars" in long.json()["detail"]
        refused = client.post("/v1/runs", json={"message": "hello", "tool_choice": "nosuch"})
        assert refused.status_code == 422 and "tool_choice" in refused.json()["detail"]
        with client.stream("POST", "/v1/runs", json={"message": "slow", "stream": True}) as r:
            next(f for f in sse_events(r.iter_lines()) if "data" in f)
            busy = client.post("/v1/runs", json={"message": "hello"})
            assert busy.status_code == 429
            assert busy.headers["retry-after"] == "1"
            assert "runs in flight" in busy.json()["detail"]


def test_health_readiness_metrics_and_json_access_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="hermes_agent.server.access")
    with serve(create_app(agent=make_agent(sqlite(tmp_path)), settings=local())) as url:
        client = httpx.Client(base_url=url, timeout=30)
        assert client.get("/healthz").json() == {"status": "ok"}
        assert client.get("/readyz").json() == {"status": "ready"}
        reply = client.post("/v1/runs", json={"message": "slow"}, headers={"X-Request-ID": "abc-1"})
        assert reply.headers["x-request-id"] == "abc-1"
        text = client.get("/metrics").text
        assert 'hermes_runs_total{status="completed"} 1.0' in text
        assert 'hermes_tool_calls_total{status="200"} 1.0' in text
        assert 'hermes_stage_latency_seconds_count{stage="execution"} 1.0' in text
        assert "hermes_runs_in_flight 0.0" in text
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name.endswith("access")]
    posted = next(line for line in lines if line["request_id"] == "abc-1")
    assert (posted["method"], posted["path"], posted["status"]) == ("POST", "/v1/runs", 200)
    assert posted["user"] == "local" and posted["duration_ms"] > 0


def test_shutdown_cancels_runs_past_the_grace_period_and_flushes(tmp_path: Path) -> None:
    pid_file = tmp_path / "sleeper.pid"
    app = create_app(agent=make_agent(sqlite(tmp_path)), settings=local(shutdown_grace_s=0.2))
    with serve(app) as url:
        client = httpx.Client(base_url=url, timeout=30)
        request_id = _start_nap(client, pid_file)
        pid_from(pid_file)
    run = app.state.manager.runs[request_id]
    assert run.status == "cancelled" and "shut down" in run.error
    records = make_agent(sqlite(tmp_path)).storage.records(run.id)
    assert [(r.stage, r.role) for r in records[:2]] == [
        ("RunManager", "accepted"),  # the service's first record, before anything ran
        ("InputParser", "user"),
    ]
