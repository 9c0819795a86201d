"""examples/flight_delays.py: one answer, rendered short for the WeCom bot (a loopback receiver)
and in full for email (aiosmtpd), and printed when no channel is configured."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller

from server_harness import free_port
from test_channels import Inbox, Receiver

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "flight_delays.py"
LATE = ["KA302", "HX230", "HX101", "UO880", "UO621", "UO512", "HX612"]  # ≥ 30 min, worst first


def run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTS_")}
    return subprocess.run(
        [sys.executable, str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean, **env},
    )


def test_the_chat_app_gets_the_worst_delays_and_email_the_full_report() -> None:
    inbox = Inbox()
    port = free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        with Receiver(wecom=True) as bot:
            done = run(
                {
                    "FLIGHTS_WECOM_URL": bot.url,
                    "FLIGHTS_SMTP_HOST": "127.0.0.1",
                    "FLIGHTS_SMTP_PORT": str(port),
                    "FLIGHTS_SMTP_SECURITY": "none",
                    "FLIGHTS_MAIL_TO": "ops@example.com",
                }
            )
            assert done.returncode == 0, done.stderr
            assert sorted(done.stdout.split("\n")[:2]) == ["email: delivered", "wecom: delivered"]
            [chat] = bot.bodies()
    finally:
        controller.stop()

    assert chat["msgtype"] == "markdown"
    brief = chat["markdown"]["content"]
    assert len(brief.encode()) <= 4096
    rows = [line for line in brief.splitlines() if re.search(r"\d+ min\s*\|$", line)]
    shown = [row.split("|")[1].strip() for row in rows]  # cells are padded to line up
    assert shown == LATE[:5]  # filtered (≥ 30 min), worst first, shortened to five
    assert "KA870" not in brief and "CX250" not in brief  # 15 min late, on time
    assert "…and 2 more" in brief

    [(envelope, message)] = inbox.messages
    assert envelope.rcpt_tos == ["ops@example.com"]
    assert message["Subject"] == "Departure delays"
    parts: dict[str, Any] = {p.get_content_type(): p for p in message.get_payload()}  # type: ignore[union-attr]
    html = parts["text/html"].get_payload(decode=True).decode()
    plain = parts["text/plain"].get_payload(decode=True).decode()
    for flight in ["HX101", "CX250", "KA870", "KA302", "HX780", "UO621"]:  # every departure
        assert f"<td>{flight}</td>" in html and re.search(rf"^\| {flight} +\|", plain, re.M)
    assert "<h1>Departure delays</h1>" in html
    assert "Delayed: 9 (average delay 75 min)" in plain
    assert "7 of 12 departures from HKG are delayed" in plain


def test_without_channels_it_prints_what_each_would_get() -> None:
    done = run({})
    assert done.returncode == 0, done.stderr
    chat, report = done.stdout.split("--- email (flight_report) ---")
    assert chat.startswith("--- wecom (flight_brief) ---\n**7 delayed departures**")
    assert "CX250" not in chat and "CX250" in report
