"""Channel senders against real local servers: an HTTP receiver on loopback that checks the
webhook's HMAC itself and records the WeCom bot payloads (split within the byte limit), a
receiver that fails three times then succeeds (delivered once), one that always fails (a dead
letter, then ``hermes-agent channels resend`` delivers it), and aiosmtpd receiving the email
(STARTTLS with login, and SSL; plain and HTML parts). Also the config's errors."""

from __future__ import annotations

import asyncio
import email
import hashlib
import hmac
import json
import subprocess
import threading
from collections.abc import Iterator
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, Envelope, LoginPassword, Session
from typer.testing import CliRunner

from hermes_agent.channels import (
    ChannelHub,
    MemoryChannelStore,
    OutboundMessage,
    SqlChannelStore,
    channel_settings,
    split_utf8,
)
from hermes_agent.cli.app import app as cli
from hermes_agent.errors import ConfigError
from hermes_agent.types import RunResult, ToolCallRecord
from server_harness import free_port
from storage_backends import sql_database_url  # noqa: F401  (the sql_url fixture)

SECRET = "s3cret-webhook-key-0123456789"


class Receiver:
    """An HTTP server on loopback that records every POST and answers from a script:
    ``fail_first`` requests get ``fail_status``, then 200 (``always_fail`` never succeeds)."""

    def __init__(self, *, fail_first: int = 0, fail_status: int = 503, wecom: bool = False):
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.fail_first = fail_first
        self.fail_status = fail_status
        self.always_fail = False
        self.wecom = wecom
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with lock:
                    receiver.requests.append((dict(self.headers.items()), body))
                    failing = receiver.always_fail or len(receiver.requests) <= receiver.fail_first
                status = receiver.fail_status if failing else 200
                answer = b'{"errcode":0,"errmsg":"ok"}' if receiver.wecom else b"{}"
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *_: Any) -> None:
                return None

        lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _, body in self.requests]


def receiver_verifies(headers: dict[str, str], body: bytes, secret: str = SECRET) -> bool:
    """What a webhook's receiver does, written out: HMAC-SHA256 over ``<timestamp>.<body>``."""
    timestamp = headers["X-Hermes-Timestamp"]
    expected = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return hmac.compare_digest(headers["X-Hermes-Signature"], "sha256=" + expected.hexdigest())


def result_with_flights() -> RunResult:
    flights = [
        {"flight": "HX101", "delay_min": 95, "status": "delayed"},
        {"flight": "HX202", "delay_min": 0, "status": "on time"},
    ]
    call = ToolCallRecord(name="flight_status", arguments={"airport": "HKG"}, result=flights)
    return RunResult(
        output="One flight is late.", status=200, request_id="req-1", session_id="s",
        tool_calls=[call],
    )  # fmt: skip


def hub_for(channels: dict[str, Any], store: Any = None) -> ChannelHub:
    async def no_wait(_: float) -> None:
        await asyncio.sleep(0)  # one turn of the loop instead of the backoff

    return ChannelHub(
        channel_settings(channels), store=store or MemoryChannelStore(), sleep=no_wait
    )


def deliver(hub: ChannelHub, message: OutboundMessage) -> Any:
    async def go() -> Any:
        try:
            return await hub.deliver(message)
        finally:
            await hub.aclose()

    return asyncio.run(go())


def test_webhook_is_signed_so_that_the_receiver_verifies_it() -> None:
    with Receiver() as receiver:
        hub = hub_for({"ops": {"type": "webhook", "url": receiver.url, "secret": SECRET}})

        async def go() -> Any:
            try:
                return await hub.deliver_result(result_with_flights(), ["ops"], user_id="alice")
            finally:
                await hub.aclose()

        [delivery] = asyncio.run(go())
    assert delivery.delivered and delivery.attempts == 1
    [(headers, body)] = receiver.requests
    assert headers["Content-Type"] == "application/json"
    assert receiver_verifies(headers, body)
    assert not receiver_verifies(headers, body + b" ")  # the body as sent, byte for byte
    assert not receiver_verifies(headers, body, secret="another-secret-0123456789")
    sent = json.loads(body)
    assert sent["content"] == "One flight is late."  # the channel's renderer: text
    assert sent["user_id"] == "alice" and sent["request_id"] == "req-1"
    assert headers["X-Hermes-Delivery"] == sent["delivery_id"]


def test_wecom_payload_format_and_long_answers_split_within_the_byte_limit() -> None:
    line = "航班 HX101 延误 95 分钟 — flight HX101 is 95 minutes late\n"  # multi-byte text
    answer = line * 200  # ~13,000 bytes
    with Receiver(wecom=True) as receiver:
        hub = hub_for({"bot": {"type": "wecom", "url": receiver.url, "msgtype": "markdown"}})
        result = deliver(hub, OutboundMessage("bot", answer, format="markdown"))
    assert result.delivered
    bodies = receiver.bodies()
    assert len(bodies) >= 4
    contents = []
    for index, body in enumerate(bodies, 1):
        assert set(body) == {"msgtype", "markdown"} and body["msgtype"] == "markdown"
        content = body["markdown"]["content"]
        assert len(content.encode()) <= 4096
        mark = f"({index}/{len(bodies)})\n"
        assert content.startswith(mark)
        contents.append(content[len(mark) :])
    assert "".join(contents) == answer  # nothing lost, no character cut in two

    with Receiver(wecom=True) as receiver:
        hub = hub_for({"bot": {"type": "wecom", "url": receiver.url, "msgtype": "text"}})
        assert deliver(hub, OutboundMessage("bot", "short answer")).delivered
    assert receiver.bodies() == [{"msgtype": "text", "text": {"content": "short answer"}}]


def test_split_cuts_long_lines_between_characters() -> None:
    text = "é" * 100 + "\n" + "x" * 10
    pieces = split_utf8(text, 33)
    assert "".join(pieces) == text
    assert all(len(piece.encode()) <= 33 for piece in pieces)


def test_transient_failures_are_retried_and_delivered_once() -> None:
    with Receiver(fail_first=3, fail_status=503) as receiver:
        channels = {
            "ops": {
                "type": "webhook", "url": receiver.url, "secret": SECRET,
                "retry": {"attempts": 4, "backoff_s": 0.01},
            }
        }  # fmt: skip
        store = MemoryChannelStore()
        hub = hub_for(channels, store)
        result = deliver(hub, OutboundMessage("ops", "hello"))
    assert result.delivered and result.attempts == 4
    assert len(receiver.requests) == 4
    # One delivery: every attempt carries the same delivery id, so the receiver keeps one.
    assert len({body["delivery_id"] for body in receiver.bodies()}) == 1
    assert all(receiver_verifies(h, b) for h, b in receiver.requests)
    assert store.dead_letters() == []
    assert [e.event for e in store.entries()] == ["delivered"]


def test_a_permanent_failure_is_not_retried() -> None:
    with Receiver(fail_first=99, fail_status=400) as receiver:
        channels = {"ops": {"type": "webhook", "url": receiver.url, "secret": SECRET}}
        store = MemoryChannelStore()
        result = deliver(hub_for(channels, store), OutboundMessage("ops", "hello"))
    assert not result.delivered and result.attempts == 1 and len(receiver.requests) == 1
    [letter] = store.dead_letters()
    assert "HTTP 400" in letter.error


def test_always_failing_receiver_gives_a_dead_letter_that_resend_delivers(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'state.db'}"
    with Receiver(wecom=True) as receiver:
        receiver.always_fail = True
        channels = {
            "bot": {
                "type": "wecom", "url": receiver.url, "msgtype": "markdown",
                "retry": {"attempts": 3, "backoff_s": 0.01},
            }
        }  # fmt: skip
        config = tmp_path / "config.yaml"
        config.write_text(
            yaml.safe_dump({"storage": {"url": db}, "service": {"channels": channels}})
        )
        store = SqlChannelStore.open(db)
        result = deliver(hub_for(channels, store), OutboundMessage("bot", "**HX101** late"))
        store.close()
        assert not result.delivered and result.attempts == 3
        assert len(receiver.requests) == 3

        runner = CliRunner()
        listed = runner.invoke(cli, ["channels", "dead-letters", "--json", "-c", str(config)])
        assert listed.exit_code == 0, listed.output
        [letter] = json.loads(listed.stdout)
        assert letter["id"] == result.dead_letter_id and letter["attempts"] == 3
        # The rendered message is kept as it would have been sent.
        kept = {"msgtype": "markdown", "markdown": {"content": "**HX101** late"}}
        assert letter["parts"] == [kept]
        assert "HTTP 503" in letter["error"]

        still = runner.invoke(cli, ["channels", "resend", letter["id"][:6], "-c", str(config)])
        assert still.exit_code == 1 and "not delivered" in still.stdout

        receiver.always_fail = False
        before = len(receiver.requests)
        sent = runner.invoke(cli, ["channels", "resend", letter["id"][:6], "-c", str(config)])
        assert sent.exit_code == 0, sent.output
        assert f"delivered {letter['id']}" in sent.stdout
        assert len(receiver.requests) == before + 1
        assert receiver.bodies()[-1] == letter["parts"][0]

        listed = runner.invoke(cli, ["channels", "dead-letters", "--json", "-c", str(config)])
        assert json.loads(listed.stdout) == []
        every = runner.invoke(
            cli, ["channels", "dead-letters", "--all", "--json", "-c", str(config)]
        )
        [done] = json.loads(every.stdout)
        assert done["status"] == "delivered" and done["attempts"] == 3 + 3 + 1
        log = runner.invoke(cli, ["channels", "log", "--json", "-c", str(config)])
        events = [entry["event"] for entry in json.loads(log.stdout)]
        assert events == ["resent", "resend_failed", "dead_lettered"]
        nothing = runner.invoke(cli, ["channels", "resend", "--all", "-c", str(config)])
        assert nothing.exit_code == 0 and "no pending dead letters" in nothing.stdout


# -- email over SMTP ------------------------------------------------------------------------


class Inbox:
    """aiosmtpd's handler: keeps each message received."""

    def __init__(self) -> None:
        self.messages: list[tuple[Envelope, Message]] = []

    async def handle_DATA(self, _server: Any, _session: Session, envelope: Envelope) -> str:
        assert isinstance(envelope.content, bytes)
        self.messages.append((envelope, email.message_from_bytes(envelope.content)))
        return "250 OK"


def _authenticator(_server: Any, _session: Any, _envelope: Any, mechanism: str, data: Any) -> Any:
    ok = isinstance(data, LoginPassword) and (data.login, data.password) == (b"bot", b"pw-123")
    return AuthResult(success=ok, handled=False)


@pytest.fixture(name="certificate")
def self_signed_certificate(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.fixture(name="smtp")
def smtp_server(request: pytest.FixtureRequest, certificate: tuple[Path, Path]) -> Iterator[Any]:
    import ssl

    cert, key = certificate
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    inbox = Inbox()
    port = free_port()
    if request.param == "starttls":
        controller = Controller(
            inbox, hostname="127.0.0.1", port=port, tls_context=context, require_starttls=True,
            authenticator=_authenticator, auth_require_tls=True,
        )  # fmt: skip
    else:
        controller = Controller(
            inbox, hostname="127.0.0.1", port=port, ssl_context=context,
            authenticator=_authenticator, auth_require_tls=False, server_hostname="127.0.0.1",
        )  # fmt: skip
    controller.start()
    try:
        yield request.param, port, cert, inbox
    finally:
        controller.stop()


@pytest.mark.parametrize("smtp", ["starttls", "ssl"], indirect=True)
def test_email_over_smtp_has_plain_and_html_parts(smtp: Any) -> None:
    security, port, cert, inbox = smtp
    channels = {
        "reports": {
            "type": "email", "host": "127.0.0.1", "port": port, "security": security,
            "username": "bot", "password": "pw-123", "ca_file": str(cert),
            "from": "bot@example.com", "to": ["ops@example.com", "lead@example.com"],
            "subject": "Flight report {request_id}", "renderer": "markdown",
        }
    }  # fmt: skip
    hub = hub_for(channels)

    async def go() -> Any:
        try:
            return await hub.deliver_result(result_with_flights(), ["reports"], user_id="alice")
        finally:
            await hub.aclose()

    [delivery] = asyncio.run(go())
    assert delivery.delivered, delivery.error
    [(envelope, message)] = inbox.messages
    assert envelope.mail_from == "bot@example.com"
    assert envelope.rcpt_tos == ["ops@example.com", "lead@example.com"]
    assert message["Subject"] == "Flight report req-1"
    assert message["X-Hermes-Request-Id"] == "req-1"
    assert message.get_content_type() == "multipart/alternative"
    parts = {part.get_content_type(): part for part in message.get_payload()}  # type: ignore[union-attr]
    assert set(parts) == {"text/plain", "text/html"}
    plain = parts["text/plain"].get_payload(decode=True).decode()  # type: ignore[union-attr]
    html = parts["text/html"].get_payload(decode=True).decode()  # type: ignore[union-attr]
    assert "One flight is late." in plain and "| HX101  | 95        | delayed |" in plain
    assert "<table>" in html and "<td>HX101</td>" in html and "<p>One flight is late.</p>" in html


@pytest.mark.parametrize("smtp", ["starttls"], indirect=True)
def test_email_with_a_wrong_password_is_a_dead_letter_at_once(smtp: Any) -> None:
    _, port, cert, inbox = smtp
    channels = {
        "reports": {
            "type": "email", "host": "127.0.0.1", "port": port, "username": "bot",
            "password": "wrong", "ca_file": str(cert), "from": "bot@example.com",
            "to": ["ops@example.com"],
        }
    }  # fmt: skip
    store = MemoryChannelStore()
    result = deliver(hub_for(channels, store), OutboundMessage("reports", "hi"))
    assert not result.delivered and result.attempts == 1 and "login refused" in str(result.error)
    assert inbox.messages == []
    [letter] = store.dead_letters()
    assert letter.parts[0]["text"] == "hi" and letter.parts[0]["to"] == ["ops@example.com"]


# -- configuration --------------------------------------------------------------------------


def test_config_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"service\.channels\.bot\.msgtyp: unknown key.*msgtype"):
        channel_settings({"bot": {"type": "wecom", "url": "https://x", "msgtyp": "text"}})
    with pytest.raises(ConfigError, match=r"service\.channels\.bot\.type: must be one of"):
        channel_settings({"bot": {"type": "fax"}})
    with pytest.raises(ConfigError, match=r"service\.channels\.ops\.secret"):
        channel_settings({"ops": {"type": "webhook", "url": "https://x", "secret": "short"}})
    with pytest.raises(ConfigError, match=r"inbound\.copy_to: no channel 'mail'"):
        channel_settings(
            {"bot": {"type": "wecom", "url": "https://x", "inbound": {
                "secret": SECRET, "copy_to": ["mail"]}}}
        )  # fmt: skip
    with pytest.raises(ConfigError, match=r"fallback needs fallback_field"):
        channel_settings(
            {"bot": {"type": "wecom", "url": "https://x", "inbound": {
                "secret": SECRET, "on_missing_user": "fallback"}}}
        )  # fmt: skip
    with pytest.raises(ConfigError, match=r"service\.channels\.bot\.renderer: unknown output"):
        ChannelHub(
            channel_settings({"bot": {"type": "wecom", "url": "https://x", "renderer": "nope"}}),
            store=MemoryChannelStore(),
            renderers={"text": lambda view: view.output},
        )


def test_the_sql_store_keeps_dead_letters_and_the_log(sql_url: str) -> None:
    from hermes_agent.channels import DeadLetter, LogEntry

    store = SqlChannelStore.open(sql_url)
    try:
        parts = [{"msgtype": "text", "text": {"content": "航班 late"}}]
        letter = DeadLetter("a1", "bot", 1.0, parts, "HTTP 503", 3, user_id="bot:u", request_id="r")
        store.add_dead_letter(letter)
        store.add_dead_letter(DeadLetter("b2", "ops", 2.0, [{"x": 1}], "timeout", 4))
        assert [d.id for d in store.dead_letters()] == ["a1", "b2"]
        assert store.dead_letters(channel="bot") == [letter]
        from hermes_agent.channels.store import delivered

        store.update_dead_letter(delivered(letter, 1))
        assert [d.id for d in store.dead_letters()] == ["b2"]
        found = store.get_dead_letter("a1")
        assert found is not None and found.status == "delivered" and found.attempts == 4
        assert found.parts == parts
        store.log(LogEntry(1.0, "bot", "accepted", "bot:u", "r", "via external_userid"))
        store.log(LogEntry(2.0, "bot", "quota_rejected", "bot:u", None, "runs_per_day"))
        assert [e.event for e in store.entries()] == ["quota_rejected", "accepted"]
        [entry] = store.entries(event="quota_rejected")
        assert entry.user_id == "bot:u" and entry.request_id is None
    finally:
        store.close()


def test_a_delivery_cut_short_by_shutdown_is_kept_as_a_dead_letter() -> None:
    import socket

    with socket.socket() as silent:  # accepts connections (backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/hook"
        store = MemoryChannelStore()
        hub = hub_for({"ops": {"type": "webhook", "url": url, "secret": SECRET}}, store)

        async def go() -> None:
            task = asyncio.create_task(hub.deliver(OutboundMessage("ops", "the answer")))
            silent.settimeout(10)
            held, _ = await asyncio.to_thread(silent.accept)  # the delivery is under way
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await hub.aclose()
            held.close()

        asyncio.run(go())
    [letter] = store.dead_letters()
    assert letter.parts[0]["content"] == "the answer" and "shut down" in letter.error
