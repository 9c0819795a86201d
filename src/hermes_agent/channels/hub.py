"""``ChannelHub``: the configured channels' senders, rendering per channel, delivery with
retries, dead letters and resends.

    hub = ChannelHub(channel_settings(raw), store=MemoryChannelStore(), agent=agent)
    result = await agent.arun("Which flights are late?")
    await hub.deliver_result(result, ["wecom", "reports"])   # each rendered its own way
    await hub.aclose()

Each part of a message is tried ``retry.attempts`` times, waiting ``backoff_s``, then twice as
long each time (at most ``max_backoff_s``; a receiver's ``Retry-After`` up to that), on
transient failures only. A part that still fails becomes a dead letter with itself and the
parts after it (so a resend keeps their order); the channel log records the delivery or the
dead letter.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hermes_agent.channels.config import ChannelSettings
from hermes_agent.channels.senders import DeliveryError, OutboundMessage, Sender, make_sender
from hermes_agent.channels.store import (
    ChannelStore,
    DeadLetter,
    LogEntry,
    delivered,
    new_dead_letter_id,
)
from hermes_agent.errors import ConfigError, HermesAgentError
from hermes_agent.pipeline.renderers import BUILTIN_RENDERERS, Renderer, RenderInput
from hermes_agent.types import RunResult, ToolCallRecord

logger = logging.getLogger("hermes_agent.channels")

_RECORD_FIELDS = {f.name for f in dataclasses.fields(ToolCallRecord)}


@dataclass(frozen=True, slots=True)
class Delivery:
    """How a delivery went: ``delivered``, or the dead letter it left; ``attempts`` in all."""

    channel: str
    delivered: bool
    attempts: int
    dead_letter_id: str | None = None
    error: str | None = None


def render_input(result: RunResult | Mapping[str, Any]) -> RenderInput:
    """What a renderer sees, from a ``RunResult`` or its JSON form (the service's)."""
    if isinstance(result, RunResult):
        return RenderInput(result.output, result.status, list(result.tool_calls))
    calls = [
        ToolCallRecord(**{k: v for k, v in call.items() if k in _RECORD_FIELDS})
        for call in result.get("tool_calls") or []
    ]
    return RenderInput(str(result.get("output") or ""), int(result.get("status") or 200), calls)


class ChannelHub:
    """The channels of a config: one sender each, sharing a store for dead letters and the
    log. ``renderers`` are the output formats by name (an agent's ``renderers``), each channel's
    checked at once; without them the built-in ones render and nothing is checked (enough to
    resend dead letters, which are rendered already); ``sleep`` is how retries wait."""

    def __init__(
        self,
        channels: Mapping[str, ChannelSettings],
        *,
        store: ChannelStore,
        renderers: Mapping[str, Renderer] | None = None,
        source: str = "<settings>",
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.settings = dict(channels)
        self.store = store
        self.renderers = dict(renderers if renderers is not None else BUILTIN_RENDERERS)
        for name, channel in self.settings.items():
            if renderers is not None and channel.renderer not in self.renderers:
                raise ConfigError(
                    f"{source}: service.channels.{name}.renderer: unknown output format "
                    f"{channel.renderer!r}; use one of: {', '.join(self.renderers)} "
                    "(or add it under renderers: in the config)"
                )
        self.senders: dict[str, Sender] = {
            name: make_sender(name, channel) for name, channel in self.settings.items()
        }
        self._sleep = sleep
        self.attempts_made = 0
        """Every attempt to send a part, for tests and metrics."""

    # -- rendering --------------------------------------------------------------------------

    def sender(self, channel: str) -> Sender:
        if channel not in self.senders:
            raise HermesAgentError(
                f"unknown channel {channel!r}; configured: {', '.join(self.senders) or 'none'}"
            )
        return self.senders[channel]

    def render(self, channel: str, result: RunResult | Mapping[str, Any]) -> str:
        """The answer of ``result`` as ``channel``'s renderer writes it."""
        self.sender(channel)
        name = self.settings[channel].renderer
        if name not in self.renderers:
            raise HermesAgentError(f"channel {channel!r}: unknown output format {name!r}")
        return self.renderers[name](render_input(result))

    def message(
        self, channel: str, result: RunResult | Mapping[str, Any], *, user_id: str | None = None
    ) -> OutboundMessage:
        """``result`` rendered for ``channel``, ready to deliver."""
        request_id = (
            result.request_id if isinstance(result, RunResult) else result.get("request_id")
        )
        return OutboundMessage(
            channel=channel,
            content=self.render(channel, result),
            format=self.settings[channel].renderer,
            user_id=user_id,
            request_id=request_id,
        )

    # -- delivering -------------------------------------------------------------------------

    async def deliver_result(
        self,
        result: RunResult | Mapping[str, Any],
        channels: Iterable[str],
        *,
        user_id: str | None = None,
    ) -> list[Delivery]:
        """Render ``result`` for each channel and deliver them all at once."""
        messages = [self.message(name, result, user_id=user_id) for name in channels]
        return list(await asyncio.gather(*(self.deliver(m) for m in messages)))

    async def deliver(self, message: OutboundMessage) -> Delivery:
        """Deliver a rendered message; after the last retry it becomes a dead letter."""
        sender = self.sender(message.channel)
        parts = sender.parts(message)
        try:
            sent, attempts, error = await self._send_parts(message.channel, parts)
        except asyncio.CancelledError:  # shutting down: keep what was not sent
            await self._dead_letter(message, parts, 0, "interrupted: the service shut down")
            raise
        if error is None:
            await self._log(message.channel, "delivered", message, f"{len(parts)} part(s)")
            return Delivery(message.channel, True, attempts)
        letter = await self._dead_letter(message, parts[sent:], attempts, error)
        return Delivery(message.channel, False, attempts, letter.id, error)

    async def _dead_letter(
        self, message: OutboundMessage, parts: list[dict[str, Any]], attempts: int, error: str
    ) -> DeadLetter:
        letter = DeadLetter(
            id=new_dead_letter_id(),
            channel=message.channel,
            created=time.time(),
            parts=parts,
            error=error,
            attempts=attempts,
            kind=message.kind,
            user_id=message.user_id,
            request_id=message.request_id,
        )
        await self._store(self.store.add_dead_letter, letter)
        logger.warning(
            "channel %s: not delivered after %d attempt(s), dead letter %s: %s",
            message.channel,
            attempts,
            letter.id,
            error,
        )
        await self._log(message.channel, "dead_lettered", message, f"{letter.id}: {error}")
        return letter

    async def resend(self, letter_id: str) -> Delivery:
        """Deliver a dead letter again (its parts as they were rendered, signed afresh); marked
        ``delivered`` when it went through, else kept with the new error."""
        letter = await asyncio.to_thread(self.store.get_dead_letter, letter_id)
        if letter is None:
            raise HermesAgentError(f"no dead letter {letter_id!r}")
        if letter.status == "delivered":
            return Delivery(letter.channel, True, 0, letter.id)
        sent, attempts, error = await self._send_parts(letter.channel, letter.parts)
        entry = OutboundMessage(
            letter.channel, "", user_id=letter.user_id, request_id=letter.request_id
        )
        if error is None:
            await self._store(self.store.update_dead_letter, delivered(letter, attempts))
            await self._log(letter.channel, "resent", entry, letter.id)
            return Delivery(letter.channel, True, attempts, letter.id)
        kept = dataclasses.replace(
            letter, parts=letter.parts[sent:], error=error, attempts=letter.attempts + attempts
        )
        await self._store(self.store.update_dead_letter, kept)
        await self._log(letter.channel, "resend_failed", entry, f"{letter.id}: {error}")
        return Delivery(letter.channel, False, attempts, letter.id, error)

    async def _send_parts(
        self, channel: str, parts: list[dict[str, Any]]
    ) -> tuple[int, int, str | None]:
        """Send parts in order: (parts sent, attempts made, the error that stopped it)."""
        sender = self.sender(channel)
        retry = self.settings[channel].retry
        attempts = 0
        for index, part in enumerate(parts):
            for attempt in range(retry.attempts):
                attempts += 1
                self.attempts_made += 1
                try:
                    await sender.send_part(part)
                    break
                except DeliveryError as exc:
                    last = attempt == retry.attempts - 1
                    if not exc.transient or last:
                        return index, attempts, str(exc)
                    delay = min(retry.max_backoff_s, retry.backoff_s * 2**attempt)
                    if exc.retry_after is not None:
                        delay = min(retry.max_backoff_s, max(delay, exc.retry_after))
                    logger.info("channel %s: %s; retrying in %.2f s", channel, exc, delay)
                    await self._sleep(delay)
        return len(parts), attempts, None

    async def _store(self, write: Callable[[DeadLetter], None], letter: DeadLetter) -> None:
        # Shielded: a delivery cancelled while it records its dead letter still records it.
        await asyncio.shield(asyncio.to_thread(write, letter))

    async def _log(
        self, channel: str, event: str, message: OutboundMessage, detail: str = ""
    ) -> None:
        await self.record(
            LogEntry(time.time(), channel, event, message.user_id, message.request_id, detail)
        )

    async def record(self, entry: LogEntry) -> None:
        """Add to the channel log (a store that fails is logged, never raised)."""
        try:
            await asyncio.to_thread(self.store.log, entry)
        except Exception:
            logger.exception("cannot write the channel log entry %s", entry)

    async def aclose(self) -> None:
        """Close the senders' connections (not the store, which its opener closes)."""
        for sender in self.senders.values():
            await sender.aclose()
