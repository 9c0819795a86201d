"""The A2A door: the agent as an A2A 1.0 server (the ``a2a-sdk`` package's JSON-RPC binding).

The agent card is at ``/.well-known/agent-card.json`` (public, as the specification has it: it
names the bearer scheme the service's API keys are); the JSON-RPC endpoint is ``POST /a2a``,
behind the service's keys (401 without one). The SDK parses and answers JSON-RPC; this module
only maps its four methods onto the run layer's seam (``RunBackend``), so the gate, ownership
and both engines are the service's own:

==========================  ============================================================
A2A method                  the run
==========================  ============================================================
``SendMessage``             start a run (the ``contextId`` is the caller's session) and
                            wait for it: the task is the run, its id the run's id
``SendStreamingMessage``    the same, followed: status and artifact updates as it goes
``GetTask``                 ``GET /v1/runs/{id}``
``CancelTask``              ``POST /v1/runs/{id}/cancel``
==========================  ============================================================

A run waiting for an approval is a task in ``input-required``: its status message names the
pending calls (a data part), and a message on that task (``taskId``) answers them — a data
part ``{"approved": true}`` or the text ``yes`` approves, anything else denies — and the same
run goes on. Another user's task is ``TaskNotFoundError``, as any id that is not the caller's.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes.common import DefaultServerCallContextBuilder
from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Artifact,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    HTTPAuthSecurityScheme,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Part,
    Role,
    SecurityRequirement,
    SecurityScheme,
    SendMessageRequest,
    StringList,
    SubscribeToTaskRequest,
    Task,
    TaskArtifactUpdateEvent,
    TaskPushNotificationConfig,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from a2a.utils.errors import (
    InvalidParamsError,
    InvalidRequestError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from google.protobuf import json_format
from starlette.responses import Response

from hermes_agent.agent import Agent
from hermes_agent.errors import HermesAgentError
from hermes_agent.runs.backend import ApprovalConflict, RunBackend, RunNotFound, RunView
from hermes_agent.runs.events import ApprovalRequiredEvent, read_known
from hermes_agent.runs.gate import RunRejected
from hermes_agent.runs.principal import Principal
from hermes_agent.runs.request import RunRequest
from hermes_agent.runs.settings import ServiceSettings
from hermes_agent.server.auth import CurrentUser

RPC_PATH = "/a2a"

STATES: dict[str, TaskState] = {
    "queued": TaskState.TASK_STATE_SUBMITTED,
    "running": TaskState.TASK_STATE_WORKING,
    "waiting_approval": TaskState.TASK_STATE_INPUT_REQUIRED,
    "completed": TaskState.TASK_STATE_COMPLETED,
    "cancelled": TaskState.TASK_STATE_CANCELED,
}
"""A run's status as a task's state; every other ending (failed, timed out, dead,
interrupted, a cut trail) is ``failed``."""

YES = frozenset({"yes", "y", "approve", "approved", "ok"})
"""The texts that approve, in a message answering an ``input-required`` task."""

router = APIRouter()


def _state(status: str) -> TaskState:
    return STATES.get(status, TaskState.TASK_STATE_FAILED)


def _data(value: Any) -> Part:
    part = Part()
    json_format.ParseDict(json.loads(json.dumps(value, default=str)), part.data)
    return part


def _agent_message(view: RunView, text: str, data: Any = None) -> Message:
    parts = [Part(text=text)]
    if data is not None:
        parts.append(_data(data))
    return Message(
        message_id=str(uuid.uuid4()),
        role=Role.ROLE_AGENT,
        task_id=view.request_id,
        context_id=view.session_id,
        parts=parts,
    )


def _answer(view: RunView) -> str | None:
    if view.result is not None and view.result.get("output"):
        return str(view.result["output"])
    return view.output


def task_status(view: RunView) -> TaskStatus:
    """The run's status as a task's: an approval's question, or why it failed, as its
    message."""
    status = TaskStatus(state=_state(view.status))
    status.timestamp.GetCurrentTime()
    if view.pending_approvals:
        status.state = TaskState.TASK_STATE_INPUT_REQUIRED
        asks = "; ".join(
            f"{p['tool']} {json.dumps(p.get('arguments'), default=str)}"
            for p in view.pending_approvals
        )
        question = f"Approve {asks}? Reply yes or no."
        status.message.CopyFrom(_agent_message(view, question, view.pending_approvals))
    elif status.state == TaskState.TASK_STATE_FAILED:
        error = view.error or (view.result or {}).get("error") or f"the run {view.status}"
        status.message.CopyFrom(_agent_message(view, str(error)))
    return status


def answer_artifact(text: str) -> Artifact:
    return Artifact(artifact_id="answer", name="answer", parts=[Part(text=text)])


def task_of(view: RunView) -> Task:
    """A run as an A2A task: its id is the run's, its context the caller's session."""
    task = Task(id=view.request_id, context_id=view.session_id, status=task_status(view))
    answer = _answer(view)
    if view.done and answer:
        task.artifacts.append(answer_artifact(answer))
    return task


def _text(message: Message) -> str:
    return "".join(part.text for part in message.parts if part.WhichOneof("content") == "text")


def _decision(message: Message) -> tuple[bool, str]:
    """Whether a message answering an approval approves, and the reason it gives."""
    for part in message.parts:
        if part.WhichOneof("content") == "data":
            data = json_format.MessageToDict(part.data)
            if isinstance(data, dict) and "approved" in data:
                return data["approved"] is True, str(data.get("reason") or "")
    text = _text(message).strip()
    return text.lower().rstrip(".!") in YES, text


def _principal(context: ServerCallContext) -> Principal:
    principal = context.state.get("principal")
    if not isinstance(principal, Principal):  # the route authenticates before the SDK runs
        raise InvalidRequestError(message="not authenticated")
    return principal


class RunTasks(RequestHandler):
    """The A2A methods over the run backend."""

    def __init__(self, backend: RunBackend, keepalive: float) -> None:
        self.backend = backend
        self.keepalive = keepalive

    async def _view(self, task_id: str, principal: Principal) -> RunView:
        try:
            return await self.backend.view(task_id, principal)
        except RunNotFound:
            raise TaskNotFoundError(message=f"no task {task_id!r}") from None

    async def _start(
        self, params: SendMessageRequest, principal: Principal, *, listening: bool = True
    ) -> RunView:
        text = _text(params.message)
        if not text.strip():
            raise InvalidParamsError(message="the message has no text part")
        request = RunRequest(
            message=text, session_id=params.message.context_id or None, stream=True
        )
        try:
            return await self.backend.start(principal, request, listening=listening)
        except RunRejected as exc:
            raise InvalidRequestError(
                message=exc.message, data={"http_status": exc.status_code}
            ) from None
        except HermesAgentError as exc:
            raise InvalidParamsError(message=str(exc)) from None

    async def _answer(self, params: SendMessageRequest, principal: Principal) -> RunView:
        """A message on an ``input-required`` task: answer its approvals."""
        view = await self._view(params.message.task_id, principal)
        if not view.pending_approvals:
            raise InvalidParamsError(
                message=f"task {view.request_id} is {view.status}, not waiting for input"
            )
        approved, reason = _decision(params.message)
        reason = reason or f"{'approved' if approved else 'denied'} by {principal.user_id}"
        try:
            for pending in view.pending_approvals:
                await self.backend.answer(str(pending["approval_id"]), principal, approved, reason)
        except (RunNotFound, ApprovalConflict) as exc:
            raise InvalidParamsError(message=exc.message) from None
        return view

    async def on_message_send(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> Task | Message:
        principal = _principal(context)
        if params.message.task_id:
            view = await self._answer(params, principal)
            return task_of(await self.backend.wait(view.request_id, principal))
        if params.configuration.return_immediately:
            # The caller polls GetTask (as ``Prefer: respond-async`` on ``POST /v1/runs``).
            return task_of(await self._start(params, principal, listening=False))
        view = await self._start(params, principal)
        return task_of(await self.backend.wait(view.request_id, principal, started=True))

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Any]:
        principal = _principal(context)
        answered: set[str] = set()
        if params.message.task_id:
            view = await self._answer(params, principal)
            answered = {str(p["approval_id"]) for p in view.pending_approvals}
            items = await self.backend.events(view.request_id, principal, 0, self.keepalive)
        else:
            view = await self._start(params, principal)
            items = await self.backend.events(
                view.request_id, principal, 0, self.keepalive, started=True
            )
        working = Task(id=view.request_id, context_id=view.session_id, status=TaskStatus())
        working.status.state = TaskState.TASK_STATE_WORKING
        yield working
        streamed = ""
        async with aclosing(items) as following:
            async for item in following:
                if item is None:
                    continue
                wire = item[1]
                event = read_known(wire)
                if answered:  # a continued task: what came before its answer was sent already
                    if isinstance(event, ApprovalRequiredEvent):
                        answered.discard(event.approval_id)
                    continue
                if wire.get("kind") == "text_delta" and wire.get("text"):
                    yield TaskArtifactUpdateEvent(
                        task_id=view.request_id,
                        context_id=view.session_id,
                        artifact=answer_artifact(str(wire["text"])),
                        append=bool(streamed),
                    )
                    streamed += str(wire["text"])
                elif isinstance(event, ApprovalRequiredEvent) or wire.get("kind") in (
                    "result",
                    "run_stopped",
                ):
                    break
        final = await self.backend.view(view.request_id, principal)
        answer = _answer(final)
        if final.done and answer:
            # The last chunk closes the streamed answer, or replaces it (append false) where
            # the answer as rendered differs from the text that streamed (trimmed, formatted).
            same = streamed == answer
            yield TaskArtifactUpdateEvent(
                task_id=final.request_id,
                context_id=final.session_id,
                artifact=answer_artifact("" if same else answer),
                append=same,
                last_chunk=True,
            )
        yield TaskStatusUpdateEvent(
            task_id=final.request_id, context_id=final.session_id, status=task_status(final)
        )

    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        return task_of(await self._view(params.id, _principal(context)))

    async def on_cancel_task(
        self, params: CancelTaskRequest, context: ServerCallContext
    ) -> Task | None:
        principal = _principal(context)
        try:
            cancelled, view = await self.backend.cancel(params.id, principal)
        except RunNotFound:
            raise TaskNotFoundError(message=f"no task {params.id!r}") from None
        if not cancelled and view.status != "cancelled":
            raise TaskNotCancelableError(message=f"task {params.id} is {view.status}")
        return task_of(view)

    # What the door does not offer (the card says so: no push notifications).

    async def on_list_tasks(
        self, params: ListTasksRequest, context: ServerCallContext
    ) -> ListTasksResponse:
        raise UnsupportedOperationError(message="ListTasks: use GET /v1/runs")

    async def on_create_task_push_notification_config(
        self, params: TaskPushNotificationConfig, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        raise UnsupportedOperationError(message="push notifications are not offered")

    async def on_get_task_push_notification_config(
        self, params: GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        raise UnsupportedOperationError(message="push notifications are not offered")

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Any]:
        raise UnsupportedOperationError(message="SubscribeToTask is not offered")
        yield  # an async generator, as the interface declares it

    async def on_list_task_push_notification_configs(
        self, params: ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> ListTaskPushNotificationConfigsResponse:
        raise UnsupportedOperationError(message="push notifications are not offered")

    async def on_delete_task_push_notification_config(
        self, params: DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        raise UnsupportedOperationError(message="push notifications are not offered")

    async def on_get_extended_agent_card(
        self, params: GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> AgentCard:
        raise UnsupportedOperationError(message="there is no extended agent card")


class AuthenticatedContext(DefaultServerCallContextBuilder):
    """The SDK's call context (its headers carry the protocol version), with the caller the
    route authenticated."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        context.state["principal"] = request.state.principal
        return context


def agent_card(base_url: str, request: Request) -> AgentCard:
    """The card of the service's agent, with its JSON-RPC endpoint at ``base_url``."""
    agent: Agent = request.app.state.agent
    tools = sorted(tool.name for tool in agent.tools)
    description = "A Hermes function-calling agent" + (
        f" with the tools {', '.join(tools)}" if tools else ""
    )
    return AgentCard(
        name="Hermes Agent",
        description=description,
        version="1",
        supported_interfaces=[
            AgentInterface(
                url=base_url.rstrip("/") + RPC_PATH,
                protocol_binding="JSONRPC",
                protocol_version="1.0",
            )
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        security_schemes={
            "bearer": SecurityScheme(
                http_auth_security_scheme=HTTPAuthSecurityScheme(
                    scheme="Bearer", description="The service's API key"
                )
            )
        },
        security_requirements=[SecurityRequirement(schemes={"bearer": StringList()})],
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[
            AgentSkill(
                id="ask",
                name="Ask the agent",
                description=description,
                tags=["hermes", "tools"],
            )
        ],
    )


@router.get(AGENT_CARD_WELL_KNOWN_PATH, include_in_schema=False)
async def well_known_card(request: Request) -> Response:
    """The agent card (public, as discovery is)."""
    return JSONResponse(agent_card_to_dict(agent_card(str(request.base_url), request)))


@router.post(RPC_PATH, include_in_schema=False)
async def rpc(request: Request, user: CurrentUser) -> Response:
    """The JSON-RPC endpoint, for the caller the service's keys name."""
    dispatcher: JsonRpcDispatcher | None = getattr(request.app.state, "a2a_dispatcher", None)
    if dispatcher is None:
        settings: ServiceSettings = request.app.state.settings
        handler = RunTasks(request.app.state.backend, settings.keepalive_s)
        dispatcher = JsonRpcDispatcher(handler, context_builder=AuthenticatedContext())
        request.app.state.a2a_dispatcher = dispatcher
    request.state.principal = user
    response: Response = await dispatcher.handle_requests(request)
    return response
