"""Honest endings over a real uvicorn: a run whose model fails ends ``failed`` (its result and
error kept; no error text in its session), ``POST /v1/runs`` answers with a status that says how
the run ended (``X-Run-Id`` names it), ``Prefer: respond-async`` answers 202 at once, malformed
JSON is the API's one clean 400; and a store on a full disk makes ``/readyz`` 503 while the
runs' warnings say what was lost."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from hermes_agent import Agent, ScriptedModel, Tool
from hermes_agent.runs.status import ending_status
from hermes_agent.server import ServiceSettings, create_app
from hermes_agent.types import Message, RunResult, Usage
from server_harness import call, serve, sse_events, wait, wait_for

LOCAL = ServiceSettings(auth="none")


def answers(messages: Sequence[Message], _tools: Sequence[dict[str, Any]]) -> str:
    """``explode`` → the model fails; ``slow`` → a 1 s tool, then an answer; else an echo."""
    user = str(next(m.content for m in reversed(messages) if m.role == "user"))
    if "explode" in user:
        raise RuntimeError("the model endpoint is down")
    if user == "slow" and messages[-1].role != "tool":
        return call("wait", seconds=1.0)
    return f"echo: {user}"


def agent_on(storage: str) -> Agent:
    agent = Agent(model=ScriptedModel(answers), storage=storage)
    agent.add_tool(Tool.from_function(wait))
    return agent


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, Agent]]:
    folder = tmp_path_factory.mktemp("endings")
    agent = agent_on(f"sqlite:///{folder / 'state.db'}")
    with serve(
        create_app(agent=agent, settings=LOCAL.model_copy(update={"run_timeout_s": 0.5}))
    ) as url:
        yield httpx.Client(base_url=url, timeout=30), agent
    agent.close()


def test_a_run_whose_model_fails_is_failed_502_and_leaves_no_turn(
    service: tuple[httpx.Client, Agent],
) -> None:
    client, _ = service
    ok = client.post("/v1/runs", json={"message": "hello", "session_id": "s"})
    assert ok.status_code == 200 and ok.json()["output"] == "echo: hello"
    failed = client.post("/v1/runs", json={"message": "explode now", "session_id": "s"})
    assert failed.status_code == 502, failed.text  # told without reading the body
    result = failed.json()
    assert result["status"] == 502 and "endpoint is down" in result["error"]
    rid = failed.headers["X-Run-Id"]
    assert rid == result["request_id"] and failed.headers["Location"] == f"/v1/runs/{rid}"
    run = client.get(f"/v1/runs/{rid}").json()
    assert run["status"] == "failed" and "endpoint is down" in run["error"]
    assert run["result"]["status"] == 502
    listed = client.get("/v1/runs", params={"status": "failed"}).json()["runs"]
    assert [r["request_id"] for r in listed] == [rid]
    # The session holds the turn that completed, and nothing of the failed one.
    messages = client.get("/v1/sessions/s").json()["messages"]
    assert [m["content"] for m in messages] == ["hello", "echo: hello"]
    again = client.post("/v1/runs", json={"message": "and now?", "session_id": "s"})
    assert again.status_code == 200
    texts = [m["content"] for m in client.get("/v1/sessions/s").json()["messages"]]
    assert not any("down" in text or "explode" in text for text in texts)


def test_a_streamed_failure_ends_with_its_result_and_reads_back_failed(
    service: tuple[httpx.Client, Agent],
) -> None:
    client, _ = service
    body = {"message": "explode", "stream": True}
    with client.stream("POST", "/v1/runs", json=body) as reply:
        assert reply.status_code == 200  # a stream's status is sent before the run ends
        rid = reply.headers["X-Run-Id"]  # ...and its id with it, before any event
        frames = [f for f in sse_events(reply.iter_lines()) if "data" in f]
    assert frames[-1]["data"]["kind"] == "result"
    assert frames[-1]["data"]["result"]["status"] == 502
    assert client.get(f"/v1/runs/{rid}").json()["status"] == "failed"


def test_input_refused_by_the_pipeline_is_400_and_a_schema_mismatch_422(
    service: tuple[httpx.Client, Agent],
) -> None:
    client, _ = service
    empty = client.post("/v1/runs", json={"message": "   "})
    assert empty.status_code == 400 and empty.json()["status"] == 400
    assert client.get(f"/v1/runs/{empty.headers['X-Run-Id']}").json()["status"] == "failed"
    unknown = client.post("/v1/runs", json={"message": "hi", "output_format": "nope"})
    assert unknown.status_code == 422 and "unknown output format" in unknown.json()["detail"]


def test_a_run_past_its_deadline_is_504(service: tuple[httpx.Client, Agent]) -> None:
    client, _ = service
    late = client.post("/v1/runs", json={"message": "slow"})
    assert late.status_code == 504, late.text
    assert late.json()["status"] == "timed_out"
    assert late.headers["X-Run-Id"] == late.json()["request_id"]


def test_respond_async_answers_202_at_once_with_where_to_follow(
    service: tuple[httpx.Client, Agent],
) -> None:
    client, _ = service
    started = time.monotonic()
    reply = client.post(
        "/v1/runs", json={"message": "hello async"}, headers={"Prefer": "respond-async"}
    )
    assert reply.status_code == 202 and reply.headers["Preference-Applied"] == "respond-async"
    assert time.monotonic() - started < 5
    rid = reply.headers["X-Run-Id"]
    assert reply.json()["status_url"] == f"/v1/runs/{rid}" == reply.headers["Location"]
    run = wait_for(
        lambda: (v := client.get(f"/v1/runs/{rid}").json())["status"] == "completed" and v,
        10,
        f"run {rid} completing",
        pace=0.05,
    )
    assert run["result"]["output"] == "echo: hello async"


@pytest.mark.parametrize("path", ["/v1/runs", "/v1/approvals/a1"])
def test_malformed_json_is_one_clean_400(service: tuple[httpx.Client, Agent], path: str) -> None:
    client, _ = service
    reply = client.post(path, content=b'{"message": ', headers={"content-type": "application/json"})
    assert reply.status_code == 400, reply.text
    assert reply.json() == {"detail": "the request body is not valid JSON"}
    # A body that is JSON but not the request stays a 422 with the list of issues.
    wrong = client.post(path, json={"unexpected": 1})
    assert wrong.status_code == 422 and isinstance(wrong.json()["detail"], list)


@pytest.mark.parametrize("path", ["/v1/runs", "/v1/approvals/a1"])
@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_a_json_body_sent_as_something_else_is_one_clean_415(
    service: tuple[httpx.Client, Agent], path: str, content_type: str | None
) -> None:
    client, _ = service
    body = b'{"message": "hello"}' if path == "/v1/runs" else b'{"approved": true}'
    request = client.build_request("POST", path, content=body)
    if content_type is None:
        request.headers.pop("content-type", None)
        assert "content-type" not in request.headers  # as curl -H "Content-Type:" sends it
    else:
        request.headers["content-type"] = content_type
    reply = client.send(request)
    assert reply.status_code == 415, reply.text
    sent = f"Content-Type {content_type!r}" if content_type else "no Content-Type"
    assert reply.json() == {
        "detail": "the request body must be JSON, sent with Content-Type: application/json "
        f"(this one came with {sent})"
    }
    # With the header the same body is read (a run, or an approval that is not there).
    given = client.post(path, content=body, headers={"content-type": "application/json"})
    assert given.status_code in (200, 404), given.text


def test_the_ending_is_read_from_the_result() -> None:
    def result(status: int, loop: Any) -> RunResult:
        return RunResult(
            output="", status=status, request_id="r", session_id="s", tool_calls=[],
            usage=Usage(), steps=[], duration_ms=0.0, error=None, loop_status=loop,
        )  # fmt: skip

    assert ending_status(result(200, "completed")) == "completed"
    assert ending_status(result(206, "max_iterations")) == "completed"
    for status in (400, 422, 500, 502):
        assert ending_status(result(status, "failed")) == "failed"


# -- a full disk --------------------------------------------------------------------------------


@contextlib.contextmanager
def small_disk(folder: Path, size: str = "4m") -> Iterator[Path]:
    """A real filesystem of ``size`` at ``folder`` (tmpfs; needs the right to mount)."""
    folder.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {done.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(disk: Path) -> Path:
    """Take every free byte of ``disk``."""
    filler = disk / "filler"
    try:
        with filler.open("wb") as out:
            while True:
                out.write(b"\0" * 65536)
                out.flush()
    except OSError:  # the disk is full: writing, or closing the file with the last bytes
        pass
    return filler


def test_a_full_disk_is_503_on_readyz_and_each_run_says_what_was_lost(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk") as disk:
        agent = agent_on(f"sqlite:///{disk / 'state.db'}")
        with serve(create_app(agent=agent, settings=LOCAL)) as url:
            client = httpx.Client(base_url=url, timeout=30)
            assert client.post("/v1/runs", json={"message": "before"}).status_code == 200
            assert client.get("/readyz").status_code == 200

            filler = fill(disk)
            # The probe's answer is kept a second.
            ready = wait_for(
                lambda: (r := client.get("/readyz")).status_code == 503 and r, 5, "readyz 503"
            )
            assert ready.json()["error"] == "the store cannot be written (see the service log)"
            reply = client.post("/v1/runs", json={"message": "while full", "session_id": "f"})
            # The run had its effects: it answers, and says what the store did not keep.
            assert reply.status_code == 200, reply.text
            warnings = reply.json()["warnings"]
            assert any("not saved to session" in w for w in warnings), warnings
            assert any("trail" in w and "not stored" in w for w in warnings), warnings

            filler.unlink()
            wait_for(lambda: client.get("/readyz").status_code == 200, 5, "readyz 200 again")
            after = client.post("/v1/runs", json={"message": "after"})
            assert after.status_code == 200 and after.json()["warnings"] == []
        agent.close()


def test_replicas_bound_alike_are_different_instances_by_default() -> None:
    """Two replicas both bound to 0.0.0.0:8000 must not take each other's runs for their own
    earlier life: the default instance name is the machine's host name and the port."""
    import socket

    from hermes_agent.server import ServiceSettings

    bound = ServiceSettings(host="0.0.0.0", port=8000)
    assert bound.instance == f"{socket.gethostname()}:8000"
    assert ServiceSettings(instance_name="eu-1").instance == "eu-1"
