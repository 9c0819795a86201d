"""One answer, rendered per channel: a short list of the worst delays for a chat-app bot, the full
report for email.

    python examples/flight_delays.py              # prints what each channel would get
    FLIGHTS_WECOM_URL=https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=... \\
    FLIGHTS_SMTP_HOST=smtp.example.com FLIGHTS_SMTP_PORT=587 FLIGHTS_SMTP_SECURITY=starttls \\
    FLIGHTS_SMTP_USER=bot@example.com FLIGHTS_SMTP_PASSWORD=... FLIGHTS_MAIL_TO=ops@example.com \\
    python examples/flight_delays.py              # delivers them

The model is scripted (it calls ``flight_status`` and sums up), so the example runs offline; a
real model calls the same tool. The two renderers are registered on the agent by name, and each
channel names the one it uses (``renderer:``), as in the service's ``service.channels``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from hermes_agent import Agent, Message, RenderInput, ScriptedModel, markdown_table
from hermes_agent.channels import ChannelHub, MemoryChannelStore, channel_settings, render_input

BRIEF_MIN_DELAY = 30
"""Minutes of delay from which a flight is worth a chat message."""
BRIEF_ROWS = 5


def flight_status(airport: str) -> list[dict[str, Any]]:
    """Today's departures from an airport, with their delays in minutes (demo data)."""
    rows = [
        ("HX101", "NRT", "08:05", 95, "A12", "late inbound aircraft"),
        ("CX250", "LHR", "08:40", 0, "B3", ""),
        ("UO512", "TPE", "09:10", 45, "A7", "air traffic control"),
        ("KA870", "PEK", "09:25", 15, "C2", "boarding"),
        ("HX230", "BKK", "10:00", 130, "A15", "crew rest"),
        ("CX711", "SIN", "10:30", 0, "B9", ""),
        ("UO880", "KIX", "11:15", 60, "A3", "weather at destination"),
        ("HX612", "MNL", "11:50", 35, "A9", "baggage loading"),
        ("CX888", "YVR", "12:20", 5, "B1", ""),
        ("KA302", "PVG", "13:05", 240, "C6", "technical check"),
        ("HX780", "DPS", "13:40", 0, "A2", ""),
        ("UO621", "CTS", "14:10", 50, "A11", "late inbound aircraft"),
    ]
    return [
        {
            "flight": flight,
            "from": airport.upper(),
            "to": to,
            "scheduled": scheduled,
            "delay_min": delay,
            "gate": gate,
            "reason": reason,
        }
        for flight, to, scheduled, delay, gate, reason in rows
    ]


def script(messages: Sequence[Message], _tools: Sequence[dict[str, Any]]) -> str:
    """The scripted model: call the tool, then sum up what it returned."""
    if messages[-1].role != "tool":
        call = {"name": "flight_status", "arguments": {"airport": "HKG"}}
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
    flights = messages[-1].tool_results[0].content["data"]  # {"status", "data", "error"}
    late = [f for f in flights if f["delay_min"] >= BRIEF_MIN_DELAY]
    worst = max(flights, key=lambda f: f["delay_min"])
    return (
        f"{len(late)} of {len(flights)} departures from HKG are delayed by "
        f"{BRIEF_MIN_DELAY} minutes or more; the longest is {worst['flight']} to "
        f"{worst['to']} ({worst['delay_min']} min, {worst['reason']})."
    )


def flight_brief(view: RenderInput) -> str:
    """For the chat app: only flights late by ``BRIEF_MIN_DELAY`` minutes or more, worst first,
    at most ``BRIEF_ROWS`` of them, three columns."""
    flights = view.latest_records() or []
    late = sorted(
        (f for f in flights if f.get("delay_min", 0) >= BRIEF_MIN_DELAY),
        key=lambda f: -f["delay_min"],
    )
    if not late:
        return "No departures are delayed by more than half an hour."
    shown = [
        {"Flight": f["flight"], "To": f["to"], "Delay": f"{f['delay_min']} min"}
        for f in late[:BRIEF_ROWS]
    ]
    lines = [f"**{len(late)} delayed departures**", "", markdown_table(shown)]
    if len(late) > BRIEF_ROWS:
        lines += ["", f"…and {len(late) - BRIEF_ROWS} more; the full report is in your email."]
    return "\n".join(lines)


def flight_report(view: RenderInput) -> str:
    """For email: the answer, a summary, and every flight with its gate and reason."""
    flights = view.latest_records() or []
    late = [f for f in flights if f.get("delay_min", 0) > 0]
    average = sum(f["delay_min"] for f in late) / len(late) if late else 0.0
    rows = [
        {
            "Flight": f["flight"],
            "To": f["to"],
            "Scheduled": f["scheduled"],
            "Delay (min)": f["delay_min"],
            "Gate": f["gate"],
            "Reason": f["reason"] or "—",
        }
        for f in sorted(flights, key=lambda f: f["scheduled"])
    ]
    return "\n".join(
        [
            "# Departure delays",
            "",
            view.output,
            "",
            "## Summary",
            "",
            f"- Departures: {len(flights)}",
            f"- Delayed: {len(late)} (average delay {average:.0f} min)",
            f"- On time: {len(flights) - len(late)}",
            "",
            "## Every departure",
            "",
            markdown_table(rows) if rows else "No departures.",
        ]
    )


def build_agent() -> Agent:
    """The agent: the scripted model, the tool, and the two renderers by name."""
    agent = Agent(model=ScriptedModel(script), tools=[flight_status])
    agent.add_renderer("flight_brief", flight_brief)
    agent.add_renderer("flight_report", flight_report)
    return agent


def channels_from_environment() -> dict[str, Any]:
    """The channels the environment configures (none: print instead of sending)."""
    channels: dict[str, Any] = {}
    if os.environ.get("FLIGHTS_WECOM_URL"):
        channels["wecom"] = {
            "type": "wecom",
            "url": os.environ["FLIGHTS_WECOM_URL"],
            "msgtype": "markdown",
            "renderer": "flight_brief",
        }
    if os.environ.get("FLIGHTS_SMTP_HOST"):
        channels["email"] = {
            "type": "email",
            "host": os.environ["FLIGHTS_SMTP_HOST"],
            "port": int(os.environ.get("FLIGHTS_SMTP_PORT", "587")),
            "security": os.environ.get("FLIGHTS_SMTP_SECURITY", "starttls"),
            "username": os.environ.get("FLIGHTS_SMTP_USER"),
            "password": os.environ.get("FLIGHTS_SMTP_PASSWORD"),
            "from": os.environ.get("FLIGHTS_MAIL_FROM", "flights@example.com"),
            "to": os.environ.get("FLIGHTS_MAIL_TO", "ops@example.com").split(","),
            "subject": "Departure delays",
            "renderer": "flight_report",
        }
    return channels


async def main() -> int:
    agent = build_agent()
    result = await agent.arun("Which departures from HKG are delayed?")
    configured = channels_from_environment()
    if not configured:  # show what each channel would get
        for name, renderer in (("wecom", "flight_brief"), ("email", "flight_report")):
            print(f"--- {name} ({renderer}) ---")
            print(agent.renderers[renderer](render_input(result)))
        return 0
    hub = ChannelHub(
        channel_settings(configured), store=MemoryChannelStore(), renderers=agent.renderers
    )
    try:
        deliveries = await hub.deliver_result(result, configured, user_id="ops")
    finally:
        await hub.aclose()
    for delivery in deliveries:
        outcome = "delivered" if delivery.delivered else f"dead letter ({delivery.error})"
        print(f"{delivery.channel}: {outcome}")
    return 0 if all(d.delivered for d in deliveries) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
