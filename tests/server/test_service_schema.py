"""``schemathesis`` against the running service's own OpenAPI schema, over a real uvicorn on
loopback: requests generated from ``/openapi.json`` get no server error (5xx) and no answer the
schema does not document (status code, content type, headers, body, each SSE event).

Four generated passes over every operation: valid data with a key, invalid data with a key,
valid data without a key, and valid data naming a real run, session and approval. Then chosen
requests reach the answers random data hardly does: 202 with a pending approval, 429 with
``Retry-After``, both kinds of 413, a run read back from the store, a cancel, a stream.

The number of requests is printed (``pytest -s``) and must reach a floor, so a schema that
stops describing the endpoints cannot pass by generating nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from hypothesis.reporting import with_reporter
from schemathesis import GenerationMode
from schemathesis.core.failures import Failure, FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from hermes_agent import Agent, ScriptedModel
from hermes_agent.runs.keys import MemoryKeyStore
from hermes_agent.server import ServiceSettings, create_app
from hermes_agent.tools.registry import Tool
from hermes_agent.types import Message
from server_harness import call, delete_file, poll_run, serve

CHECKS = [
    schemathesis.checks.not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
MAX_EXAMPLES = 30
"""Per operation and pass: every documented answer is reached, and the test takes well under
a minute on a small machine."""
MIN_REQUESTS = 800
LIMIT_PER_USER = 3


def _script(messages: Sequence[Message], _tools: Sequence[dict[str, Any]]) -> str:
    """``delete X`` asks for an approval; anything else is answered at once (no message the
    generator makes up starts a long tool)."""
    user = str(next(m.content for m in reversed(messages) if m.role == "user"))
    if messages[-1].role == "tool":
        return f"done: {str(messages[-1].content)[:100]}"
    if user.startswith("delete "):
        return call("delete_file", path=user[7:])
    return "Hello!"


def _agent(tmp_path: Path) -> Agent:
    agent = Agent(model=ScriptedModel(_script), storage=f"sqlite:///{tmp_path / 'state.db'}")
    agent.add_tool(Tool.from_function(delete_file, requires_approval=True))
    return agent


class _Tally:
    """Requests by operation and status, and each distinct failure once."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.session = requests.Session()
        self.counts: Counter[str] = Counter()
        self.failures: dict[str, str] = {}

    def check(self, case: Any, headers: dict[str, str], prefix: str) -> int:
        response = case.call(base_url=self.url, session=self.session, headers=headers, timeout=30)
        self.counts[f"{case.operation.label} -> {response.status_code}"] += 1
        try:
            case.validate_response(response, checks=CHECKS)
        except (Failure, FailureGroup) as exc:
            found = exc.exceptions if isinstance(exc, FailureGroup) else [exc]
            for failure in found:
                title = f"{prefix}{case.operation.label} -> {response.status_code}: {failure.title}"
                self.failures.setdefault(title, f"{failure}\n{case.as_curl_command()}")
        status: int = response.status_code
        return status

    def generate(
        self,
        operation: Any,
        mode: GenerationMode,
        headers: dict[str, str],
        path_parameters: dict[str, str] | None,
        prefix: str,
    ) -> None:
        strategy = operation.as_strategy(generation_mode=mode, path_parameters=path_parameters)

        @settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            database=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=strategy)
        def one(case: Any) -> None:
            self.check(case, headers, prefix)

        try:
            with with_reporter(lambda _: None):  # hypothesis's notes on an unsatisfiable pass
                one()
        except Unsatisfiable:
            if mode is not GenerationMode.NEGATIVE:
                raise
            # Nothing about this operation can be invalid (no parameters, no body).


def test_generated_requests_find_no_server_error_and_no_undocumented_answer(
    tmp_path: Path,
) -> None:
    keys = MemoryKeyStore()
    auth = {"Authorization": f"Bearer {keys.create('alice')}"}
    service = ServiceSettings(
        approval_policy="wait",
        approval_timeout_s=1.0,
        run_timeout_s=5,
        max_runs_in_flight_per_user=LIMIT_PER_USER,
        max_body_bytes=50_000,
        max_message_chars=10_000,
        keepalive_s=1,
    )
    app = create_app(agent=_agent(tmp_path), settings=service, keys=keys)
    with serve(app) as url:
        client = httpx.Client(base_url=url, headers=auth, timeout=30)
        known = _known_ids(client)
        schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
        operations = {op.label: op for op in (r.ok() for r in schema.get_all_operations())}
        assert len(operations) >= 14, sorted(operations)
        tally = _Tally(url)
        passes = [
            ("valid", GenerationMode.POSITIVE, auth, False),
            ("invalid", GenerationMode.NEGATIVE, auth, False),
            ("no key", GenerationMode.POSITIVE, {}, False),
            ("real ids", GenerationMode.POSITIVE, auth, True),
        ]
        for name, mode, headers, real_ids in passes:
            for operation in operations.values():
                names = {p.name for p in operation.path_parameters}
                if real_ids and not (names and names <= known.keys()):
                    continue
                fixed = {n: known[n] for n in names} if real_ids else None
                tally.generate(operation, mode, headers, fixed, f"{name}: ")
        chosen = _chosen(operations, tally, auth, client)
    # Another process on the same store: the run is read back from the audit records.
    with serve(create_app(agent=_agent(tmp_path), settings=service, keys=keys)) as url:
        tally.url = url
        stored = operations["GET /v1/runs/{request_id}"].Case(
            path_parameters={"request_id": known["request_id"]}
        )
        assert tally.check(stored, auth, "restarted: ") == 200
        chosen += 1
    total = sum(tally.counts.values())
    print(f"\nschemathesis: {total} requests ({chosen} chosen), {len(tally.failures)} failures")
    for label, number in sorted(tally.counts.items()):
        print(f"  {number:5d}  {label}")
    for title, detail in tally.failures.items():
        print(f"FAILURE {title}\n{detail}\n")
    assert not tally.failures, "\n".join(tally.failures)
    assert total >= MIN_REQUESTS, tally.counts
    statuses = {label.rsplit(" ", 1)[1] for label in tally.counts}
    assert {"200", "202", "204", "400", "401", "404", "409", "413", "422", "429"} <= statuses


def _known_ids(client: httpx.Client) -> dict[str, str]:
    """A finished run (with its session) and an answered approval, for the "real ids" pass."""
    done = client.post("/v1/runs", json={"message": "hello", "session_id": "known"}).json()
    waiting = client.post("/v1/runs", json={"message": "delete old.txt"})
    assert waiting.status_code == 202, waiting.text
    approval = waiting.json()["pending_approvals"][0]["approval_id"]
    assert client.post(f"/v1/approvals/{approval}", json={"approved": True}).status_code == 200
    poll_run(client, waiting.json()["request_id"])
    return {"request_id": done["request_id"], "session_id": "known", "approval_id": approval}


def _chosen(
    operations: dict[str, Any], tally: _Tally, auth: dict[str, str], client: httpx.Client
) -> int:
    """Requests that reach what generated data seldom does; each answer is checked against
    the schema like the generated ones. Returns how many were sent."""
    runs = operations["POST /v1/runs"]
    sent = 0

    def send(operation: Any, expected: int, **data: Any) -> int:
        nonlocal sent
        sent += 1
        status = tally.check(operation.Case(**data), auth, "chosen: ")
        assert status == expected, (operation.label, data, status)
        return status

    # Runs that wait for approvals until the user's limit is reached: 202s, then a 429.
    for _ in range(LIMIT_PER_USER):
        send(runs, 202, body={"message": "delete a.txt"})
    send(runs, 429, body={"message": "hello"})
    listed = client.get("/v1/runs", params={"status": "waiting_approval"}).json()["runs"]
    waiting = [run["request_id"] for run in listed]
    assert len(waiting) == LIMIT_PER_USER
    send(
        operations["GET /v1/runs/{request_id}"],
        200,
        path_parameters={"request_id": waiting[0]},
    )
    send(
        operations["POST /v1/runs/{request_id}/cancel"],
        200,
        path_parameters={"request_id": waiting[0]},
    )
    for request_id in waiting:
        poll_run(client, request_id)
    # Too large: the message, and the whole body.
    send(runs, 413, body={"message": "x" * 10_001})
    send(runs, 413, body={"message": "hello", "channel": "x" * 60_000})
    # A stream, then the same run's events again.
    send(runs, 200, body={"message": "delete b.txt", "stream": True})
    last = client.get("/v1/runs").json()["runs"][0]["request_id"]
    send(operations["GET /v1/runs/{request_id}/events"], 200, path_parameters={"request_id": last})
    return sent
