"""``POST /v1/channels/{name}/inbound``: a chat app's (or a relay's) message, answered through the
channel's sender.

The request authenticates by its signature, not an API key: ``X-Hermes-Timestamp`` and
``X-Hermes-Signature`` (HMAC-SHA256 over ``<timestamp>.<body>`` with the channel's inbound
secret; ``hermes_agent.channels.signing``); a bad signature or a timestamp outside the replay
window is ``401`` and nothing runs, the same signature twice within the window ``409`` — on
every process of the service that shares its store, and after a restart (the signatures seen
are kept in the channel store, ``hermes_channel_signatures``). The
payload is mapped to a message and to the service's user ``<namespace>~<stable id>``
(``hermes_agent.channels.inbound``); the run goes through the run backend like every other, so
that user's limits and daily quotas apply. The answer is ``202`` with the request id at once;
the run's answer, rendered with the channel's renderer (and for each ``copy_to`` channel with
its own), goes out through the senders afterwards. Over quota, the user gets the channel's
``quota_message`` through the sender and nothing runs. Every outcome is a row in the channel
log (``hermes_channel_log``) with the user id used.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Header, HTTPException, Request
from pydantic import BaseModel
from starlette.responses import JSONResponse, Response

from hermes_agent.agent import Agent
from hermes_agent.channels.config import ChannelSettings, channel_settings
from hermes_agent.channels.hub import ChannelHub
from hermes_agent.channels.inbound import InboundMessage, InboundRefused, map_inbound
from hermes_agent.channels.senders import OutboundMessage
from hermes_agent.channels.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, verify
from hermes_agent.channels.store import LogEntry, channel_store_for
from hermes_agent.config import HermesConfig
from hermes_agent.errors import HermesAgentError
from hermes_agent.runs.backend import RunBackend, RunView
from hermes_agent.runs.gate import RunRejected
from hermes_agent.runs.keys import KeyStore
from hermes_agent.runs.principal import Principal
from hermes_agent.runs.quotas import Quotas
from hermes_agent.runs.request import RunRequest
from hermes_agent.runs.settings import ServiceSettings
from hermes_agent.server.api_models import errors

logger = logging.getLogger("hermes_agent.channels")


class InboundAccepted(BaseModel):
    """The answer to an inbound message: taken (``accepted``, the run's ``request_id``) or
    answered with the quota message (``quota_exceeded``, no run)."""

    inbound_id: str
    status: str
    request_id: str | None = None
    user_id: str


class ChannelService:
    """The hub and the answers being delivered."""

    def __init__(self, hub: ChannelHub | None, grace_s: float) -> None:
        self.hub = hub
        self.grace_s = grace_s
        self.tasks: set[asyncio.Task[None]] = set()

    def spawn(self, work: Any) -> None:
        task: asyncio.Task[None] = asyncio.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def shutdown(self) -> None:
        """Let answers in flight go out for the grace period, then stop them (a rendered
        answer that was being sent becomes a dead letter)."""
        if self.tasks:
            _, pending = await asyncio.wait(set(self.tasks), timeout=self.grace_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=5)
        if self.hub is not None:
            await self.hub.aclose()
            self.hub.store.close()


def router_for(
    settings: ServiceSettings, agent: Agent, keys: KeyStore, config: HermesConfig | None = None
) -> APIRouter:
    """The channels' router for an app: validates ``service.channels`` now (``ConfigError``
    naming the key) and keeps the dead letters and the channel log beside the API keys."""
    source = config.source if config is not None else "<settings>"
    channels = channel_settings(settings.channels, source=source)
    hub = None
    if channels:
        hub = ChannelHub(
            channels, store=channel_store_for(keys), renderers=agent.renderers, source=source
        )
    service = ChannelService(hub, settings.shutdown_grace_s)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.channels = service
        try:
            yield
        finally:
            await service.shutdown()

    router = APIRouter(prefix="/v1", lifespan=lifespan)

    @router.post(
        "/channels/{name}/inbound",
        status_code=202,
        response_model=InboundAccepted,
        responses=errors(400, 401, 404, 409, 413, 422, 429, 503),
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"type": "object"}}},
            }
        },
        tags=["channels"],
    )
    async def inbound(
        name: str,
        request: Request,
        timestamp: Annotated[str | None, Header(alias=TIMESTAMP_HEADER)] = None,
        signature: Annotated[str | None, Header(alias=SIGNATURE_HEADER)] = None,
    ) -> Response:
        """A message from the channel ``name``, signed with its inbound secret; answered
        ``202`` at once, the answer going out through the channel's sender."""
        channel = channels.get(name)
        if hub is None or channel is None or channel.inbound is None:
            raise HTTPException(404, f"no channel {name!r} takes inbound messages")
        inbound_settings = channel.inbound
        body = await request.body()
        why = verify(
            inbound_settings.secret,
            timestamp,
            signature,
            body,
            window_s=inbound_settings.replay_window_s,
        )
        if why is not None:
            await _log(hub, name, "rejected_signature", detail=why)
            raise HTTPException(401, f"refused: {why}")
        assert signature is not None
        # Remembered in the store until no timestamp it could carry is inside the window
        # (which reaches both ways): shared by every process, kept across restarts.
        expires = time.time() + 2 * inbound_settings.replay_window_s
        try:
            first = await asyncio.to_thread(hub.store.first_time, name, signature.strip(), expires)
        except Exception:
            logger.exception("channel %s: cannot check the signature against the store", name)
            raise HTTPException(
                503, "the channel store cannot be reached; nothing ran, send it again later"
            ) from None
        if not first:
            await _log(hub, name, "rejected_replay", detail="signature seen before")
            raise HTTPException(409, "this request was received already (same signature)")
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError):  # nested past what the parser goes: not JSON here
            await _log(hub, name, "bad_payload", detail="not JSON")
            raise HTTPException(400, "the body is not valid JSON") from None
        try:
            mapped = map_inbound(name, inbound_settings, payload)
        except InboundRefused as exc:
            await _log(hub, name, exc.event, detail=exc.message)
            raise HTTPException(exc.status_code, exc.message) from None
        quotas: Quotas = request.app.state.quotas
        backend: RunBackend = request.app.state.backend
        inbound_id = uuid.uuid4().hex
        run_request = RunRequest(
            message=mapped.message, session_id=mapped.session_id, output_format=channel.renderer
        )
        try:
            run = await backend.start(Principal(mapped.user_id), run_request, listening=False)
        except RunRejected as exc:
            if exc.status_code == 429 and await asyncio.to_thread(
                _over_quota, quotas, mapped.user_id
            ):
                await _log(hub, name, "quota_rejected", mapped, detail=exc.message)
                polite = OutboundMessage(
                    name, channel.quota_message, user_id=mapped.user_id, kind="quota"
                )
                service.spawn(_deliver_quietly(hub, polite))
                accepted = InboundAccepted(
                    inbound_id=inbound_id, status="quota_exceeded", user_id=mapped.user_id
                )
                return JSONResponse(accepted.model_dump(), 202)
            await _log(hub, name, "rejected_limit", mapped, detail=exc.message)
            raise
        except HermesAgentError as exc:
            await _log(hub, name, "rejected", mapped, detail=str(exc))
            raise HTTPException(422, str(exc)) from None
        await _log(
            hub,
            name,
            "accepted",
            mapped,
            request_id=run.request_id,
            detail=f"via {mapped.used_field}",
        )
        service.spawn(_answer(hub, name, channel, mapped, backend, run))
        accepted = InboundAccepted(
            inbound_id=inbound_id,
            status="accepted",
            request_id=run.request_id,
            user_id=mapped.user_id,
        )
        return JSONResponse(accepted.model_dump(), 202)

    return router


def _over_quota(quotas: Quotas, user_id: str) -> bool:
    """Whether ``user_id`` has spent a daily quota (as opposed to another limit's 429)."""
    if not quotas.applies_to(user_id):
        return False
    limits = quotas.settings.limits_for(user_id)
    usage = quotas.usage(user_id)
    return (limits.runs_per_day is not None and usage.runs >= limits.runs_per_day) or (
        limits.tokens_per_day is not None and usage.tokens >= limits.tokens_per_day
    )


async def _log(
    hub: ChannelHub,
    channel: str,
    event: str,
    mapped: InboundMessage | None = None,
    *,
    request_id: str | None = None,
    detail: str = "",
) -> None:
    user = mapped.user_id if mapped is not None else None
    await hub.record(LogEntry(time.time(), channel, event, user, request_id, detail))


async def _deliver_quietly(hub: ChannelHub, message: OutboundMessage) -> None:
    try:
        await hub.deliver(message)
    except Exception:
        logger.exception("channel %s: cannot deliver a %s message", message.channel, message.kind)


APPROVAL_POLL_S = 0.25
"""How often a channel's answer looks again at a run that waits for an approval."""


async def _answer(
    hub: ChannelHub,
    name: str,
    channel: ChannelSettings,
    mapped: InboundMessage,
    backend: RunBackend,
    started: RunView,
) -> None:
    """Wait for the run to end, then send its answer through the channel (and its
    ``copy_to``)."""
    principal = Principal(mapped.user_id)
    run = started
    try:
        while True:
            run = await backend.wait(started.request_id, principal)
            if run.done:
                break
            await asyncio.sleep(APPROVAL_POLL_S)  # waiting for an approval
    except asyncio.CancelledError:  # shut down before the run ended: nothing to send
        await _log(hub, name, "answer_interrupted", mapped, request_id=started.request_id)
        raise
    if run.status != "completed" or run.result is None:
        await _log(
            hub,
            name,
            "run_" + run.status,
            mapped,
            request_id=run.request_id,
            detail=run.error or "",
        )
        failure = OutboundMessage(
            name,
            channel.failure_message,
            user_id=mapped.user_id,
            request_id=run.request_id,
            kind="failure",
        )
        await _deliver_quietly(hub, failure)
        return
    targets = [name, *(channel.inbound.copy_to if channel.inbound else [])]
    for target in dict.fromkeys(targets):
        try:
            message = hub.message(target, run.result, user_id=mapped.user_id)
        except Exception as exc:  # a renderer that fails: the user still hears something
            logger.exception("channel %s: cannot render the answer of %s", target, run.request_id)
            await _log(
                hub, target, "render_failed", mapped, request_id=run.request_id, detail=str(exc)
            )
            message = OutboundMessage(
                target,
                hub.settings[target].failure_message,
                user_id=mapped.user_id,
                request_id=run.request_id,
                kind="failure",
            )
        await _deliver_quietly(hub, message)
