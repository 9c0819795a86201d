"""Every model turn counts against ``tokens_per_day``, however it ends, and runs in flight hold
back what they may spend: the spend meter (a turn cut short counts its prompt and what it
streamed; the model's usage replaces the estimate), the quota's reservations (the day
overshoots by at most one run's reservation, as a property over any interleaving of runs), the
stores' atomic admission with reservations, and through a real uvicorn service with a real
OpenAI-compatible model that streams slowly: runs cancelled or timed out mid-answer, and a
burst of parallel runs, in process and on the queue's workers."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hermes_agent import Agent
from hermes_agent.models.openai import OpenAICompatible
from hermes_agent.pipeline.watch import SpendMeter
from hermes_agent.runs.keys import MemoryKeyStore, SqlKeyStore
from hermes_agent.runs.quotas import MemoryQuotaStore, Quotas, QuotaStore, quota_store_for
from hermes_agent.runs.settings import QuotaLimits, QuotaSettings
from hermes_agent.server import ServiceSettings, create_app, open_key_store
from hermes_agent.types import Usage
from openai_server import ScriptedServer, running_server, text
from server_harness import bearer as _bearer
from server_harness import serve, sse_events, wait_for
from step_model import running_step_model
from storage_backends import _url, database_url, sql_database_url  # noqa: F401  (fixtures)
from worker_harness import REDIS, cluster, free_port

DAY = "2030-01-01"


def _count(text: str) -> int:
    return len(text) // 3 + 1


# -- the meter ------------------------------------------------------------------------------


def test_a_turn_cut_short_counts_its_prompt_and_what_it_streamed() -> None:
    meter = SpendMeter()
    meter.sent(100, _count)
    assert meter.total == 100  # the prompt counts from the moment it is sent
    meter.streamed("x" * 30)
    meter.streamed("y" * 30)
    assert meter.total == 100 + _count("x" * 30 + "y" * 30)
    # Cut here (cancelled, timed out): the total is what the engine settles.
    cut = meter.total
    meter.sent(50, _count)  # a later turn: the cut one stays counted
    assert meter.total == cut + 50


def test_the_model_s_usage_replaces_the_estimate_and_none_keeps_it() -> None:
    meter = SpendMeter()
    meter.sent(100, _count)
    meter.streamed("z" * 300)
    meter.ended(Usage(prompt_tokens=80, completion_tokens=70))
    assert meter.total == 150
    meter.sent(40, _count)
    meter.ended(Usage())  # a model that reports nothing: its estimate stays
    assert meter.total == 190


# -- reservations -----------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 1_893_456_000.0  # 2030-01-01 00:00 UTC

    def __call__(self) -> float:
        return self.now


def _quotas(limit: int, reserve: int, store: QuotaStore | None = None) -> Quotas:
    quota = QuotaSettings(tokens_per_day=limit, tokens_reserved_per_run=reserve)
    return Quotas(quota, store or MemoryQuotaStore(), clock=_Clock())


@settings(max_examples=200, deadline=None)
@given(
    limit=st.integers(1, 5_000),
    reserve=st.integers(1, 2_000),
    plan=st.lists(st.tuples(st.booleans(), st.integers(0, 2_000)), max_size=60),
)
def test_the_day_overshoots_by_less_than_one_reservation(
    limit: int, reserve: int, plan: list[tuple[bool, int]]
) -> None:
    """Any interleaving of starts (``True``) and endings (``False``: the oldest run in flight
    ends, having spent its number of tokens, at most its reservation): the day's total never
    reaches the limit plus one reservation."""
    quotas = _quotas(limit, reserve)
    in_flight: list[str] = []
    for starts, spent in plan:
        if starts:
            day, refused = quotas.admit("alice")
            if refused is None:
                in_flight.append(day)
        elif in_flight:
            quotas.settle("alice", in_flight.pop(0), reserve, min(spent, reserve))
    for day in in_flight:  # the rest end, each spending all it reserved
        quotas.settle("alice", day, reserve, reserve)
    assert quotas.usage("alice").tokens < limit + reserve


def test_a_run_that_never_starts_gives_its_reservation_back() -> None:
    clock = _Clock()
    quota = QuotaSettings(tokens_per_day=1_000, tokens_reserved_per_run=300)
    quotas = Quotas(quota, MemoryQuotaStore(), clock=clock)
    day, _ = quotas.admit("alice")
    assert quotas.usage("alice").tokens == 300
    quotas.refund("alice", day, quotas.reservation("alice"))
    assert (quotas.usage("alice").runs, quotas.usage("alice").tokens) == (0, 0)
    day, _ = quotas.admit("alice")
    clock.now += 86_400  # it ends the next day: its spend counts there, in full
    quotas.settle("alice", day, 300, 120)
    assert quotas.usage("alice").tokens == 120
    # A user without tokens_per_day reserves nothing.
    assert Quotas(QuotaSettings(runs_per_day=3), MemoryQuotaStore()).reservation("bob") == 0


def test_admission_with_reservations_is_atomic_under_concurrency(db_url: str) -> None:
    keys = open_key_store(db_url)
    store = quota_store_for(keys)
    admitted: list[bool] = []
    start = threading.Barrier(12)

    def one() -> None:
        start.wait()
        ok, _ = store.admit("alice", DAY, QuotaLimits(tokens_per_day=500), 200)
        admitted.append(ok)

    threads = [threading.Thread(target=one) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    try:
        # 0, 200 and 400 are under 500: three runs; the rest see 600 reserved.
        assert sorted(admitted) == [False] * 9 + [True] * 3
        assert store.usage("alice", DAY).tokens == 600
        store.refund("alice", DAY, 200)
        store.add_tokens("alice", DAY, -1_000)  # never below zero
        assert store.usage("alice", DAY).tokens == 0
        assert store.add_run_tokens("alice", DAY, "run-1", 70)
        assert not store.add_run_tokens("alice", DAY, "run-1", 70)
        assert store.usage("alice", DAY).tokens == 70
    finally:
        keys.close()


# -- through the service, with a model that streams slowly ------------------------------------

ANSWER = "The quick brown fox jumps over the lazy dog. " * 60  # ~2,700 characters


@pytest.fixture(name="model_server")
def model_server_fixture() -> Iterator[ScriptedServer]:
    with running_server() as server:
        server.default = text(ANSWER, pace=0.01)
        yield server


def _app(server: ScriptedServer, keys: MemoryKeyStore, **settings: Any) -> Any:
    model = OpenAICompatible("slow", base_url=server.base_url, max_retries=0)
    agent = Agent(model=model, storage="memory://")
    quotas = settings.pop("quotas")
    service = ServiceSettings(keys_url="memory://", quotas=quotas, **settings)
    return create_app(agent=agent, settings=service, keys=keys)


def _stream_until(client: httpx.Client, chars: int) -> tuple[str, int, Iterator[Any]]:
    """Start a streamed run; read its events until ``chars`` characters of answer arrived;
    returns the run's id, the characters seen and the rest of the stream."""
    response = client.send(
        client.build_request("POST", "/v1/runs", json={"message": "go", "stream": True}),
        stream=True,
    )
    assert response.status_code == 200, response.read()
    frames = sse_events(response.iter_lines())
    request_id, seen = "", 0
    for frame in frames:
        data = frame.get("data") or {}
        request_id = request_id or response.headers.get("x-run-id", "")
        if data.get("kind") == "text_delta":
            seen += len(data["text"])
            if seen >= chars:
                break
    return request_id, seen, frames


def test_runs_cancelled_mid_answer_count_what_they_streamed(model_server: ScriptedServer) -> None:
    keys = MemoryKeyStore()
    alice = keys.create("alice")
    quotas = QuotaSettings(tokens_per_day=10**9, tokens_reserved_per_run=5_000)
    app = _app(model_server, keys, quotas=quotas)
    streamed = 0
    with serve(app) as base:
        client = httpx.Client(base_url=base, timeout=30, headers=_bearer(alice))
        for _ in range(10):
            request_id, seen, rest = _stream_until(client, 600)
            assert request_id
            cancel = client.post(f"/v1/runs/{request_id}/cancel")
            assert cancel.json()["status"] == "cancelled", cancel.text
            for frame in rest:  # what was on its way when the cancel landed, then the end
                data = frame.get("data") or {}
                seen += len(data["text"]) if data.get("kind") == "text_delta" else 0
            streamed += _count("x" * seen)
        counted = app.state.manager.quotas.usage("alice").tokens
    # Nothing reserved is left; each run counted its prompt and at least what reached us.
    print(f"\n10 cancelled runs: {streamed} tokens streamed, {counted} counted")
    assert counted >= streamed
    assert counted < streamed + 10 * 2_000  # prompts are small; the stream went on a little


def test_runs_timed_out_mid_answer_count_what_they_streamed(model_server: ScriptedServer) -> None:
    keys = MemoryKeyStore()
    alice = keys.create("alice")
    quotas = QuotaSettings(tokens_per_day=10**9)
    app = _app(model_server, keys, quotas=quotas, run_timeout_s=1.0)
    streamed = 0
    with serve(app) as base:
        client = httpx.Client(base_url=base, timeout=30, headers=_bearer(alice))
        for _ in range(3):
            _, seen, rest = _stream_until(client, 1)
            last = {}
            for frame in rest:
                data = frame.get("data") or {}
                if data.get("kind") == "text_delta":
                    seen += len(data["text"])
                last = data
            assert last.get("kind") == "run_stopped" and last["status"] == "timed_out", last
            streamed += _count("x" * seen)
        counted = app.state.manager.quotas.usage("alice").tokens
    print(f"\n3 timed-out runs: {streamed} tokens streamed, {counted} counted")
    assert streamed > 0
    assert streamed <= counted < streamed + 3 * 2_000


def test_parallel_runs_overshoot_the_day_by_at_most_one_reservation(
    model_server: ScriptedServer,
) -> None:
    # 200 tokens a run, as the model reports them.
    model_server.default = text("short " * 40, pace=0.002, prompt_tokens=80, completion_tokens=120)
    keys = MemoryKeyStore()
    alice = keys.create("alice")
    limit, reserve = 500, 400
    quotas = QuotaSettings(tokens_per_day=limit, tokens_reserved_per_run=reserve)
    app = _app(model_server, keys, quotas=quotas)
    answers: list[int] = []
    with serve(app) as base:
        start = threading.Barrier(12)

        def one() -> None:
            with httpx.Client(base_url=base, timeout=60, headers=_bearer(alice)) as client:
                start.wait()
                answers.append(client.post("/v1/runs", json={"message": "go"}).status_code)

        threads = [threading.Thread(target=one) for _ in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        counted = app.state.manager.quotas.usage("alice").tokens
    print(f"\n12 parallel runs: {answers.count(200)} admitted, {counted} of {limit} tokens spent")
    assert set(answers) <= {200, 429} and answers.count(200) >= 1
    assert answers.count(429) >= 12 - 2  # 0 and 400 are under 500: at most two at once
    assert counted < limit + reserve


def test_the_cancel_answer_keeps_its_shape_for_a_run_with_nothing_left_running(
    model_server: ScriptedServer,
) -> None:
    keys = MemoryKeyStore()
    alice = keys.create("alice")
    app = _app(model_server, keys, quotas=QuotaSettings())
    with serve(app) as base:
        client = httpx.Client(base_url=base, timeout=30, headers=_bearer(alice))
        request_id, _, _ = _stream_until(client, 10)
        cancel = client.post(f"/v1/runs/{request_id}/cancel").json()
    assert cancel == {"request_id": request_id, "cancelled": True, "status": "cancelled"}


# -- queued: the same reservations, taken by every instance in the store ---------------------


@pytest.mark.timeout(240)
def test_parallel_queued_runs_overshoot_the_day_by_at_most_one_reservation(
    tmp_path: Path, pg_url: str
) -> None:
    """With ``execution: queue``: twelve runs sent at once (each four model turns of 30
    tokens) against a day of 500 tokens and reservations of 400: two are queued, the rest
    refused, and once they end the day holds what the two spent."""
    keys = SqlKeyStore(pg_url)
    try:
        alice = keys.create("alice")
    finally:
        keys.close()
    quotas = {"tokens_per_day": 500, "tokens_reserved_per_run": 400}
    settings = ServiceSettings(execution="queue", auth="keys", keepalive_s=0.2, quotas=quotas)
    with (
        running_step_model(free_port(), latency=0.05) as model_url,
        cluster(tmp_path, pg_url, REDIS, model_url, step_sleep=0.05) as c,
    ):
        c.start_worker(concurrency=4)
        c.wait_ready()
        app = create_app(tmp_path / "config.yaml", settings=settings)
        with serve(app) as base:
            answers: list[httpx.Response] = []
            start = threading.Barrier(12)

            def one(i: int) -> None:
                with httpx.Client(base_url=base, timeout=60, headers=_bearer(alice)) as client:
                    start.wait()
                    answers.append(client.post("/v1/runs", json={"message": f"job p{i}"}))

            threads = [threading.Thread(target=one, args=(i,)) for i in range(12)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            queued = [a.json()["request_id"] for a in answers if a.status_code == 202]
            assert sorted(a.status_code for a in answers) == [202] * 2 + [429] * 10
            with httpx.Client(base_url=base, timeout=60, headers=_bearer(alice)) as client:
                for rid in queued:  # read back: each settles its reservation
                    wait_for(
                        lambda rid=rid: (
                            client.get(f"/v1/runs/{rid}").json()["status"] == "completed"
                        ),
                        timeout=60,
                    )
            spent = app.state.manager.quotas.usage("alice").tokens
    print(f"\n12 parallel queued runs: {len(queued)} queued, {spent} of 500 tokens spent")
    assert spent == 2 * 4 * 30
