"""One run's ``RunContext``, built whole in one place from the agent and what ``arun`` was given.

``checked_options`` refuses what is wrong with a run's options before the run waits for its
session (the output type, the variables, the budgets); ``build_context`` then checks the tool
choice, the models and the output format, and makes the context with every field the run
starts with: models (behind the journal of a durable run), settings, tools, the renderer, the
recorder of the trail and the source of the session's history.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from hermes_agent.agent_support import checked_variables
from hermes_agent.audit.recorder import Recorder
from hermes_agent.audit.records import AuditSink
from hermes_agent.audit.redaction import Redactor
from hermes_agent.errors import HermesAgentError
from hermes_agent.memory.history import HistoryLoader, LoadedHistory
from hermes_agent.memory.session import SessionStore, off_the_loop
from hermes_agent.messages import language_of
from hermes_agent.models.base import Model, ModelSettings
from hermes_agent.options import Budget, Pricing
from hermes_agent.pipeline.budget import RunBudget
from hermes_agent.pipeline.context import (
    Approver,
    ClientTurn,
    EventListener,
    LoopLimits,
    RunContext,
    StreamChoice,
)
from hermes_agent.pipeline.journal import RunJournal, journaled
from hermes_agent.pipeline.renderers import Renderer
from hermes_agent.pipeline.structured import OutputSpec, OutputType, output_spec
from hermes_agent.pricing import RunPricing
from hermes_agent.storage.base import Storage
from hermes_agent.tools.registry import ToolRegistry
from hermes_agent.tools.runtime import ToolRuntime
from hermes_agent.types import TOOL_CHOICE_MODES, ToolChoice, Usage

__all__ = ["AgentParts", "RunOptions", "build_context", "checked_options", "renderer_name"]


class AgentParts(Protocol):
    """What a run takes from its ``Agent`` (the agent is one; so is a test's stand-in)."""

    tool_choice: ToolChoice
    toolsets: list[str] | None
    registry: ToolRegistry
    system_prompt: str | None
    explain: bool
    temperature: float | None
    max_tokens: int | None
    scratch_pad: bool
    preamble: str | None
    limits: LoopLimits
    runtime: ToolRuntime
    approver: Approver | None
    renderers: dict[str, Renderer]
    channel_formats: dict[str, str]
    output_format: str
    storage: Storage | None
    sessions: SessionStore
    audit_sink: AuditSink | None
    redactor: Redactor
    history: HistoryLoader
    answer_model: Model | None
    pricing: Pricing
    budget: Budget
    language: str

    @property
    def model(self) -> Model: ...

    def _thread_pool(self) -> ThreadPoolExecutor: ...


@dataclass(frozen=True, slots=True)
class RunOptions:
    """What a run was asked for beyond its message, checked (see ``checked_options``)."""

    spec: OutputSpec | None
    variables: dict[str, object]
    budget: RunBudget


def checked_options(
    agent: AgentParts,
    *,
    output_type: OutputType | None,
    variables: Mapping[str, object] | None,
    max_run_tokens: int | None,
    max_run_cost: float | None,
    run_timeout_s: float | None,
) -> RunOptions:
    """The run's output spec, its own copy of its variables and its budget (the agent's
    budgets where the run sets none); ``HermesAgentError`` for what is wrong with them."""
    spec = output_spec(output_type) if output_type is not None else None
    given = checked_variables(variables)
    own = agent.budget
    budget = RunBudget(
        max_run_tokens if max_run_tokens is not None else own.max_run_tokens,
        max_run_cost if max_run_cost is not None else own.max_run_cost,
        run_timeout_s if run_timeout_s is not None else own.run_timeout_s,
        lambda usage_by_model: cost_of(agent, usage_by_model),
    )
    problem = budget.problem()
    if problem is not None:
        raise HermesAgentError(problem)
    return RunOptions(spec, given, budget)


def run_pricing(agent: AgentParts) -> RunPricing:
    """The prices of the agent's models as they are now."""
    prices = agent.pricing
    return RunPricing(agent.model, agent.answer_model, prices.model, prices.answer_model)


def cost_of(agent: AgentParts, usage_by_model: Mapping[str, Usage]) -> float | None:
    """What ``usage_by_model`` costs at the prices of the agent's models."""
    return run_pricing(agent).cost_of(usage_by_model)


def build_context(
    agent: AgentParts,
    message: str,
    session_id: str,
    options: RunOptions,
    *,
    tool_choice: ToolChoice | None,
    toolsets: Iterable[str] | None,
    listener: EventListener | None,
    stream: StreamChoice,
    dry_run: bool,
    output_format: str | None,
    channel: str | None,
    request_id: str | None,
    journal: RunJournal | None,
    approver: Approver | None,
    new_session: bool = False,
    client: ClientTurn | None = None,
) -> RunContext:
    """The whole context of one run of ``agent``; ``HermesAgentError`` for a tool choice that
    names no visible tool, two models of one name, or an unknown format or channel.
    ``new_session``: the session was made up for this run, so its history is not read."""
    chosen = tool_choice or agent.tool_choice
    visible = agent.registry.visible(toolsets if toolsets is not None else agent.toolsets)
    tools = {tool.name: tool for tool in visible}
    if chosen not in TOOL_CHOICE_MODES and chosen not in tools:
        raise HermesAgentError(
            f"tool_choice {chosen!r} is not a visible tool; use auto, required, none "
            f"or one of: {', '.join(tools) or '(no tools registered)'}"
        )
    if chosen == "required" and not tools:
        raise HermesAgentError("tool_choice 'required' needs at least one registered tool")
    model, answer_model = _models(agent)
    if journal is not None:
        model, answer_model = journaled(journal, model, answer_model)
    name = renderer_name(agent, output_format, channel)
    spec = options.spec
    ctx = RunContext(
        request_id=request_id if request_id is not None else str(uuid.uuid4()),
        session_id=session_id,
        user_message=message,
        model=model,
        answer_model=answer_model,
        explain=agent.explain,
        settings=ModelSettings(
            temperature=agent.temperature,
            max_tokens=agent.max_tokens,
            tool_choice=chosen,
            scratch_pad=agent.scratch_pad,
            preamble=agent.preamble,
            output_schema=spec.schema if spec is not None else None,
        ),
        limits=agent.limits,
        tools=tools,
        all_tool_names=agent.registry.names(),
        executor=agent._thread_pool(),
        system_prompt=agent.system_prompt,
        listener=listener,
        stream=stream,
        runtime=agent.runtime,
        approver=approver if approver is not None else agent.approver,
        variables=options.variables,
        budget=options.budget,
        language=language_of(options.variables.get("lang"), agent.language),
        journal=journal,
        output_spec=spec,
        dry_run=dry_run,
        renderer_name=name,
        renderer=agent.renderers[name],
        channel=channel,
        client=client,
    )
    ctx.load_history = lambda: _load_history(agent, ctx, new_session)
    ctx.redactor = agent.redactor
    if agent.audit_sink is not None and not dry_run:
        ctx.recorder = Recorder(agent.audit_sink, agent.redactor)
        if journal is not None and journal.resumes and agent.storage is not None:
            # A resumed run: what an earlier attempt recorded stays, once.
            ctx.recorder.continue_after(agent.storage.records(ctx.request_id))
    return ctx


def renderer_name(agent: AgentParts, output_format: str | None, channel: str | None) -> str:
    """The renderer a run uses: ``output_format``, else the one ``channel`` names, else the
    agent's own format."""
    name = output_format
    if name is None and channel is not None:
        if channel not in agent.channel_formats:
            raise HermesAgentError(
                f"unknown channel {channel!r}; known: {', '.join(agent.channel_formats)} "
                "(add one under output.channel_formats in the config)"
            )
        name = agent.channel_formats[channel]
    name = name or agent.output_format
    if name not in agent.renderers:
        raise HermesAgentError(
            f"unknown output format {name!r}; use one of: {', '.join(agent.renderers)}"
        )
    return name


def _models(agent: AgentParts) -> tuple[Model, Model | None]:
    model, answer_model = agent.model, agent.answer_model
    distinct = answer_model is not None and answer_model is not model
    if distinct and answer_model is not None and answer_model.name == model.name:
        raise HermesAgentError(
            f"model and answer_model are both named {model.name!r}; give them distinct "
            "names (steps, the trail and the usage per model tell them apart by name)"
        )
    return model, answer_model


async def _load_history(agent: AgentParts, ctx: RunContext, new_session: bool) -> LoadedHistory:
    """The session's history as the prompt carries it (see ``memory.history``); the
    InputParser calls this, so a summary made by the model is a recorded model call. A
    session made up for this run (``new_session``) holds nothing yet: no read of the store."""
    if new_session:
        return LoadedHistory([])
    sessions = agent.sessions
    stored = await off_the_loop(sessions, ctx.session_id, lambda: sessions.load(ctx.session_id))
    return await agent.history.load(ctx.session_id, stored, ctx.model, cached=ctx.journal is None)
