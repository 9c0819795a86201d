"""``POST /v1/channels/{name}/inbound`` over a real uvicorn on loopback, answering through a real
local receiver: a good signature runs and the answer comes back through the sender; a bad
signature, an old timestamp or a replay is refused and nothing runs; a missing user field is
refused by default (or falls back when told); the quota counts the stable id whatever the
per-session ids, and over it the user gets the polite message and nothing runs."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from hermes_agent.channels import signed_headers
from hermes_agent.channels.config import DEFAULT_QUOTA_MESSAGE
from hermes_agent.errors import ConfigError
from hermes_agent.runs.settings import QuotaSettings
from hermes_agent.server import ServiceSettings, create_app
from server_harness import make_agent, serve, wait_for
from test_channels import SECRET, Receiver, receiver_verifies

INBOUND_SECRET = "inbound-relay-secret-0123456789"


def channels(receiver_url: str, **inbound: Any) -> dict[str, Any]:
    return {
        "relay": {
            "type": "webhook",
            "url": receiver_url,
            "secret": SECRET,
            "retry": {"attempts": 2, "backoff_s": 0.01},
            "inbound": {
                "secret": INBOUND_SECRET,
                "message_field": "text.content",
                "user_field": "external_userid",
                "session_field": "conversation_id",
                **inbound,
            },
        }
    }


def app_for(tmp_path: Path, receiver_url: str, runs_per_day: int | None = None, **inbound: Any):  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path / 'state.db'}"
    settings = ServiceSettings(
        keys_url=url,
        quotas=QuotaSettings(runs_per_day=runs_per_day),
        channels=channels(receiver_url, **inbound),
    )
    return create_app(agent=make_agent(url), settings=settings)


def post(
    client: httpx.Client,
    payload: dict[str, Any],
    *,
    secret: str = INBOUND_SECRET,
    now: float | None = None,
    channel: str = "relay",
) -> httpx.Response:
    body = json.dumps(payload).encode()
    headers = {"Content-Type": "application/json", **signed_headers(secret, body, now)}
    return client.post(f"/v1/channels/{channel}/inbound", content=body, headers=headers)


def message(text: str, user: str | None = "wm-42", **extra: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {"text": {"content": text}, **extra}
    if user is not None:
        payload["external_userid"] = user
    return payload


def log_events(app: Any) -> list[tuple[str, str | None]]:
    return [(e.event, e.user_id) for e in reversed(app.state.channels.hub.store.entries())]


def test_a_signed_message_runs_and_the_answer_comes_back_through_the_sender(
    tmp_path: Path,
) -> None:
    with Receiver() as receiver:
        app = app_for(tmp_path, receiver.url)
        with serve(app) as base:
            client = httpx.Client(base_url=base, timeout=30)
            reply = post(client, message("hello", conversation_id="c1"))
            assert reply.status_code == 202, reply.text
            body = reply.json()
            assert body["status"] == "accepted" and body["user_id"] == "relay~wm-42"
            wait_for(lambda: len(receiver.requests) == 1)
            run = app.state.manager.runs[body["request_id"]]
            assert run.owner == "relay~wm-42" and run.session_id == "c1"
        [(headers, sent)] = receiver.requests
        assert receiver_verifies(headers, sent)
        answer = json.loads(sent)
        assert answer["content"] == "Hello!" and answer["kind"] == "answer"
        assert answer["user_id"] == "relay~wm-42" and answer["request_id"] == body["request_id"]
        assert log_events(app) == [("accepted", "relay~wm-42"), ("delivered", "relay~wm-42")]


def test_bad_signature_old_timestamp_and_replay_are_refused_and_nothing_runs(
    tmp_path: Path,
) -> None:
    with Receiver() as receiver:
        app = app_for(tmp_path, receiver.url)
        with serve(app) as base:
            client = httpx.Client(base_url=base, timeout=30)
            bad = post(client, message("hello"), secret="not-the-secret-0123456789")
            assert bad.status_code == 401 and "bad signature" in bad.json()["detail"]
            old = post(client, message("hello"), now=time.time() - 3600)
            assert old.status_code == 401 and "replay window" in old.json()["detail"]
            unsigned = client.post("/v1/channels/relay/inbound", json=message("hello"))
            assert unsigned.status_code == 401
            # The body changed after signing: refused.
            body = json.dumps(message("hello")).encode()
            headers = {"Content-Type": "application/json", **signed_headers(INBOUND_SECRET, body)}
            tampered = body.replace(b"hello", b"HELLO")
            changed = client.post("/v1/channels/relay/inbound", content=tampered, headers=headers)
            assert changed.status_code == 401
            assert app.state.manager.runs == {}
            # The same signed request twice: the second is refused.
            first = client.post("/v1/channels/relay/inbound", content=body, headers=headers)
            assert first.status_code == 202
            again = client.post("/v1/channels/relay/inbound", content=body, headers=headers)
            assert again.status_code == 409
            assert len(app.state.manager.runs) == 1
            wait_for(lambda: len(receiver.requests) == 1)
            unknown = post(client, message("hello"), channel="nope")
            assert unknown.status_code == 404
        events = [event for event, _ in log_events(app)]
        assert events.count("rejected_signature") == 4 and "rejected_replay" in events


def test_missing_user_field_is_refused_by_default_and_falls_back_when_told(
    tmp_path: Path,
) -> None:
    with Receiver() as receiver:
        app = app_for(tmp_path, receiver.url)
        with serve(app) as base:
            client = httpx.Client(base_url=base, timeout=30)
            refused = post(client, message("hello", user=None, sender={"id": "s-9"}))
            assert refused.status_code == 422 and "external_userid" in refused.json()["detail"]
            assert app.state.manager.runs == {}
        assert receiver.requests == []
        assert log_events(app) == [("missing_user", None)]

    with Receiver() as receiver:
        app = app_for(
            tmp_path / "b", receiver.url, on_missing_user="fallback", fallback_field="sender.id"
        )
        with serve(app) as base:
            client = httpx.Client(base_url=base, timeout=30)
            taken = post(client, message("hello", user=None, sender={"id": "s-9"}))
            assert taken.status_code == 202 and taken.json()["user_id"] == "relay~s-9"
            wait_for(lambda: len(receiver.requests) == 1)


def test_quota_counts_the_stable_id_across_sessions_and_over_it_sends_the_polite_message(
    tmp_path: Path,
) -> None:
    with Receiver() as receiver:
        app = app_for(tmp_path, receiver.url, runs_per_day=2)
        with serve(app) as base:
            client = httpx.Client(base_url=base, timeout=30)
            # The app's per-session id changes every time (encrypted per session); the stable
            # external_userid does not: one user, one counter.
            for session in ("c1", "c2"):
                payload = message("hello", conversation_id=session, openid=f"enc-{session}")
                assert post(client, payload).json()["status"] == "accepted"
            wait_for(lambda: len(receiver.requests) == 2)
            over = post(client, message("hello", conversation_id="c3", openid="enc-c3"))
            assert over.status_code == 202, over.text
            assert over.json() == {
                "inbound_id": over.json()["inbound_id"],
                "status": "quota_exceeded",
                "request_id": None,
                "user_id": "relay~wm-42",
            }
            wait_for(lambda: len(receiver.requests) == 3)
            assert len(app.state.manager.runs) == 2  # nothing ran for the third
            assert app.state.manager.quotas.usage("relay~wm-42").runs == 2
            # Another user of the channel still has their own quota.
            other = post(client, message("hello", user="wm-7", conversation_id="c1"))
            assert other.json()["status"] == "accepted"
            wait_for(lambda: len(receiver.requests) == 4)
        polite = [b for b in receiver.bodies() if b["kind"] == "quota"]
        assert len(polite) == 1 and polite[0]["content"] == DEFAULT_QUOTA_MESSAGE
        assert polite[0]["user_id"] == "relay~wm-42" and polite[0]["request_id"] is None
        entries = app.state.channels.hub.store.entries(event="quota_rejected")
        [entry] = entries
        assert entry.user_id == "relay~wm-42" and "runs_per_day" in entry.detail


def test_a_bad_channels_section_stops_create_app(tmp_path: Path) -> None:
    settings = ServiceSettings(channels={"relay": {"type": "webhook", "url": "http://x"}})
    with pytest.raises(ConfigError, match=r"service\.channels\.relay\.secret"):
        create_app(agent=make_agent("memory://"), settings=settings)
