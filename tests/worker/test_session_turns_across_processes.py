"""Two ``hermes-agent serve`` processes on one database (a SQLite file; a PostgreSQL database of
the test's own) take turns on a session: two turns of one session sent at once, one to each
process, never both run on the same history.

The model is the step model (``tests/harness/step_model.py``): ``job <tag> steps=0`` is answered
with ``user turns seen: <u>`` after 0.3 s, so each answer says how much of the session it read. Of a
pair on a fresh session, one answer must have seen 1 user turn and the other 2; both seeing 1 is
the two turns running side by side on the same history."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx

from server_harness import free_port
from step_model import running_step_model
from storage_backends import sql_database_url  # noqa: F401  (the sql_url fixture)
from test_serve_restart import _config, serving

PAIRS = 20
_SEEN = re.compile(r"user turns seen: (\d+)")


async def _pair(one: httpx.AsyncClient, other: httpx.AsyncClient, index: int) -> list[int]:
    """Two turns of session ``pair-<index>``, one to each process at once: the number of user
    turns each answer saw."""
    session = f"pair-{index}"
    replies = await asyncio.gather(
        one.post("/v1/runs", json={"message": f"job a{index} steps=0", "session_id": session}),
        other.post("/v1/runs", json={"message": f"job b{index} steps=0", "session_id": session}),
    )
    seen = []
    for reply in replies:
        assert reply.status_code == 200, reply.text
        found = _SEEN.search(reply.json()["output"])
        assert found, reply.text
        seen.append(int(found.group(1)))
    return seen


def _send_pairs(first: str, second: str) -> list[list[int]]:
    async def scenario() -> list[list[int]]:
        async with (
            httpx.AsyncClient(base_url=first, timeout=60) as one,
            httpx.AsyncClient(base_url=second, timeout=60) as other,
        ):
            return list(await asyncio.gather(*(_pair(one, other, i) for i in range(PAIRS))))

    return asyncio.run(scenario())


def test_two_services_on_one_database_run_one_turn_of_a_session_at_a_time(
    tmp_path: Path, sql_url: str
) -> None:
    with running_step_model(free_port(), latency=0.3) as model_url:
        ports = [free_port(), free_port()]
        homes = [tmp_path / "a", tmp_path / "b"]
        for home in homes:
            home.mkdir()
        configs = [
            _config(home, model_url, sql_url, port) for home, port in zip(homes, ports, strict=True)
        ]
        with (
            serving(homes[0], configs[0], ports[0], "a"),
            serving(homes[1], configs[1], ports[1], "b"),
        ):
            pairs = _send_pairs(*(f"http://127.0.0.1:{port}" for port in ports))
    same_history = [seen for seen in pairs if seen[0] == seen[1]]
    assert same_history == [], f"{len(same_history)} of {PAIRS} pairs ran on the same history"
    assert all(sorted(seen) == [1, 2] for seen in pairs), pairs
