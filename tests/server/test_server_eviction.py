"""Finished runs are kept in memory for reconnecting clients only up to a count and an age
(oldest first), and a run still in flight is never forgotten; real uvicorn on loopback."""

from __future__ import annotations

import json
import time

import httpx

from hermes_agent.server import ServiceSettings, create_app
from server_harness import make_agent, serve, sse_events


def source(client: httpx.Client, request_id: str) -> str:
    reply = client.get(f"/v1/runs/{request_id}")
    assert reply.status_code == 200, reply.text
    found: str = reply.json()["source"]
    return found


def run(client: httpx.Client, message: str = "hello") -> str:
    reply = client.post("/v1/runs", json={"message": message})
    assert reply.status_code == 200, reply.text
    request_id: str = reply.json()["request_id"]
    return request_id


def test_finished_runs_beyond_the_count_are_read_from_the_store_oldest_first() -> None:
    settings = ServiceSettings(auth="none", max_finished_runs=2)
    with serve(create_app(agent=make_agent("memory://"), settings=settings)) as url:
        client = httpx.Client(base_url=url, timeout=30)
        with client.stream("POST", "/v1/runs", json={"message": "slow", "stream": True}) as slow:
            lines = slow.iter_lines()
            slow_id = next(e for e in sse_events(lines) if "data" in e)["data"]["request_id"]
            ids = [run(client) for _ in range(5)]
            # Eviction happens as a run starts: the fifth kept the two latest before it.
            assert [source(client, i) for i in ids] == ["store"] * 2 + ["memory"] * 3
            held = client.get(f"/v1/runs/{slow_id}").json()
            assert (held["source"], held["status"]) == ("memory", "running")
            events = [e for e in sse_events(lines) if "data" in e]
        assert events[-1]["event"] == "result"
        assert json.dumps(events[-1]["data"]["result"]["output"]).count("done") == 1


def test_finished_runs_older_than_the_ttl_are_forgotten() -> None:
    settings = ServiceSettings(auth="none", finished_run_ttl_s=0.3)
    with serve(create_app(agent=make_agent("memory://"), settings=settings)) as url:
        client = httpx.Client(base_url=url, timeout=30)
        first = run(client)
        assert source(client, first) == "memory"
        time.sleep(0.5)  # a measured spell: past the 0.3 s time to live
        second = run(client)
        assert (source(client, first), source(client, second)) == ("store", "memory")
