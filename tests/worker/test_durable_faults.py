"""Durable runs under faults, with real processes: `hermes-agent worker` processes on a
PostgreSQL the test starts itself (restarted with -m fast and -m immediate), behind a TCP proxy
of the test's own (connections reset, then stalled), a worker frozen with SIGSTOP inside a tool
call past its lease, and a model endpoint that answers 500, resets, hangs and drips.

For each fault the test counts runs submitted / completed / failed (with reasons) / lost, and
holds the goals of issue 24 at zero: completed runs whose answer is an error, trails without
exactly one ending (last, matching the run's status), sessions holding an error turn, runs past
their deadline, and tool effects after a lost lease.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fault_harness import (
    FaultCluster,
    FaultModel,
    FaultProxy,
    OwnPostgres,
    Tally,
    tally,
)
from server_harness import wait_for
from worker_harness import REDIS, broker_up, wait_finished

pytestmark = pytest.mark.timeout(150)

LEASE_TTL = 2.0
STALL_S = 20.0
"""The stall of every store connection (the issue's attack used 30 s; 20 s is ten leases)."""


class Env:
    def __init__(self, root: Path) -> None:
        from hermes_agent.config import QueueConfig
        from hermes_agent.storage.sql import SqlStorage
        from hermes_agent.worker.client import QueueClient

        self.pg = OwnPostgres()
        self.proxy = FaultProxy(self.pg.port)
        self.model = FaultModel()
        direct = f"postgresql+psycopg://postgres@127.0.0.1:{self.pg.port}/postgres"
        through = f"postgresql+psycopg://postgres@127.0.0.1:{self.proxy.port}/postgres"
        self.cluster = FaultCluster(
            root,
            through,
            REDIS,
            self.model.url,
            lease_ttl=LEASE_TTL,
            step_sleep=0.2,
            max_redeliveries=20,
            effects_url=direct.replace("postgresql+psycopg://", "postgresql://"),
        )
        self.cluster.write_config()
        self.storage = SqlStorage(direct)  # the test reads the store directly
        queue = QueueConfig(broker=REDIS, queue_name=self.cluster.queue_name, lease_ttl=LEASE_TTL)
        self.client = QueueClient(queue, self.storage)
        self.store = self.client.store
        self.cluster.prepare_tables()
        for _ in range(2):
            self.cluster.start_worker(concurrency=4)
        self.cluster.wait_ready()

    def submit(self, tags: list[str], *, sessions: int, timeout_s: float = 60.0) -> list[str]:
        ids = []
        for i, tag in enumerate(tags):
            handle = self.client.submit(
                f"job {tag} steps=3",
                session_id=f"{tag.split('-')[0]}-s{i % sessions}",
                run_timeout_s=timeout_s,
            )
            ids.append(handle.request_id)
        return ids

    def completed(self, ids: list[str]) -> int:
        done = 0
        for rid in ids:
            try:
                found = self.store.get(rid)
            except Exception:
                continue
            done += found is not None and found.status == "completed"
        return done

    def wait_until(self, ids: list[str], completed: int, timeout: float = 30.0) -> None:
        """Wait until ``completed`` of the runs have completed: the load the fault meets."""
        wait_for(
            lambda: self.completed(ids) >= completed,
            timeout,
            lambda: f"{completed} of {len(ids)} runs completed (so far {self.completed(ids)})",
            pace=0.05,
        )

    def finish(self, name: str, ids: list[str], timeout: float = 60.0) -> Tally:
        wait_finished(self.store, ids, timeout)
        found = tally(self.store, self.storage, ids)
        print("\n" + found.line(name))
        return found

    def close(self) -> None:
        self.cluster.stop()
        self.storage.close()
        self.model.close()
        self.proxy.close()
        self.pg.close()


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    if not OwnPostgres.available():
        pytest.skip("no PostgreSQL binaries to start a server of the test's own")
    if not broker_up(REDIS):
        pytest.skip(f"no broker at {REDIS}")
    made = Env(tmp_path_factory.mktemp("faults"))
    try:
        yield made
    finally:
        made.close()


def assert_goals(found: Tally, *, failed: int = 0) -> None:
    assert found.lost == 0, found.line("lost runs")
    assert found.error_answers == 0, found.line("error answers")
    assert found.bad_trails == [], found.bad_trails[:5]
    assert found.error_turns == 0, found.line("error turns")
    assert found.past_deadline == 0, found.line("past deadline")
    assert found.statuses["failed"] == failed, found.line("failed")


def _workers_healthy(env: Env) -> None:
    for index, process in enumerate(env.cluster.workers):
        assert process.poll() is None, env.cluster.log(index)


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_postgres_restarted_mid_load(env: Env, mode: str) -> None:
    ids = env.submit([f"pg{mode}{i}" for i in range(24)], sessions=8)
    env.wait_until(ids, 4)
    env.pg.restart(mode, down_s=1.5)
    found = env.finish(f"PostgreSQL restarted -m {mode}", ids)
    assert_goals(found)
    assert found.statuses["completed"] == 24
    _workers_healthy(env)


def test_store_connections_reset(env: Env) -> None:
    ids = env.submit([f"reset{i}" for i in range(24)], sessions=8)
    env.wait_until(ids, 3)
    resets = 0
    for _ in range(4):
        resets += env.proxy.reset()
        time.sleep(0.6)  # the faults' pace: four resets spread over the runs
    found = env.finish(f"store connections reset ({resets} connections, 4 times)", ids)
    assert resets > 0
    assert_goals(found)
    assert found.statuses["completed"] == 24


def test_store_stalled(env: Env) -> None:
    ids = env.submit([f"stall{i}" for i in range(16)], sessions=8)
    env.wait_until(ids, 2)
    env.proxy.stall(STALL_S)
    found = env.finish(f"store stalled {STALL_S:g} s", ids, timeout=60)
    assert_goals(found)
    assert found.statuses["completed"] == 16


def test_worker_frozen_inside_a_tool_call(env: Env) -> None:
    """SIGSTOP a worker while one of its runs is inside ``step`` (started, no effect yet),
    past its lease; the other worker takes its runs over; SIGCONT it. The frozen process's
    tool then wakes with an old token: the fence on the effect refuses it. A call can start with
    a lost lease only where the process stalled between the check before the call (a fenced
    journal write, then the local deadline) and the tool's first read: at most one per run taken
    over, and none of them has an effect."""
    ids = env.submit([f"frozen{i}" for i in range(12)], sessions=6)
    pids = {p.pid for p in env.cluster.workers}
    victim = None
    deadline = time.monotonic() + 20
    with env.cluster.effects_db() as conn:
        while victim is None and time.monotonic() < deadline:
            row = conn.execute(
                "SELECT e.pid, e.call_key FROM executions e "
                "LEFT JOIN effects f ON f.call_key = e.call_key "
                "WHERE f.call_key IS NULL AND e.tag LIKE 'frozen%%' "
                "AND e.at > clock_timestamp() - interval '0.08 second' LIMIT 1"
            ).fetchone()
            if row is not None and row[0] in pids:
                os.kill(row[0], signal.SIGSTOP)
                # Frozen: still inside that call (no effect yet)? Else it ran on meanwhile.
                landed = conn.execute(
                    "SELECT 1 FROM effects WHERE call_key = %s", (row[1],)
                ).fetchone()
                if landed is None:
                    victim = int(row[0])
                    break
                os.kill(row[0], signal.SIGCONT)
            time.sleep(0.01)  # the polling pace, bounded by the deadline above
        assert victim is not None, "no run was seen inside a tool call"
        frozen_at = time.monotonic()
        try:
            time.sleep(LEASE_TTL * 5)  # a measured freeze: well past the victim's lease
        finally:
            os.kill(victim, signal.SIGCONT)
            woke = time.time()
        found = env.finish(f"worker {victim} frozen {time.monotonic() - frozen_at:.1f} s", ids)
        tagged = "LIKE 'frozen%%'"
        stale = f"SELECT count(*) FROM executions WHERE tag {tagged} AND token <> held"
        # Started with a lease already lost: entered the tool after the worker woke, or
        # before the freeze (and read the lease only after waking).
        stale_starts = conn.execute(f"{stale} AND entered >= to_timestamp(%s)", (woke,)).fetchone()[
            0
        ]
        frozen_starts = conn.execute(f"{stale} AND entered < to_timestamp(%s)", (woke,)).fetchone()[
            0
        ]
        refused = conn.execute(
            "SELECT count(*) FROM refused r JOIN executions e ON e.call_key = r.call_key "
            f"AND e.token = r.token WHERE e.tag {tagged}"
        ).fetchone()[0]
        stale_effects = conn.execute(
            "SELECT count(*) FROM effects f WHERE f.tag LIKE 'frozen%%' AND f.token < "
            "(SELECT max(e.token) FROM executions e WHERE e.call_key = f.call_key)"
        ).fetchone()[0]
        effects = conn.execute("SELECT count(*) FROM effects WHERE tag LIKE 'frozen%%'").fetchone()[
            0
        ]
    taken_over = sum(1 for rid in ids if (r := env.store.get(rid)) is not None and r.claims > 1)
    print(
        f"frozen worker: runs taken over {taken_over}, "
        f"tool calls started after a lost lease {stale_starts} (entered before the freeze, "
        f"started after it {frozen_starts}), effects "
        f"landed with a stale token {stale_effects}, effects the token fence refused "
        f"{refused}, effects {effects} (36 calls)"
    )
    assert_goals(found)
    assert found.statuses["completed"] == 12
    assert taken_over >= 1  # the frozen worker's runs went to the other one
    # The check before a call and the tool's own first read of the lease are not one step: a
    # process frozen (or starved) in between starts a call whose lease is gone by then. No more
    # than one per run taken over, and the fence on the effect refuses each.
    assert stale_starts + frozen_starts <= taken_over
    assert stale_effects == 0
    assert effects == 36  # each call took effect once
    _workers_healthy(env)


def test_model_endpoint_faults(env: Env) -> None:
    """500s and resets fail the run (the model's failure, with its reason, never an answer);
    a request that hangs or drips a byte a second ends ``timed_out`` at the run's deadline,
    freeing its slot; ordinary runs beside them complete."""
    tags = (
        [f"ok-{i}" for i in range(6)]
        + [f"e500-{i}" for i in range(4)]
        + [f"reset-{i}" for i in range(4)]
        + [f"hang-{i}" for i in range(3)]
        + [f"drip-{i}" for i in range(3)]
    )
    started = time.monotonic()
    ids = env.submit(tags, sessions=20, timeout_s=5.0)
    found = env.finish("model endpoint: 500 / reset / hang / drip", ids, timeout=40)
    took = time.monotonic() - started
    by_tag = {tag: env.store.get(rid) for tag, rid in zip(tags, ids, strict=True)}
    assert_goals(found, failed=8)
    assert all(by_tag[t].status == "completed" for t in tags if t.startswith("ok-"))  # type: ignore[union-attr]
    assert all(
        by_tag[t].status == "timed_out"  # type: ignore[union-attr]
        for t in tags
        if t.startswith(("hang-", "drip-"))
    )
    assert found.statuses["timed_out"] == 6
    assert took < 30, took
    # The failed runs' errors name the model's failure.
    errors = [by_tag[t].error or "" for t in tags if t.startswith(("e500-", "reset-"))]  # type: ignore[union-attr]
    assert all(errors), errors
