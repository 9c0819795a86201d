"""The gate: what every run passes before anything of it runs, whichever door it came through
and wherever it executes (in process or on the queue's workers).

In order, and the same refusal (status and message) from every door:

1. **who** — the ``Principal`` the door resolved (it authenticates; the gate only sees the
   result, so a door without credentials runs as the user its operator configured);
2. **whose session** — the store keeps sessions per user (``principal.stored_session_id``), so
   a request names only the caller's own; the id must be one the store can hold (422);
3. **what they may use** — a request's ``toolsets`` and ``tool_choice`` can only *narrow* what
   the agent exposes: a toolset the operator did not offer, or a tool outside the narrowed set,
   is 422 (and such a tool, called by the model, is 404 — it is simply not visible);
4. **how big** — the message (413), the whole conversation the request brings (413: the
   message, the turns before it that a door seeds a new session with, the client tools'
   results; ``max_conversation_chars``), the run's variables (413 over their size, 422 for a bad
   name, value or nesting) and the output schema (422 naming the budget: its nesting, its
   values, and what it would expand to once its ``$ref`` are inlined), checked before
   anything is expanded, then compiled (422: a ``$ref`` that is no subschema of it, a pattern
   RE2 cannot run; ``runs.caller_schemas``);
5. **how many at once** — runs in flight, of the service and of the user (429), counted by the
   backend the same way in both modes (queued and running runs);
6. **how much** — the user's daily quota (429; 503 when its store cannot be reached). A run
   counts when it is admitted, and reserves its tokens then (admitted only while the day's
   spent and reserved tokens are under the limit); ``settle`` replaces the reservation with
   what every model turn spent, however the run ended (completed, failed, cancelled, timed
   out, stopped at shutdown), once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from hermes_agent.agent import Agent
from hermes_agent.errors import HermesAgentError
from hermes_agent.events import ThoughtEvent
from hermes_agent.pipeline.client_tools import MAX_CLIENT_TOOLS
from hermes_agent.pipeline.structured import schema_budget_problem
from hermes_agent.pipeline.variables import MAX_VARIABLES_CHARS, VariablesTooLarge, check_variables
from hermes_agent.pipeline.watch import RunWatch, watching
from hermes_agent.protocol.chatml import to_json
from hermes_agent.runs.caller_schemas import compile_problem
from hermes_agent.runs.events import StoredResultEvent, UnknownEvent, read_event
from hermes_agent.runs.principal import Principal, stored_session_id
from hermes_agent.runs.request import ClientTools, RunRequest
from hermes_agent.storage.base import check_session_id
from hermes_agent.types import TOOL_CHOICE_MODES

logger = logging.getLogger("hermes_agent.runs")


class RunRejected(HermesAgentError):
    """A run the gate refuses: ``status_code`` (413, 422, 429, 503) and what to do."""

    def __init__(self, status_code: int, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class GateLimits:
    """The limits the gate holds every run to (the service's settings)."""

    max_message_chars: int = 32_000
    max_conversation_chars: int = 128_000
    """The most characters a request may bring in all: its message, the client tools'
    results and the earlier turns it seeds a new session with (``RunRequest.history``)."""
    max_variables_chars: int = MAX_VARIABLES_CHARS
    client_tools: bool = True
    """Whether a request may bring tools of its own (``RunRequest.client``); the service's
    ``openai_client_tools: off`` says no, for every door."""
    max_runs_in_flight: int = 64
    max_runs_in_flight_per_user: int = 8
    retry_after_s: int = 1


class QuotaRefusal(Protocol):
    """Why a quota refused a run."""

    @property
    def quota(self) -> str: ...

    @property
    def message(self) -> str: ...

    @property
    def retry_after(self) -> int: ...


class QuotaBook(Protocol):
    """The daily quotas the gate counts against (``runs.quotas.Quotas``)."""

    def applies_to(self, user_id: str) -> bool: ...

    def today(self) -> str: ...

    def reservation(self, user_id: str) -> int: ...

    def admit(self, user_id: str) -> tuple[str, QuotaRefusal | None]: ...

    def refund(self, user_id: str, day: str, reserved: int) -> None: ...

    def settle(
        self, user_id: str, day: str, reserved: int, tokens: int, request_id: str | None = None
    ) -> bool: ...


class RefusalCounter(Protocol):
    """Where refusals are counted (the service's metrics)."""

    def refused(self, reason: str, *, quota: bool = False) -> None: ...


class _NoCounter:
    def refused(self, reason: str, *, quota: bool = False) -> None:
        return None


@dataclass(frozen=True, slots=True)
class Admission:
    """A run the gate let in: who, the quota day it was counted on (``None``: the user has
    no quota) and the tokens it reserved, so a run that then never starts can be given back
    and one that ends settled."""

    principal: Principal
    day: str | None
    reserved: int = 0


class Gate:
    """One gate for every run (see the module docstring)."""

    def __init__(
        self,
        limits: GateLimits,
        quotas: QuotaBook,
        counter: RefusalCounter | None = None,
    ) -> None:
        self.limits = limits
        self.quotas = quotas
        self.counter: RefusalCounter = counter or _NoCounter()

    # -- what is asked ---------------------------------------------------------------------

    def check(
        self, principal: Principal, request: RunRequest, agent: Agent, max_id_length: int
    ) -> None:
        """Refuse (``RunRejected``) a request that is too big, names a session id the store
        cannot hold, or widens what the agent exposes."""
        self.check_size(request)
        if request.output_schema is not None:
            problem = schema_budget_problem(request.output_schema)
            if problem is not None:
                self.counter.refused("output_schema_size")
                raise RunRejected(422, problem)
            problem = compile_problem(request.output_schema)
            if problem is not None:
                self.counter.refused("output_schema")
                raise RunRejected(422, problem)
        if request.client is not None:
            self.check_client(request.client, request, agent)
        if request.variables is not None:
            self.check_variables(request.variables)
        if request.session_id is not None:
            check_session_id(  # SessionIdError (422) when the store cannot hold it
                stored_session_id(principal.user_id, request.session_id), max_id_length
            )
        self.check_tools(request.toolsets, request.tool_choice, agent)

    async def check_apart(
        self, principal: Principal, request: RunRequest, agent: Agent, max_id_length: int
    ) -> None:
        """``check``, in a worker thread when the request brings a schema: compiling one (the
        metaschema, up to ``tools.validation.MAX_PATTERNS`` RE2 patterns) takes up to a few hundred
        milliseconds, which the event loop every request shares should not wait out."""
        if request.output_schema is None and request.client is None:
            self.check(principal, request, agent, max_id_length)
        else:
            await asyncio.to_thread(self.check, principal, request, agent, max_id_length)

    def check_size(self, request: RunRequest) -> None:
        """413 for a message over ``max_message_chars``, or a conversation (everything the
        request brings: ``conversation_chars``) over ``max_conversation_chars``. A door that
        stores the conversation before the run starts asks this first, so nothing too big
        is written."""
        size = len(request.message)
        if size > self.limits.max_message_chars:
            self.counter.refused("message_size")
            raise RunRejected(
                413,
                f"the message is {size} characters long; this service accepts at most "
                f"{self.limits.max_message_chars} (max_message_chars): send a shorter message",
            )
        total = conversation_chars(request)
        if total > self.limits.max_conversation_chars:
            self.counter.refused("conversation_size")
            raise RunRejected(
                413,
                f"the conversation is {total} characters long (the message, the turns before "
                f"it and any tool results); this service accepts at most "
                f"{self.limits.max_conversation_chars} (max_conversation_chars): send fewer "
                "or shorter turns, or keep the conversation in a session",
            )

    def check_client(self, client: ClientTools, request: RunRequest, agent: Agent) -> None:
        """The tools a request brings (``RunRequest.client``), whichever door it came through:
        allowed by the operator, at most ``MAX_CLIENT_TOOLS``, each schema within the budgets
        and compiled (``runs.caller_schemas``), named apart from the run's own tools; its results
        (the caller's runs of the calls handed out) count against ``max_message_chars`` and
        each answers a tool the request declares; ``tool_choice`` names a mode, a client tool
        or a tool the run may use."""

        def refuse(status: int, why: str, reason: str = "client_tools") -> RunRejected:
            self.counter.refused(reason)
            return RunRejected(status, why)

        if not self.limits.client_tools:
            raise refuse(
                422,
                "client tools are not served here (service.openai_client_tools: off): the agent "
                "runs its own tools; send the request without them",
            )
        if len(client.tools) > MAX_CLIENT_TOOLS:
            raise refuse(422, f"at most {MAX_CLIENT_TOOLS} client tools may be declared")
        names = [tool.name for tool in client.tools]
        if len(set(names)) != len(names):
            raise refuse(422, "two client tools have the same name")
        own = {tool.name for tool in agent.registry.visible(request.toolsets)}
        clash = sorted(own.intersection(names))
        if clash:
            raise refuse(422, f"client tools {', '.join(clash)}: names of the agent's own tools")
        for tool in client.tools:
            if tool.parameters is not None:
                problem = schema_budget_problem(tool.parameters) or compile_problem(
                    tool.parameters, f"client tool {tool.name!r}'s schema", formats=True
                )
                if problem is not None:
                    raise refuse(422, problem)
        try:
            client.turn()  # each declaration as the engine will build it
        except HermesAgentError as exc:
            raise refuse(422, str(exc)) from None
        stray = sorted({r.name for r in client.results} - set(names))
        if stray:
            raise refuse(
                422,
                f"results for {', '.join(stray)}: not tools this request declares (a result "
                "answers a call of one of the request's own client tools)",
            )
        size = len(request.message) + sum(len(to_json(r.model_dump())) for r in client.results)
        if size > self.limits.max_message_chars:
            raise refuse(
                413,
                f"the message and the client tools' results are {size} characters long; this "
                f"service accepts at most {self.limits.max_message_chars} (max_message_chars)",
                "message_size",
            )
        choice = client.tool_choice
        if choice is not None and choice not in TOOL_CHOICE_MODES and choice not in names:
            self.check_tools(request.toolsets, choice, agent)

    def check_variables(self, variables: Mapping[str, Any]) -> None:
        """A run's variables, bounded (``pipeline.variables``): 413 when their JSON is over
        ``max_variables_chars``, 422 for a bad name, value, nesting or count."""
        try:
            check_variables(variables, max_chars=self.limits.max_variables_chars)
        except VariablesTooLarge as exc:
            self.counter.refused("variables_size")
            raise RunRejected(413, str(exc)) from None
        except ValueError as exc:
            self.counter.refused("variables")
            raise RunRejected(422, str(exc)) from None

    def check_tools(
        self, toolsets: Iterable[str] | None, tool_choice: str | None, agent: Agent
    ) -> None:
        """``toolsets`` and ``tool_choice`` may only narrow what ``agent`` exposes."""
        refusal = widening(toolsets, tool_choice, agent)
        if refusal is not None:
            self.counter.refused("toolsets" if "toolsets" in refusal.message else "tool_choice")
            raise refusal

    # -- how many, how much ------------------------------------------------------------------

    def check_room(self, total: int, mine: int) -> None:
        """429 when the service (``total``) or the user (``mine``) has as many runs queued or
        running as the limits allow."""
        limits, retry = self.limits, self.limits.retry_after_s
        if total >= limits.max_runs_in_flight:
            self.counter.refused("runs_in_flight")
            raise RunRejected(
                429,
                f"the service has {limits.max_runs_in_flight} runs in flight (queued or "
                f"running), its limit; retry after {retry} s",
                retry,
            )
        if mine >= limits.max_runs_in_flight_per_user:
            self.counter.refused("runs_in_flight_per_user")
            raise RunRejected(
                429,
                f"you have {limits.max_runs_in_flight_per_user} runs in flight (queued or "
                f"running), the limit per user; wait for one to finish (retry after {retry} s)",
                retry,
            )

    async def take_quota(self, principal: Principal) -> Admission:
        """Count one run against the principal's daily quota (429 when spent, 503 when the
        quota store cannot be reached)."""
        user = principal.user_id
        if not self.quotas.applies_to(user):
            return Admission(principal, None)
        try:
            day, exceeded = await asyncio.to_thread(self.quotas.admit, user)
        except Exception:
            logger.exception("cannot check the quota of %s", user)
            retry = self.limits.retry_after_s
            raise RunRejected(
                503, f"the quota store cannot be reached; retry after {retry} s", retry
            ) from None
        if exceeded is not None:
            self.counter.refused(exceeded.quota, quota=True)
            raise RunRejected(429, exceeded.message, exceeded.retry_after)
        return Admission(principal, day, self.quotas.reservation(user))

    async def give_back(self, admission: Admission) -> None:
        """Uncount an admitted run that never started."""
        if admission.day is None:
            return
        user = admission.principal.user_id
        try:
            await asyncio.to_thread(self.quotas.refund, user, admission.day, admission.reserved)
        except Exception:
            logger.exception("cannot give back the run of %s", admission.principal.user_id)

    async def settle(
        self,
        user_id: str,
        request_id: str,
        tokens: int,
        *,
        once: bool,
        day: str | None = None,
        reserved: int = 0,
    ) -> None:
        """Replace what run ``request_id`` reserved on ``day`` (today when ``None``) with the
        tokens it used, however it ended; with ``once``, only by whichever process sees its
        ending first (runs on the queue: every instance of the service may read it). A store
        that fails is logged: the run's ending is not lost for it."""
        if not self.quotas.applies_to(user_id) or (tokens <= 0 and not reserved):
            return
        quotas = self.quotas
        when = day or quotas.today()
        rid = request_id if once else None
        try:
            await asyncio.to_thread(quotas.settle, user_id, when, reserved, max(tokens, 0), rid)
        except Exception:
            logger.exception("cannot add the tokens of run %s to its quota", request_id)


@dataclass(slots=True)
class Tally:
    """What admitted local work used, for the quota: set ``tokens`` before it ends."""

    tokens: int = 0


@contextlib.asynccontextmanager
async def admitted_here(
    gate: Gate,
    principal: Principal,
    request: RunRequest,
    agent: Agent,
    counts: Callable[[], Awaitable[tuple[int, int]]],
    hold: Callable[[], contextlib.AbstractContextManager[None]],
) -> AsyncIterator[Tally]:
    """The gate around work of the caller's that runs in this process and is not one of an
    engine's runs (a replay, an MCP server's direct tool call): the request's checks, room
    among the runs in flight (``counts``: all, the caller's; ``hold`` counts this work as one
    while it lasts), the daily quota; the tokens put in the tally are settled however it
    ends; work that raises (it could not be done) is given back to the day's run count. A
    backend's ``admitted`` is this, with its own counts."""
    storage = agent.storage
    await gate.check_apart(principal, request, agent, storage.max_id_length if storage else 10**6)
    gate.check_room(*await counts())
    # Held from the count on, with no await between them (the quota store is asked after):
    # work admitted at once counts each other, as an engine's runs do.
    with hold():
        admission = await gate.take_quota(principal)
        tally = Tally()
        reserved = admission.reserved
        watch = RunWatch()  # model turns the work takes count too, however they end
        try:
            with watching(watch):
                yield tally
        except BaseException:
            await asyncio.shield(gate.give_back(admission))  # its reservation with it
            reserved = 0
            raise
        finally:
            key, user = f"local-{uuid.uuid4().hex}", admission.principal.user_id
            tokens = max(tally.tokens, watch.spend.total)
            settled = gate.settle(
                user, key, tokens, once=False, day=admission.day, reserved=reserved
            )
            await asyncio.shield(settled)


def conversation_chars(request: RunRequest) -> int:
    """Everything a request brings for the model to read, in characters: its message, the
    client tools' results (as JSON) and the turns before the message (``history``): their
    text, calls and results."""
    total = len(request.message)
    if request.client is not None:
        total += sum(len(to_json(r.model_dump())) for r in request.client.results)
    for turn in request.history:
        total += len(turn.content) + len(turn.raw or "") + len(turn.scratch_pad or "")
        total += sum(len(c.name) + len(to_json(c.arguments)) for c in turn.tool_calls)
        total += sum(len(to_json([r.content, r.error])) for r in turn.tool_results)
    return total


def widening(
    toolsets: Iterable[str] | None, tool_choice: str | None, agent: Agent
) -> RunRejected | None:
    """The refusal (422) for ``toolsets`` or a ``tool_choice`` that would widen what ``agent``
    exposes; ``None`` when they only narrow it."""
    offered = exposed_toolsets(agent)
    names = list(toolsets) if toolsets is not None else None
    if names is not None:
        wider = [name for name in names if name not in offered]
        if wider:
            return RunRejected(
                422,
                f"toolsets {', '.join(map(repr, wider))}: not offered by this service; "
                f"it offers {', '.join(sorted(offered)) or '(none)'} — name some of those, "
                "or leave toolsets out for all of them",
            )
    if tool_choice is not None and tool_choice not in TOOL_CHOICE_MODES:
        narrowed = names if names is not None else sorted(offered)
        visible = {tool.name for tool in agent.registry.visible(narrowed)}
        if tool_choice not in visible:
            return RunRejected(
                422,
                f"tool_choice {tool_choice!r} is not a tool this run may use; use auto, "
                f"required, none or one of: {', '.join(sorted(visible)) or '(no tools)'}",
            )
    return None


def exposed_toolsets(agent: Agent) -> set[str]:
    """The toolsets the operator's agent exposes (its ``toolsets``, else every one it has)."""
    if agent.toolsets is not None:
        return set(agent.toolsets)
    return set(agent.registry.toolsets())


_ASKING = {"input": True, "tool_results": True, "thought": False, "selection": False}
"""After which events of a run a model turn is asked and not yet answered (``True``): what
``cut_mid_turn`` reads; the pieces of a streamed reply say so too, other events nothing."""
_PIECES = frozenset(
    {"text_delta", "scratch_pad_delta", "thought_delta", "tool_call_started", "tool_call_delta"}
)


def cut_mid_turn(events: Iterable[Mapping[str, Any]], *, started: bool = False) -> bool:
    """Whether a run's events end inside a model turn: asked (its input taken, or its tools'
    results in; from the start for a run ``started`` whose first events are not stored yet)
    and not answered. Such a turn spent tokens that no event counts — for a run whose engine
    cannot say how many (a queued run's worker, fenced out by the cancel), its reservation
    stands for them."""
    asking = started
    for wire in events:
        kind = wire.get("kind")
        if kind in _PIECES:
            asking = True
        elif isinstance(kind, str) and kind in _ASKING:
            asking = _ASKING[kind]
    return asking


def tokens_used(events: Iterable[Mapping[str, Any]]) -> int:
    """The tokens a run used, from its events: the result's total when it answered, else the
    sum of its model turns (``thought`` events) — so a run cancelled, timed out or failed just
    before its answer still counts every turn it took."""
    turns = 0
    for wire in events:
        try:
            event = read_event(wire)
        except UnknownEvent:
            continue
        if isinstance(event, StoredResultEvent):
            total = event.tokens
            if total is not None:
                return max(total, turns)
        elif isinstance(event, ThoughtEvent):
            turns += int(event.tokens or 0)
    return turns
