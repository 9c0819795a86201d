"""What the store holds, scoped to the caller: sessions, a run's stage records and their JSONL
export; and the operational endpoints (health, readiness, metrics)."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from starlette.responses import PlainTextResponse, Response

from hermes_agent.audit.records import AuditRecord
from hermes_agent.runs.backend import RunBackend
from hermes_agent.runs.keys import KeyStore
from hermes_agent.runs.metrics import ServiceMetrics
from hermes_agent.runs.principal import Principal, client_session_id, stored_session_id
from hermes_agent.runs.trail import StoreProbe
from hermes_agent.server.api_models import (
    AUTHENTICATED,
    SessionBody,
    SessionListBody,
    StatusBody,
    TraceBody,
    errors,
)
from hermes_agent.server.auth import CurrentUser
from hermes_agent.server.routes_runs import json_response
from hermes_agent.storage.base import Storage

router = APIRouter()
logger = logging.getLogger("hermes_agent.server")


def _storage(request: Request) -> Storage:
    storage: Storage = request.app.state.storage
    return storage


@router.get("/v1/sessions", response_model=SessionListBody, responses=errors(*AUTHENTICATED))
def list_sessions(request: Request, user: CurrentUser) -> Response:
    """The caller's sessions, most recently updated first."""
    sessions = []
    for row in _storage(request).sessions.list_sessions():
        own = client_session_id(user.user_id, row["id"])
        if own is not None:
            sessions.append({**row, "id": own})
    return json_response({"sessions": sessions})


@router.get(
    "/v1/sessions/{session_id}",
    response_model=SessionBody,
    responses=errors(404, *AUTHENTICATED),
)
def show_session(session_id: str, request: Request, user: CurrentUser) -> Response:
    """A session's messages and the runs recorded for it."""
    storage = _storage(request)
    stored = stored_session_id(user.user_id, session_id)
    messages = storage.sessions.load(stored)
    runs = storage.session_requests(stored)
    if not messages and not runs:
        raise HTTPException(404, f"no session {session_id!r}")
    return json_response(
        {
            "id": session_id,
            "messages": [dataclasses.asdict(m) for m in messages],
            "runs": runs,
        }
    )


@router.delete(
    "/v1/sessions/{session_id}",
    status_code=204,
    response_model=None,
    responses=errors(404, *AUTHENTICATED),
)
def delete_session(session_id: str, request: Request, user: CurrentUser) -> Response:
    """Forget a session's messages (its audit records stay)."""
    if not _storage(request).sessions.delete(stored_session_id(user.user_id, session_id)):
        raise HTTPException(404, f"no session {session_id!r}")
    return Response(status_code=204)


def _owned_records(request: Request, request_id: str, user: Principal) -> list[AuditRecord]:
    # The trail says whose run it was (its session's owner): the run's first record is
    # written before anything of it runs, whichever engine runs it.
    records = _storage(request).records(request_id)
    if not records or (
        client_session_id(user.user_id, records[0].session_id) is None and not user.admin
    ):
        raise HTTPException(404, f"no run {request_id!r}")
    return records


@router.get(
    "/v1/runs/{request_id}/trace",
    response_model=TraceBody,
    responses=errors(404, *AUTHENTICATED),
)
def trace(request_id: str, request: Request, user: CurrentUser) -> Response:
    """The run's stage records, in order."""
    records = _owned_records(request, request_id, user)
    shown: list[dict[str, Any]] = []
    for record in records:
        data = record.to_dict()
        data["session_id"] = (
            client_session_id(user.user_id, record.session_id) or data["session_id"]
        )
        shown.append(data)
    return json_response({"request_id": request_id, "records": shown})


@router.get(
    "/v1/runs/{request_id}/trace.jsonl",
    response_model=None,
    response_class=Response,
    responses={
        200: {
            "description": "One JSON object per line",
            "content": {"application/x-ndjson": {"schema": {"type": "string"}}},
        },
        **errors(404, *AUTHENTICATED),
    },
)
def trace_jsonl(request_id: str, request: Request, user: CurrentUser) -> Response:
    """The run's stage records as JSON Lines (the store's export: session ids as stored)."""
    _owned_records(request, request_id, user)
    return PlainTextResponse(
        _storage(request).export_jsonl(request_id), media_type="application/x-ndjson"
    )


@router.get("/healthz", response_model=StatusBody)
async def healthz() -> Response:
    """The process answers."""
    return json_response({"status": "ok"})


@router.get(
    "/readyz",
    response_model=StatusBody,
    responses={
        503: {
            "model": StatusBody,
            "description": "A store is unreachable, the store cannot be written (a full disk), "
            "the model is still warming up (or failed to load), or the service is shutting "
            "down",
        }
    },
)
def readyz(request: Request) -> Response:
    """The store answers and can be written, the key store answers, and the model is warm
    (when the service was started to warm it up); 503 otherwise."""
    keys: KeyStore = request.app.state.keys
    backend: RunBackend = request.app.state.backend
    probe: StoreProbe = request.app.state.store_probe
    try:
        _storage(request).sessions.list_sessions(limit=1)
        keys.ping()
    except Exception:
        # Anyone may ask: the reason (it may name a database URL or SQL) goes to the log only.
        logger.exception("readiness check: a store cannot be reached")
        return json_response(
            {"status": "unavailable", "error": "a store cannot be reached (see the service log)"},
            503,
        )
    if probe.problem() is not None:  # a store that reads but cannot write (a full disk)
        return json_response(
            {"status": "unavailable", "error": "the store cannot be written (see the service log)"},
            503,
        )
    warm = request.app.state.warm
    if not warm.done:  # the model is loading: the first request would wait for it
        return json_response({"status": "warming up"}, 503)
    if warm.error is not None:
        return json_response(
            {"status": "unavailable", "error": "the model could not be loaded (see the log)"}, 503
        )
    if not backend.accepting:
        return json_response({"status": "shutting down"}, 503)
    return json_response({"status": "ready"})


@router.get(
    "/metrics",
    response_model=None,
    response_class=Response,
    responses={200: {"description": "Prometheus text format", "content": {"text/plain": {}}}},
)
async def metrics(request: Request) -> Response:
    """Prometheus metrics of this app."""
    service_metrics: ServiceMetrics = request.app.state.metrics
    return Response(service_metrics.exposition(), media_type="text/plain; version=0.0.4")
