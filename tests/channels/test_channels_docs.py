"""docs/channels.md: the config block validates as the page says, and the ``run: python``
blocks run in order in one namespace — the receiver's check against a real signed delivery,
the relay's inbound request against a real service, printing the output the page shows."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
from pathlib import Path

import pytest
import yaml

from hermes_agent.channels import ChannelHub, MemoryChannelStore, OutboundMessage, channel_settings
from hermes_agent.channels.config import EmailChannel, WebhookChannel, WecomChannel
from hermes_agent.config import parse_config
from hermes_agent.runs.settings import service_settings
from hermes_agent.server import ServiceSettings, create_app
from server_harness import make_agent, serve, wait_for
from test_channels import SECRET, Receiver

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "channels.md").read_text(encoding="utf-8")
RELAY_SECRET = "relay-secret-for-the-docs-0123"


def blocks(marker: str, language: str) -> list[str]:
    return re.findall(rf"<!-- {re.escape(marker)} -->\n```{language}\n(.*?)```", PAGE, re.S)


def test_the_config_block_validates(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPS_WEBHOOK_SECRET", "WECOM_RELAY_SECRET", "SMTP_PASSWORD"):
        monkeypatch.setenv(name, "a-long-enough-secret-0123456789")
    monkeypatch.setenv("WECOM_BOT_KEY", "k")
    [block] = blocks("tested: tests/channels/test_channels_docs.py", "yaml")
    config = parse_config(yaml.safe_load(block), source="channels.md")
    settings = service_settings(config)
    channels = channel_settings(settings.channels, source="channels.md")
    assert isinstance(channels["ops"], WebhookChannel)
    assert isinstance(channels["wecom"], WecomChannel)
    assert isinstance(channels["reports"], EmailChannel)
    inbound = channels["wecom"].inbound
    assert inbound is not None and inbound.copy_to == ["reports"]
    assert inbound.on_missing_user == "reject"  # the default the page states
    assert channels["wecom"].retry.attempts == 5
    assert channels["reports"].smtp_port == 587


def test_the_payload_blocks_show_what_the_senders_send() -> None:
    webhook, wecom = (json.loads(b) for b in re.findall(r"```json\n(.*?)```", PAGE, re.S))
    hub = ChannelHub(
        channel_settings(
            {
                "ops": {"type": "webhook", "url": "http://127.0.0.1:9/", "secret": SECRET},
                "bot": {"type": "wecom", "url": "http://127.0.0.1:9/"},
            }
        ),
        store=MemoryChannelStore(),
    )
    [sent] = hub.sender("ops").parts(OutboundMessage("ops", "x", user_id="u", request_id="r"))
    assert set(sent) == set(webhook)
    [sent] = hub.sender("bot").parts(OutboundMessage("bot", "x"))
    assert set(sent) == set(wecom) and sent["msgtype"] == wecom["msgtype"]
    asyncio.run(hub.aclose())


def test_the_python_blocks_run_against_a_real_receiver_and_service(tmp_path: Path) -> None:
    first, second = blocks("run: python", "python")
    [expected] = re.findall(r"<!-- output -->\n```text\n(.*?)```", PAGE, re.S)
    namespace: dict[str, object] = {"__name__": "channels_docs"}
    exec(compile(first, "channels.md (python block 1)", "exec"), namespace)

    with Receiver() as receiver:  # a real delivery, checked by the page's receiver code
        hub = ChannelHub(
            channel_settings({"ops": {"type": "webhook", "url": receiver.url, "secret": SECRET}}),
            store=MemoryChannelStore(),
        )

        async def go() -> None:
            await hub.deliver(OutboundMessage("ops", "hello"))
            await hub.aclose()

        asyncio.run(go())
    [(headers, body)] = receiver.requests
    verified = namespace["verified"]
    assert callable(verified)
    assert verified(SECRET, headers, body) is True
    assert verified("another-secret-0123456789", headers, body) is False

    url = f"sqlite:///{tmp_path / 'state.db'}"
    with Receiver(wecom=True) as bot:
        channels = {
            "wecom": {
                "type": "wecom",
                "url": bot.url,
                "inbound": {
                    "secret": RELAY_SECRET,
                    "message_field": "text.content",
                    "user_field": "external_userid",
                    "session_field": "conversation_id",
                },
            }
        }
        app = create_app(
            agent=make_agent(url), settings=ServiceSettings(keys_url=url, channels=channels)
        )
        with serve(app) as service:
            namespace.update(service=service, relay_secret=RELAY_SECRET)
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                exec(compile(second, "channels.md (python block 2)", "exec"), namespace)
            assert printed.getvalue() == expected
            wait_for(lambda: len(bot.requests) == 1)
        assert bot.bodies()[0]["msgtype"] == "markdown"
