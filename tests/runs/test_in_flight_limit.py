"""``max_runs_in_flight_per_user`` holds however many submits arrive at once.

Queued (``execution: queue``): the count of a user's runs queued or running and the insert of the
new run are one step in the store, so submits racing through two service instances on one
database (PostgreSQL with real workers, a SQLite file) never admit more than the limit; what
holds a place is the run's own row, so a run that ends — completed, cancelled — gives it back
and nothing can leak. In process: a run holds its place from the moment it is counted.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Connection

from hermes_agent.runs.gate import GateLimits, RunRejected
from hermes_agent.runs.keys import SqlKeyStore
from hermes_agent.runs.request import QueuedRequest
from hermes_agent.server import ServiceSettings, create_app
from hermes_agent.storage import open_storage
from hermes_agent.worker.backend import count_in_flight, lock_admissions
from hermes_agent.worker.store import RunStore
from server_harness import asking, await_for, serve, wait_for
from step_model import running_step_model
from storage_backends import _url
from worker_harness import REDIS, Cluster, broker_up, cluster, drop_queue, free_port

pytestmark = pytest.mark.timeout(240)

LIMIT = 8
SUBMITS = 12


def _key(db_url: str) -> str:
    store = SqlKeyStore(db_url)
    try:
        return store.create("alice")
    finally:
        store.close()


def _at_once(clients: list[httpx.Client], count: int, tag: str) -> list[httpx.Response]:
    """``count`` submits released together, spread over ``clients`` (one per instance)."""
    start = threading.Barrier(count)

    def submit(i: int) -> httpx.Response:
        start.wait(timeout=30)
        body = {"message": f"job {tag}{i} steps=1"}
        return clients[i % len(clients)].post("/v1/runs", json=body)

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(submit, range(count)))


def _admitted(answers: list[httpx.Response]) -> list[str]:
    refused = [a for a in answers if a.status_code != 202]
    assert all(a.status_code == 429 for a in refused), [a.text for a in refused]
    assert all("runs in flight" in a.json()["detail"] for a in refused)
    return [a.json()["request_id"] for a in answers if a.status_code == 202]


def _instances(
    stack: ExitStack, config: Path, settings: ServiceSettings, key: str, count: int = 2
) -> list[httpx.Client]:
    """``count`` service instances on one database, each with a client of alice's."""
    auth = {"Authorization": f"Bearer {key}"}
    clients = []
    for _ in range(count):
        url = stack.enter_context(serve(create_app(config, settings=settings)))
        clients.append(stack.enter_context(httpx.Client(base_url=url, headers=auth, timeout=60)))
    return clients


def _queued_settings() -> ServiceSettings:
    return ServiceSettings(
        execution="queue", auth="keys", keepalive_s=0.2, max_runs_in_flight_per_user=LIMIT
    )


def test_queued_submits_at_once_on_postgresql_admit_the_limit(tmp_path: Path, pg_url: str) -> None:
    """Twelve submits at once through two instances: eight queued, four 429; once they have
    run (completed) or were cancelled, eight more are admitted — the places came back."""
    key = _key(pg_url)
    with (
        running_step_model(free_port(), latency=0.02) as model_url,
        cluster(tmp_path, pg_url, REDIS, model_url, step_sleep=0.05) as c,
        ExitStack() as stack,
    ):
        clients = _instances(stack, tmp_path / "config.yaml", _queued_settings(), key)
        first = _admitted(_at_once(clients, SUBMITS, "a"))  # no worker yet: all stay queued
        assert len(first) == LIMIT
        clients[0].post(f"/v1/runs/{first[0]}/cancel").raise_for_status()
        c.start_worker(concurrency=4)
        c.wait_ready()
        store = RunStore(open_storage(pg_url))

        def left() -> str:
            states = [(rid, getattr(store.get(rid), "status", None)) for rid in first]
            return f"the first runs finished: {states}\n{c.log(0)}"

        try:
            wait_for(
                lambda: all((run := store.get(rid)) and run.finished for rid in first),
                90,
                left,
                pace=0.05,
            )
            statuses = {store.get(rid).status for rid in first}  # type: ignore[union-attr]
        finally:
            store.storage.close()
        assert statuses == {"completed", "cancelled"}
        again = _admitted(_at_once(clients, SUBMITS, "b"))
        assert len(again) == LIMIT


def test_queued_submits_at_once_on_one_sqlite_file_admit_the_limit(tmp_path: Path) -> None:
    """The same on one SQLite file (no worker: the runs stay queued until cancelled)."""
    if not broker_up(REDIS):
        pytest.skip(f"no broker at {REDIS}")
    db_url = f"sqlite:///{tmp_path / 'state.db'}"
    key = _key(db_url)
    made = Cluster(tmp_path, db_url, REDIS, "http://127.0.0.1:9/v1")
    config = made.write_config()
    try:
        with ExitStack() as stack:
            clients = _instances(stack, config, _queued_settings(), key)
            first = _admitted(_at_once(clients, SUBMITS, "a"))
            assert len(first) == LIMIT
            for i, rid in enumerate(first):  # each ends, through either instance
                clients[i % 2].post(f"/v1/runs/{rid}/cancel").raise_for_status()
            again = _admitted(_at_once(clients, SUBMITS, "b"))
            assert len(again) == LIMIT
    finally:
        drop_queue(REDIS, made.queue_name)


def test_in_process_submits_at_once_admit_the_limit(tmp_path: Path) -> None:
    """In process (runs in flight are the instance's own): twelve at once, eight admitted;
    after they all ended (completed, one cancelled), eight again."""
    db_url = f"sqlite:///{tmp_path / 'state.db'}"
    key = _key(db_url)
    with running_step_model(free_port(), latency=0.3) as model_url, ExitStack() as stack:
        made = Cluster(tmp_path, db_url, REDIS, model_url)
        config = made.write_config()
        settings = ServiceSettings(auth="keys", keepalive_s=0.2, max_runs_in_flight_per_user=LIMIT)
        (client,) = _instances(stack, config, settings, key, count=1)
        headers = {"Prefer": "respond-async"}
        client.headers.update(headers)
        first = _admitted(_at_once([client], SUBMITS, "a"))
        assert len(first) == LIMIT
        client.post(f"/v1/runs/{first[0]}/cancel").raise_for_status()
        wait_for(
            lambda: (
                not any(
                    client.get(f"/v1/runs/{rid}").json()["status"] in ("queued", "running")
                    for rid in first
                )
            ),
            60,
            "the first runs ending",
            pace=0.05,
        )
        again = _admitted(_at_once([client], SUBMITS, "b"))
        assert len(again) == LIMIT


# -- the atomic step itself, as a property ----------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def run_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RunStore]:
    for url in _url(request.param, tmp_path):
        store = RunStore(open_storage(url))
        try:
            yield store
        finally:
            store.storage.close()


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    limit=st.integers(min_value=1, max_value=4),
    before=st.integers(min_value=0, max_value=5),
    racing=st.integers(min_value=1, max_value=8),
)
def test_admission_and_count_are_one_step(
    run_store: RunStore, limit: int, before: int, racing: int
) -> None:
    """However many submits race, a user ends with exactly ``min(limit, before + racing)``
    runs in flight when ``before`` were there (those over the limit already stay)."""
    from hermes_agent.runs.gate import Gate
    from hermes_agent.runs.quotas import MemoryQuotaStore, Quotas
    from hermes_agent.runs.settings import QuotaSettings

    owner = f"u{uuid.uuid4().hex[:8]}"
    gate = Gate(
        GateLimits(max_runs_in_flight_per_user=limit), Quotas(QuotaSettings(), MemoryQuotaStore())
    )
    for _ in range(before):
        run_store.add(f"{owner}/s", QueuedRequest(message="x"), owner=owner)

    def admit(conn: Connection) -> None:
        lock_admissions(conn)
        gate.check_room(*count_in_flight(conn, owner))

    start = threading.Barrier(racing)

    def submit(_: int) -> bool:
        start.wait(timeout=30)
        try:
            run_store.add(f"{owner}/s", QueuedRequest(message="x"), owner=owner, admit=admit)
        except RunRejected:
            return False
        return True

    with ThreadPoolExecutor(racing) as pool:
        admitted = sum(pool.map(submit, range(racing)))
    assert admitted == max(0, min(racing, limit - before))
    with run_store.storage.transaction() as conn:
        assert count_in_flight(conn, owner)[1] == max(before, min(limit, before + racing))


def test_local_work_admitted_at_once_holds_its_place_before_the_quota(tmp_path: Path) -> None:
    """A replay or an MCP server's direct tool call (``admitted_here``): twelve at once, while
    the quota store is asked off the event loop, admit eight; the others are 429."""
    from hermes_agent.runs.gate import Gate, admitted_here
    from hermes_agent.runs.principal import Principal
    from hermes_agent.runs.quotas import MemoryQuotaStore, Quotas
    from hermes_agent.runs.request import RunRequest
    from hermes_agent.runs.settings import QuotaSettings
    from server_harness import make_agent

    agent = make_agent(f"sqlite:///{tmp_path / 'state.db'}")
    quotas = Quotas(QuotaSettings(runs_per_day=100), MemoryQuotaStore())
    gate = Gate(GateLimits(max_runs_in_flight_per_user=LIMIT), quotas)
    live: list[str] = []

    async def counts() -> tuple[int, int]:
        return len(live), len(live)

    @contextmanager
    def hold() -> Iterator[None]:
        live.append("work")
        try:
            yield
        finally:
            live.remove("work")

    async def main() -> tuple[int, int]:
        inside, refused, release = 0, 0, asyncio.Event()

        async def one() -> None:
            nonlocal inside, refused
            try:
                async with admitted_here(
                    gate, Principal("alice"), RunRequest(message="x"), agent, counts, hold
                ):
                    inside += 1
                    await release.wait()
            except RunRejected as exc:
                assert exc.status_code == 429
                refused += 1

        tasks = [asyncio.create_task(one()) for _ in range(SUBMITS)]
        await await_for(lambda: inside + refused >= SUBMITS, what="every submission answered")
        release.set()
        await asyncio.gather(*tasks)
        return inside, len(live)

    admitted, left = asyncio.run(main())
    assert (admitted, left) == (LIMIT, 0)


def test_answers_to_parked_approvals_at_once_admit_the_limit(tmp_path: Path, pg_url: str) -> None:
    """An approval's answer queues its run again: three answered at once with a limit of one
    put one run back in flight; the other two are 429 and stay pending."""
    key = _key(pg_url)
    settings = ServiceSettings(
        execution="queue", auth="keys", keepalive_s=0.2, max_runs_in_flight_per_user=1
    )
    with (
        running_step_model(free_port(), latency=0.02) as model_url,
        cluster(tmp_path, pg_url, REDIS, model_url, step_sleep=5, step_requires_approval=True) as c,
        ExitStack() as stack,
    ):
        c.start_worker(concurrency=4)
        c.wait_ready()
        clients = _instances(stack, tmp_path / "config.yaml", settings, key)
        refs = []
        for tag in ("a", "b", "c"):
            answer = clients[0].post("/v1/runs", json={"message": f"job {tag} steps=1"})
            rid = answer.json()["request_id"]
            view = asking(clients[0], rid)
            refs.append(view["pending_approvals"][0]["approval_id"])
        start = threading.Barrier(len(refs))

        def answer(i: int) -> httpx.Response:
            start.wait(timeout=30)
            return clients[i % 2].post(f"/v1/approvals/{refs[i]}", json={"approved": True})

        with ThreadPoolExecutor(len(refs)) as pool:
            codes = sorted(a.status_code for a in pool.map(answer, range(len(refs))))
        assert codes == [200, 429, 429]
        pending = clients[1].get("/v1/approvals").json()["approvals"]
        assert len(pending) == 2
