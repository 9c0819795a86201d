"""Scale-out with real Celery workers, Redis or RabbitMQ, and PostgreSQL: runs survive a worker
killed with SIGKILL, each tool call takes effect exactly once, and the turns of one session
never interleave."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from hermes_agent import build_agent
from hermes_agent.worker import submit
from hermes_agent.worker.store import RunStore
from server_harness import wait_for
from step_model import running_step_model
from worker_harness import RABBITMQ, REDIS, cluster, free_port, wait_finished

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("broker", [REDIS, RABBITMQ], ids=["redis", "rabbitmq"])
def test_sixty_runs_survive_a_killed_worker(tmp_path: Path, pg_url: str, broker: str) -> None:
    requests: Counter[str] = Counter()
    with (
        running_step_model(free_port(), latency=0.05, seen=requests) as model_url,
        cluster(tmp_path, pg_url, broker, model_url, lease_ttl=2.0, step_sleep=0.05) as c,
    ):
        for _ in range(3):
            c.start_worker(concurrency=4)
        c.wait_ready()
        submitter = build_agent(tmp_path / "config.yaml")
        try:
            # 20 sessions × 3 runs: a session's runs go one after the other, in order.
            handles = [
                submit(submitter, f"job j{i} steps=3", session_id=f"s{i % 20}") for i in range(60)
            ]
            store = RunStore(submitter.storage)  # type: ignore[arg-type]
            ids = [h.request_id for h in handles]

            def busy_holder() -> int | None:
                running = [store.get(rid) for rid in ids]
                holders = Counter(
                    r.lease_owner for r in running if r is not None and r.status == "running"
                )
                done = sum(1 for r in running if r is not None and r.status == "completed")
                if done >= 6 and holders:
                    owner, held = holders.most_common(1)[0]
                    if held >= 2:
                        return int(str(owner).rsplit(":", 1)[1])
                return None

            # Kill the worker holding the most runs once every worker is busy mid-run.
            victim_pid: int = wait_for(
                busy_holder, 60, "a worker holding two runs once six had completed", pace=0.05
            )
            victim = next(p for p in c.workers if p.pid == victim_pid)
            # Frozen first, so that none of its runs can end while the runs it holds are read.
            os.killpg(victim.pid, signal.SIGSTOP)
            killed_runs = {
                rid
                for rid in ids
                if (s := store.get(rid)) is not None
                and s.lease_owner
                and s.lease_owner.endswith(f":{victim_pid}")
                and s.status == "running"
            }
            c.kill(victim)
            wait_finished(store, ids, timeout=120)

            states = {rid: store.get(rid) for rid in ids}
            assert {s.status for s in states.values() if s} == {"completed"}, {
                rid: (s.status, s.error)
                for rid, s in states.items()
                if s and s.status != "completed"
            }
            for i, handle in enumerate(handles):
                result = handle.result(timeout=1)
                assert result.output.startswith(f"done j{i} after 3 steps"), result.output

            # Every call took effect exactly once; count executions too.
            with c.effects_db() as conn:
                effects = conn.execute("SELECT tag, n, call_key FROM effects").fetchall()
                executions = Counter(
                    row[0] for row in conn.execute("SELECT call_key FROM executions")
                )
            assert len(effects) == 180
            assert Counter((tag, n) for tag, n, _ in effects) == {
                (f"j{i}", n): 1 for i in range(60) for n in (1, 2, 3)
            }
            by_tag = {f"j{i}": ids[i] for i in range(60)}
            for tag, n, call_key in effects:
                assert call_key == f"{by_tag[tag]}/{n - 1}/0"  # request / step / index
            rerun = {key for key, count in executions.items() if count > 1}
            # (Runs the victim took between the snapshot above and the kill were resumed too.)
            resumed = {rid for rid in ids if states[rid] and states[rid].claims > 1}  # type: ignore[union-attr]
            assert all(key.split("/")[0] in resumed for key in rerun)

            # The killed runs were taken over and resumed where they stopped (a run the victim
            # held a moment before the kill may have finished just in time).
            killed_runs &= resumed
            assert killed_runs
            storage = submitter.storage
            assert storage is not None
            from_steps = []
            for rid in killed_runs:
                records = storage.records(rid)
                marks = [json.loads(r.content) for r in records if r.role == "resumed"]
                assert marks and marks[0]["takeover"] is True
                from_steps.append(marks[0]["from_step"])
                # No stage of a step is in the trail twice.
                stages = Counter((r.step, r.stage, r.role) for r in records)
                assert max(stages.values()) == 1, stages
            # Model calls already made were not made again: 4 per run (3 steps + the answer),
            # give or take the one a kill caught between the answer and its journal entry.
            for i in range(60):
                rid = ids[i]
                if rid in resumed:
                    assert 4 <= requests[f"j{i}"] <= 5, requests[f"j{i}"]
                else:
                    assert requests[f"j{i}"] == 4, (f"j{i}", requests[f"j{i}"])
            # Each session's history is whole and in order: three turns, each seeing the last.
            sessions = submitter.storage.sessions  # type: ignore[union-attr]
            for s in range(20):
                history = sessions.load(f"s{s}")
                users = [m.content for m in history if m.role == "user"]
                assert users == [f"job j{i} steps=3" for i in range(s, 60, 20)]
                answers = [m.content for m in history if m.role == "assistant" and m.content]
                assert [a.rsplit(": ", 1)[1] for a in answers] == ["1", "2", "3"]
            print(
                f"\n{broker.split(':')[0]}: killed pid {victim_pid} holding {len(killed_runs)} "
                f"runs (resumed from steps {sorted(from_steps)}); calls re-run under their "
                f"idempotency key: {len(rerun)}; all 60 completed, 180 effects"
            )
        finally:
            submitter.close()


def test_two_runs_of_one_session_on_two_workers_take_turns(tmp_path: Path, pg_url: str) -> None:
    with (
        running_step_model(free_port(), latency=0.2) as model_url,
        cluster(tmp_path, pg_url, REDIS, model_url, step_sleep=0.2) as c,
    ):
        c.start_worker(concurrency=1)
        c.start_worker(concurrency=1)
        c.wait_ready()
        submitter = build_agent(tmp_path / "config.yaml")
        try:
            first = submit(submitter, "job a steps=2", session_id="shared")
            second = submit(submitter, "job b steps=2", session_id="shared")
            assert first.result(timeout=60).output.endswith("user turns seen: 1")
            assert second.result(timeout=60).output.endswith("user turns seen: 2")
            with c.effects_db() as conn:
                rows = conn.execute("SELECT tag, at, pid FROM executions ORDER BY at").fetchall()
            assert [tag for tag, _, _ in rows] == ["a", "a", "b", "b"]
            # The second run's first delivery went to the other worker, which set it aside
            # until the first run's turn was saved.
            logs = c.log(0) + c.log(1)
            assert f"run {second.request_id}: parked" in logs
            # Celery's line per task, but none per model request from the HTTP client.
            assert "succeeded in" in logs and "HTTP Request:" not in logs
            history = submitter.storage.sessions.load("shared")  # type: ignore[union-attr]
            assert [m.content for m in history if m.role == "user"] == [
                "job a steps=2",
                "job b steps=2",
            ]
        finally:
            submitter.close()


@contextmanager
def celery_events(queue_name: str) -> Iterator[list[dict[str, object]]]:
    """The Celery events on the test broker while the block runs (what Flower would see)."""
    import threading

    from hermes_agent.config import QueueConfig
    from hermes_agent.worker.app import make_celery

    events: list[dict[str, object]] = []
    app = make_celery(QueueConfig(broker=REDIS, queue_name=queue_name))
    connection = app.connection_for_read()
    receiver = app.events.Receiver(connection, handlers={"*": events.append})
    listening = threading.Thread(
        target=lambda: receiver.capture(limit=None, timeout=None, wakeup=True), daemon=True
    )
    listening.start()
    try:
        yield events
    finally:
        receiver.should_stop = True
        listening.join(timeout=5)
        connection.release()


def test_celery_events_dead_letter_and_requeue_by_an_operator(tmp_path: Path, pg_url: str) -> None:
    """Workers with ``queue.task_events: true`` send Celery's task events (what Flower shows)
    from the start; a run lost with its worker more than
    max_redeliveries times is dead-lettered; `hermes-agent runs requeue` puts it back."""
    from typer.testing import CliRunner

    from hermes_agent.cli.app import app as cli

    with (
        running_step_model(free_port(), latency=0.05) as model_url,
        cluster(
            tmp_path,
            pg_url,
            REDIS,
            model_url,
            lease_ttl=1.0,
            step_sleep=2.0,
            max_redeliveries=0,
            task_events=True,
        ) as c,
    ):
        with celery_events(c.queue_name) as events:
            doomed = c.start_worker(concurrency=1)
            c.wait_ready()
            submitter = build_agent(tmp_path / "config.yaml")
            try:
                handle = submit(submitter, "job d steps=1", session_id="dl")
                wait_for(lambda: handle.status() == "running", 30, "the run running")

                def started() -> int:  # the two-second tool records its start, then sleeps
                    with c.effects_db() as conn:
                        row = conn.execute("SELECT count(*) FROM executions").fetchone()
                    return int(row[0]) if row else 0

                wait_for(started, 30, "the tool started")
                c.kill(doomed)  # inside the tool
                c.start_worker(concurrency=1)  # its sweeper finds the run, which is dead
                c.wait_ready()
                wait_for(lambda: handle.status() == "dead", 30, "the run dead-lettered")
                assert "dead-lettered" in (handle.state().error or "")
                config = str(tmp_path / "config.yaml")
                runner = CliRunner()
                listed = runner.invoke(
                    cli, ["runs", "list", "--config", config, "--status", "dead", "--json"]
                )
                assert listed.exit_code == 0, listed.output
                assert json.loads(listed.output.splitlines()[0])["request_id"] == handle.request_id
                requeued = runner.invoke(
                    cli, ["runs", "requeue", handle.request_id, "--config", config]
                )
                assert requeued.exit_code == 0, requeued.output
                assert f"requeued {handle.request_id}" in requeued.output
                result = handle.result(timeout=60)
                assert result.output.startswith("done d after 1 steps")
                # The step had started when its worker died: being idempotent, it ran again under
                # the same call id, and took effect once.
                assert result.tool_calls[0].status_code == 200
                with c.effects_db() as conn:
                    runs_of_call = conn.execute("SELECT call_key FROM executions").fetchall()
                    effects = conn.execute("SELECT call_key FROM effects").fetchall()
                assert [row[0] for row in runs_of_call] == [f"{handle.request_id}/0/0"] * 2
                assert [row[0] for row in effects] == [f"{handle.request_id}/0/0"]
                refused = runner.invoke(
                    cli, ["runs", "requeue", handle.request_id, "--config", config]
                )
                assert (
                    refused.exit_code != 0
                    and "is completed; only a dead, failed, cancelled" in (refused.output)
                )
            finally:
                submitter.close()
        kinds = {str(e.get("type")) for e in events}
        assert {"worker-online", "worker-heartbeat", "task-received", "task-succeeded"} <= kinds
        names = {e.get("name") for e in events if e.get("type") == "task-received"}
        assert names == {"hermes_agent.run"}


def test_task_events_off_leave_the_runs_out_of_the_event_stream(
    tmp_path: Path, pg_url: str
) -> None:
    """``queue.task_events: false`` (the default): neither the worker nor the submitter
    publishes a task event (sent, received, started, succeeded); the worker's own (online,
    heartbeats) go on, so Flower still lists it, and Flower's ``enable_events`` turns the task
    events on while it watches. Turned on in the config, they are the test above."""
    with (
        running_step_model(free_port(), latency=0.01) as model_url,
        cluster(tmp_path, pg_url, REDIS, model_url) as c,
        celery_events(c.queue_name) as events,
    ):

        def ours() -> set[str]:
            prefix = f"w0-{c.queue_name}@"
            return {str(e.get("type")) for e in events if str(e.get("hostname")).startswith(prefix)}

        c.start_worker(concurrency=1)
        c.wait_ready()
        submitter = build_agent(tmp_path / "config.yaml")
        try:
            result = submit(submitter, "job q steps=1", session_id="quiet").result(timeout=60)
            assert result.output.startswith("done q after 1 steps")
        finally:
            submitter.close()
        # Its heartbeats: the receiver hears the worker.
        wait_for(lambda: "worker-heartbeat" in ours(), 10, "a worker heartbeat")
        assert ours() == {"worker-online", "worker-heartbeat"}
        assert not [e for e in events if str(e.get("type")).startswith("task-")]

        # Flower turns a worker's task events on by itself (its enable_events broadcast, every
        # few seconds while it runs): the runs show from then on, with nothing set here.
        from hermes_agent.config import QueueConfig
        from hermes_agent.worker.app import make_celery

        control = make_celery(QueueConfig(broker=REDIS, queue_name=c.queue_name)).control
        replies = control.enable_events(reply=True, timeout=5)
        assert any(f"w0-{c.queue_name}@" in name for reply in replies for name in reply)
        submitter = build_agent(tmp_path / "config.yaml")
        try:
            handle = submit(submitter, "job r steps=1", session_id="watched")
            assert handle.result(timeout=60).output.startswith("done r after 1 steps")
        finally:
            submitter.close()
        wait_for(lambda: "task-succeeded" in ours(), 10, "the task-succeeded event")
        assert {"task-received", "task-started", "task-succeeded"} <= ours()
        watched = {e.get("uuid") for e in events if e.get("type") == "task-received"}
        assert len(watched) == 1  # the second run's delivery only: the first went unseen
