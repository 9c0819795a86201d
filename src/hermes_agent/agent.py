"""``Agent``: the object a user holds. It keeps the model, the tools and the sessions, and runs
one message at a time through the pipeline in ``pipeline/loop.py``.

    from hermes_agent import Agent

    agent = Agent()                       # the embedded model (needs hermes-agent-core[local])

    @agent.tool
    def add(a: int, b: int) -> int:
        \"\"\"Add two integers.\"\"\"
        return a + b

    result = agent.run("What is 2 + 3?")
    print(result.output, result.tool_calls)

``run`` is a sync facade over ``arun``; ``astream`` yields events while the run happens.
"""

from __future__ import annotations

import asyncio
import copy
import enum
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Unpack, overload

from pydantic import BaseModel
from typing_extensions import TypeVar

from hermes_agent.agent_context import build_context, checked_options, run_pricing
from hermes_agent.agent_support import (
    acquire_elsewhere,
    close_connections_of,
    not_a_model,
    on_thread_loop,
    run_in_thread_loop,
    warm_embedded,
)
from hermes_agent.audit.records import AuditSink
from hermes_agent.audit.redaction import Redactor, redact_messages
from hermes_agent.config import HermesConfig, QueueConfig, load_config
from hermes_agent.errors import HermesAgentError, OutputValidationError
from hermes_agent.events import Event, ResultEvent
from hermes_agent.logs import configure_from_environment
from hermes_agent.memory.history import HistoryLoader
from hermes_agent.memory.session import (
    AcquiresAsync,
    InMemorySessionStore,
    SessionStore,
    off_the_loop,
    save_turn,
)
from hermes_agent.messages import language_of
from hermes_agent.models.base import Model, ModelSettings
from hermes_agent.models.registry import build_model
from hermes_agent.options import (
    AgentOptions,
    Budget,
    Memory,
    Pricing,
    ToolExecution,
    ToolSettings,
    agent_options,
)
from hermes_agent.pipeline.context import (
    Approver,
    ClientTurn,
    EventListener,
    LoopLimits,
    StreamChoice,
)
from hermes_agent.pipeline.hook_classes import HookBase
from hermes_agent.pipeline.hooks import Hook, Hooks, as_hook, config_hooks, config_renderers
from hermes_agent.pipeline.journal import RunJournal
from hermes_agent.pipeline.loop import run_turn
from hermes_agent.pipeline.renderers import BUILTIN_RENDERERS, DEFAULT_CHANNEL_FORMATS, Renderer
from hermes_agent.pipeline.status import Status
from hermes_agent.pipeline.structured import OutputType
from hermes_agent.storage.base import Storage, check_session_id
from hermes_agent.storage.opening import open_storage
from hermes_agent.tools.registry import DEFAULT_TOOLSET, Tool, ToolRegistry
from hermes_agent.tools.runtime import ToolRuntime
from hermes_agent.types import Message, RunResult, ToolChoice

if TYPE_CHECKING:
    from hermes_agent.replay import ReplayReport

F = TypeVar("F", bound=Callable[..., object])
DataT = TypeVar("DataT", default=Any)
"""What ``output_type`` names (``Any`` for a JSON Schema or none): ``RunResult[DataT]``."""

logger = logging.getLogger("hermes_agent")


class _Keep(enum.Enum):
    """``Agent.fork``'s default: keep what the agent has."""

    KEEP = "keep"


ConfigWiring = Callable[["Agent", HermesConfig], None]
"""A step ``Agent.from_settings`` applies to every agent it builds, for config sections that an
upper layer wires from outside the agent (``loading`` registers tracing's): the core names no
upper layer, and a config is honoured whichever way the agent is built."""

_CONFIG_WIRINGS: list[ConfigWiring] = []

# The groups' defaults (immutable, so one of each serves every agent).
_DEFAULT_PRICING = Pricing()
_DEFAULT_BUDGET = Budget()
_DEFAULT_MEMORY = Memory()
_DEFAULT_TOOL_EXECUTION = ToolExecution()


def add_config_wiring(wiring: ConfigWiring) -> None:
    """Have ``Agent.from_settings`` call ``wiring(agent, config)`` last (once per wiring)."""
    if wiring not in _CONFIG_WIRINGS:
        _CONFIG_WIRINGS.append(wiring)


class Agent:
    """An agent: a model, tools, and the loop that lets the model use them.

    ``model`` is any object with the ``Model`` seam (``OpenAICompatible``, ``LlamaCpp``,
    ``ScriptedModel``...); ``None`` means the embedded SmolLM2 model, loaded on first use.
    ``answer_model`` (optional) writes the final answer while ``model`` makes the tool calls
    (see ``RunContext.route``).
    ``tool_choice`` is ``"auto"``, ``"required"``, ``"none"`` or a tool name; it applies to the
    first model turn of each run. ``toolsets`` limits which tools the model sees. ``explain``
    asks the model for a one-line reason with each turn (``Step.reason``, and the trail).
    ``output_format`` is the renderer of an answer; ``channel_formats`` maps the name of a
    channel a run names (``run(..., channel="web")``) to the renderer of its answers, over
    ``DEFAULT_CHANNEL_FORMATS``.
    ``language`` (``en`` or ``zh``) is the language of the runtime's own messages to the end
    user (a run stopped short, a failed model); a run's ``lang`` variable overrides it.

    The options few agents change come in groups (``hermes_agent.options``): ``pricing``
    (``Pricing``: the models' prices per 1,000 tokens), ``budget`` (``Budget``: what one run
    may spend; each may be set per run too), ``memory`` (``Memory``: how much of a session
    the prompt carries) and ``tool_execution`` (``ToolExecution``: timeouts, concurrency and
    the bound on every tool's result).
    """

    def __init__(
        self,
        model: Model | None = None,
        *,
        answer_model: Model | None = None,
        system_prompt: str | None = None,
        preamble: str | None = None,
        tools: Iterable[Tool | Callable[..., object]] = (),
        tool_choice: ToolChoice = "auto",
        toolsets: Iterable[str] | None = None,
        scratch_pad: bool = False,
        explain: bool = False,
        temperature: float | None = None,
        max_tokens: int | None = None,
        max_iterations: int = 5,
        max_retries: int = 2,
        storage: Storage | str | None = None,
        session_store: SessionStore | None = None,
        audit: bool = True,
        secrets: Iterable[str] = (),
        redact_patterns: Iterable[str] = (),
        approver: Approver | None = None,
        output_format: str = "text",
        channel_formats: Mapping[str, str] | None = None,
        tool_settings: Mapping[str, Mapping[str, object]] | None = None,
        language: str = "en",
        pricing: Pricing = _DEFAULT_PRICING,
        budget: Budget = _DEFAULT_BUDGET,
        memory: Memory = _DEFAULT_MEMORY,
        tool_execution: ToolExecution = _DEFAULT_TOOL_EXECUTION,
    ) -> None:
        configure_from_environment()  # HERMES_DEBUG=1 / DEBUG=1: the debug lines on stderr
        if max_iterations < 1:
            raise HermesAgentError("max_iterations must be at least 1")
        self.pricing = pricing
        """The models' prices (``Pricing``)."""
        self.budget = budget
        """What one run may spend unless it says otherwise (``Budget``)."""
        self.language = language_of(language)
        for candidate in (model, answer_model):
            if candidate is not None and not isinstance(candidate, Model):
                not_a_model(candidate)
        self._model = model
        self.answer_model = answer_model
        """Writes the final answer when set; ``model`` makes the tool calls."""
        self.explain = explain
        self.system_prompt = system_prompt
        self.preamble = preamble
        """Replaces the Hermes tools prompt's opening text (``None``: the Hermes text)."""
        self.tool_choice = tool_choice
        self.scratch_pad = scratch_pad
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.limits = LoopLimits(
            max_iterations=max_iterations,
            max_retries=max_retries,
            default_timeout=tool_execution.default_timeout,
            max_concurrency=tool_execution.max_concurrency,
            max_calls_per_turn=tool_execution.max_calls_per_turn,
        )
        self.toolsets = list(toolsets) if toolsets is not None else None
        self._audit = audit
        self._session_store = session_store
        self._attach(storage)
        self.redactor = Redactor(secrets, redact_patterns)
        """Masks this agent's secrets in all it stores (audit records and messages), whatever
        the store, and whoever else shares it."""
        self.history = HistoryLoader(
            history_window=memory.history_window,
            summary_max_chars=memory.summary_max_chars,
            summarize_with_model=memory.summarize_with_model,
        )
        self.registry = ToolRegistry()
        self.hooks = Hooks()
        self.runtime = ToolRuntime(
            threads=max(4, self.limits.max_concurrency),
            max_result_chars=tool_execution.max_result_chars,
        )
        self.approver = approver
        self.renderers: dict[str, Renderer] = dict(BUILTIN_RENDERERS)
        self.output_format = output_format
        self.channel_formats: dict[str, str] = {
            **DEFAULT_CHANNEL_FORMATS,
            **(channel_formats or {}),
        }
        """A channel's name → the format (renderer name) of the answers of a run that names
        it (``run(..., channel="wecom")``); ``output_format=`` of a run wins over it."""
        self.tool_settings = {name: dict(values) for name, values in (tool_settings or {}).items()}
        self._executor: ThreadPoolExecutor | None = None
        self._closers: list[Callable[[], None]] = []
        self.queue: QueueConfig | None = None
        """The config's ``queue:`` section: where ``hermes_agent.worker.submit`` sends this
        agent's runs."""
        for item in tools:
            self.add_tool(item if isinstance(item, Tool) else Tool.from_function(item))

    # -- construction -------------------------------------------------------------------

    @classmethod
    def from_config(cls, path: str | os.PathLike[str], **overrides: Unpack[AgentOptions]) -> Agent:
        """Build an agent from a YAML file (see ``hermes_agent.config``); keyword arguments
        (``Agent``'s, ``model`` included) override what the file says."""
        return cls.from_settings(load_config(path), **overrides)

    @classmethod
    def from_settings(cls, config: HermesConfig, **overrides: Unpack[AgentOptions]) -> Agent:
        """Build an agent from an already-validated ``HermesConfig`` (its keys become
        ``Agent``'s options in ``options.agent_options``); keyword arguments override them."""
        options = agent_options(config)
        options.update(overrides)
        model = options.pop("model", None) or build_model(config.model)
        if options.get("answer_model") is None and config.answer_model is not None:
            options["answer_model"] = build_model(config.answer_model)
        options["model"] = model
        agent = cls(**options)
        for point, hook in config_hooks(config):
            agent.add_hook(point, hook)
        for name, renderer in config_renderers(config):
            agent.add_renderer(name, renderer)
        agent.queue = config.queue
        # Last: what instruments the agent from outside (tracing) sees what the hooks changed.
        for wiring in _CONFIG_WIRINGS:
            wiring(agent, config)
        return agent

    def fork(
        self,
        *,
        model: Model | _Keep = _Keep.KEEP,
        answer_model: Model | _Keep | None = _Keep.KEEP,
        storage: Storage | str | _Keep | None = _Keep.KEEP,
        approver: Approver | _Keep | None = _Keep.KEEP,
        sessions: SessionStore | _Keep = _Keep.KEEP,
        audit_sink: AuditSink | _Keep | None = _Keep.KEEP,
    ) -> Agent:
        """A new agent with this one's tools, hooks, renderers, prompts, settings and secrets
        — shared, not copied: a tool added to either shows in both — and the given parts
        replaced. ``storage`` replaces the store and its sessions (a URL is opened, and closed
        by the fork's ``close``; ``None``: sessions in memory, no trail); ``sessions`` and
        ``audit_sink`` only where it keeps sessions and writes its trail. The fork has its
        own thread pool, worker processes, tool caches, rate limits and history summaries.

            twin = agent.fork(model=ScriptedModel(["ok"]), storage="memory://")
        """
        twin = copy.copy(self)
        # What a run changes is the agent's own, never shared with a fork.
        twin._executor = None
        twin.runtime = ToolRuntime(
            threads=max(4, twin.limits.max_concurrency),
            max_result_chars=self.runtime.max_result_chars,
        )
        twin.history = HistoryLoader(
            history_window=self.history.history_window,
            summary_max_chars=self.history.summary_max_chars,
            summarize_with_model=self.history.summarize_with_model,
            max_cached=self.history.max_cached,
        )
        twin._owns_storage = False
        if not isinstance(model, _Keep):
            twin._model = model
        if not isinstance(answer_model, _Keep):
            twin.answer_model = answer_model
        if not isinstance(approver, _Keep):
            twin.approver = approver
        if not isinstance(storage, _Keep):
            twin._session_store = None
            twin._attach(storage)
        if not isinstance(sessions, _Keep):
            twin._session_store = twin.sessions = sessions
        if not isinstance(audit_sink, _Keep):
            twin.audit_sink = audit_sink
        return twin

    def _attach(self, storage: Storage | str | None) -> None:
        """Keep sessions and the trail in ``storage`` (a URL is opened here and closed by
        ``close``); without one, sessions live in memory and there is no trail."""
        self._owns_storage = isinstance(storage, str)
        if isinstance(storage, str):
            storage = open_storage(storage)
        self.storage: Storage | None = storage
        self.sessions: SessionStore = self._session_store or (
            storage.sessions if storage is not None else InMemorySessionStore()
        )
        self.audit_sink: AuditSink | None = (
            storage.audit if storage is not None and self._audit else None
        )

    @property
    def memory(self) -> Memory:
        """How much of a session the prompt carries, as the agent does it now (the values
        live in ``history``, the loader of a session's history)."""
        h = self.history
        return Memory(h.history_window, h.summary_max_chars, h.summarize_with_model)

    @property
    def tool_execution(self) -> ToolExecution:
        """How tool calls run, as the agent runs them now (the values live in ``limits`` and
        ``runtime``)."""
        return ToolExecution(
            default_timeout=self.limits.default_timeout,
            max_concurrency=self.limits.max_concurrency,
            max_calls_per_turn=self.limits.max_calls_per_turn,
            max_result_chars=self.runtime.max_result_chars,
        )

    @property
    def model(self) -> Model:
        """The model; the embedded one is created on first use."""
        if self._model is None:
            from hermes_agent.models.llamacpp import LlamaCpp

            self._model = LlamaCpp()
        return self._model

    def warmup(self) -> float:
        """Get the model ready before the first request; the seconds it took.

        The embedded model (and an embedded ``answer_model``) is loaded and completes one
        token of a conversation with this agent's system prompt and tools, so that what every
        request starts with — the system turn, the tool definitions, the tool-call grammar —
        is evaluated and kept in llama.cpp's context: the first request then evaluates only its
        own message. Other models have nothing to load (an endpoint is not called).
        ``hermes-agent serve`` calls it before it reports ready (``/readyz``).

            agent = Agent()
            agent.warmup()       # at start-up, in the background if you like
        """
        from hermes_agent.protocol.prompts import EXPLAIN_PROMPT

        started = time.monotonic()
        tools = [tool.spec() for tool in self.registry.visible(self.toolsets)]
        parts = [p for p in (self.system_prompt, EXPLAIN_PROMPT if self.explain else None) if p]
        messages = [Message("system", "\n\n".join(parts))] if parts else []
        messages.append(Message("user", "hello"))
        choice = self.tool_choice if tools else "auto"
        settings = ModelSettings(
            tool_choice=choice, scratch_pad=self.scratch_pad, max_tokens=1, preamble=self.preamble
        )
        warm_embedded([(self.model, tools), (self.answer_model, [])], messages, settings)
        return time.monotonic() - started

    # -- tools --------------------------------------------------------------------------

    @overload
    def tool(self, function: F) -> F: ...

    @overload
    def tool(
        self,
        *,
        name: str | None = None,
        toolset: str = DEFAULT_TOOLSET,
        timeout: float | None = None,
        check_fn: Callable[[], bool] | None = None,
        **settings: Unpack[ToolSettings],
    ) -> Callable[[F], F]: ...

    def tool(
        self,
        function: F | None = None,
        *,
        name: str | None = None,
        toolset: str = DEFAULT_TOOLSET,
        timeout: float | None = None,
        check_fn: Callable[[], bool] | None = None,
        **settings: Unpack[ToolSettings],
    ) -> F | Callable[[F], F]:
        """Register a function as a tool; its schema comes from type hints and docstring.

        Use bare (``@agent.tool``) or with options (``@agent.tool(timeout=5,
        execution_mode="subprocess")``; see ``Tool`` for every setting).
        """

        def decorate(fn: F) -> F:
            self.add_tool(
                Tool.from_function(
                    fn,
                    name=name,
                    toolset=toolset,
                    timeout=timeout,
                    check_fn=check_fn,
                    **settings,
                )
            )
            return fn

        return decorate(function) if function is not None else decorate

    def register_tool(
        self,
        name: str | None = None,
        description: str | None = None,
        parameters: Mapping[str, object] | type[BaseModel] | None = None,
        *,
        toolset: str = DEFAULT_TOOLSET,
        timeout: float | None = None,
        check_fn: Callable[[], bool] | None = None,
        **settings: Unpack[ToolSettings],
    ) -> Callable[[F], F]:
        """Register a tool with an explicit name, description and parameters schema.

        ``parameters`` is either a full JSON Schema object, the shorthand mapping
        property → schema, where a property is required unless it has a ``default``, or a
        pydantic model whose fields are the arguments (see ``hermes_agent.tools.registry``).
        """

        def decorate(fn: F) -> F:
            self.add_tool(
                Tool.from_function(
                    fn,
                    name=name,
                    description=description,
                    parameters=parameters,
                    toolset=toolset,
                    timeout=timeout,
                    check_fn=check_fn,
                    **settings,
                )
            )
            return fn

        return decorate

    def add_tool(self, tool: Tool, *, replace: bool = False) -> Tool:
        """Register a ``Tool`` object (settings from the config's ``tools:`` section apply)."""
        settings = self.tool_settings.get(tool.name)
        if settings:
            tool.configure(**settings)
        return self.registry.add(tool, replace=replace)

    def add_hook(self, point: str | HookBase, hook: Hook | HookBase | None = None) -> Hook:
        """Run ``hook(ctx)`` at ``point`` (``pre_thought``, ``post_execution``, ...); see
        ``hermes_agent.pipeline.hooks`` for what a hook may do. A hook class instance
        (``PreThoughtHook``...) may be given alone: its class names the point. An object
        with an ``execute(context)`` method is called through it."""
        if isinstance(point, HookBase) and hook is None:
            return self.hooks.add(point.point, point)
        if not isinstance(point, str) or hook is None:
            raise HermesAgentError("add_hook(point, hook), or add_hook(hook_instance)")
        return self.hooks.add(point, as_hook(hook))

    def add_renderer(self, name: str, renderer: Renderer) -> None:
        """Register an output format: ``renderer(RenderInput) -> str``."""
        if not callable(renderer):
            raise HermesAgentError(f"renderer {name!r} must be callable")
        self.renderers[name] = renderer

    @property
    def tools(self) -> list[Tool]:
        return list(self.registry)

    # -- running ------------------------------------------------------------------------

    def run(
        self,
        message: str,
        *,
        session_id: str | None = None,
        tool_choice: ToolChoice | None = None,
        toolsets: Iterable[str] | None = None,
        dry_run: bool = False,
        output_format: str | None = None,
        channel: str | None = None,
        output_type: type[DataT] | Mapping[str, Any] | None = None,
        variables: Mapping[str, object] | None = None,
        max_run_tokens: int | None = None,
        max_run_cost: float | None = None,
        run_timeout_s: float | None = None,
        new_session: bool = False,
    ) -> RunResult[DataT]:
        """Answer ``message`` (sync). Works with no event loop in sight; inside a running
        loop, prefer ``await agent.arun(...)``. ``dry_run=True`` stops after the ToolSelector
        and returns the planned calls (validated arguments, ``result=None``) without running
        any tool. ``output_type`` (a pydantic model or a JSON Schema dict) asks for a
        structured answer: ``result.data`` is the validated instance (see ``arun``).
        ``variables``, the budgets and ``new_session``: see ``arun``."""
        coroutine = self.arun(
            message,
            session_id=session_id,
            tool_choice=tool_choice,
            toolsets=toolsets,
            dry_run=dry_run,
            output_format=output_format,
            channel=channel,
            output_type=output_type,
            variables=variables,
            max_run_tokens=max_run_tokens,
            max_run_cost=max_run_cost,
            run_timeout_s=run_timeout_s,
            new_session=new_session,
        )
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return run_in_thread_loop(coroutine)
        # Called from async code (a notebook, a web handler): run in a helper thread rather
        # than fail, so the sync facade works everywhere.
        with ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(asyncio.run, coroutine).result()

    async def arun(
        self,
        message: str,
        *,
        session_id: str | None = None,
        tool_choice: ToolChoice | None = None,
        toolsets: Iterable[str] | None = None,
        listener: EventListener | None = None,
        stream: StreamChoice = False,
        dry_run: bool = False,
        output_format: str | None = None,
        channel: str | None = None,
        output_type: type[DataT] | Mapping[str, Any] | None = None,
        request_id: str | None = None,
        journal: RunJournal | None = None,
        approver: Approver | None = None,
        variables: Mapping[str, object] | None = None,
        max_run_tokens: int | None = None,
        max_run_cost: float | None = None,
        run_timeout_s: float | None = None,
        new_session: bool = False,
        client: ClientTurn | None = None,
    ) -> RunResult[DataT]:
        """Answer ``message``. ``listener`` receives an ``Event`` at each stage (and each text
        delta when ``stream`` is true; ``stream`` may also be a callable, asked before each
        model turn whether to stream that one). ``output_format`` (text, markdown, json, table, or a
        registered renderer) or ``channel`` (cli, web, api, or one from the config) picks how
        ``RunResult.rendered`` is made.

        ``output_type`` — a pydantic model (or any type pydantic validates) or a JSON Schema
        dict — makes the final answer JSON that must validate: ``result.data`` is the instance
        (a dict for a JSON Schema), ``result.output`` its JSON. An answer that does not
        validate goes back to the model with the errors, at most ``max_retries`` times
        (``result.output_retries``); when none validates, ``OutputValidationError`` is raised
        (its ``result`` has status 422), after the turn was recorded. See
        ``pipeline.structured``.

        ``variables`` (request data: ``{"lang": "zh", "operator_id": "op-7"}``) start the run's
        ``ctx.variables``: hooks see them, ``{{ lang }}`` in the system prompt is filled from
        them, the trail records them, and ``result.variables`` returns them (see
        ``pipeline.variables`` for their bounds). ``max_run_tokens``, ``max_run_cost`` and
        ``run_timeout_s`` replace the agent's budgets for this run (``pipeline.budget``).

        A run with no ``session_id`` starts a session of its own, and reads no history: there
        is none. ``new_session=True`` says the same of a ``session_id`` the caller made up for
        this run (the service does, for a run that names no session): its history is not read
        from the store, and the turn is saved under it as usual.

        A durable run (the queue workers; ``hermes_agent.worker``) passes its ``request_id``,
        a ``journal`` (``pipeline.journal``: model turns and tool calls of an earlier attempt
        are taken from it, and the turn is saved through it) and the ``approver`` of that run.

        ``client``: the caller's own tools, or its results of the calls the last run handed
        out (``pipeline.client_tools``).
        """
        options = checked_options(
            self,
            output_type=output_type,
            variables=variables,
            max_run_tokens=max_run_tokens,
            max_run_cost=max_run_cost,
            run_timeout_s=run_timeout_s,
        )
        new_session = new_session or not session_id
        session_id = session_id or uuid.uuid4().hex
        if self.storage is not None:  # refused now, before anything has happened
            check_session_id(session_id, self.storage.max_id_length)
        lock = self.sessions.lock(session_id)
        if not lock.acquire(blocking=False):
            await acquire_elsewhere(lock)
        try:
            ctx = build_context(
                self,
                message,
                session_id,
                options,
                tool_choice=tool_choice,
                toolsets=toolsets,
                listener=listener,
                stream=stream,
                dry_run=dry_run,
                output_format=output_format,
                channel=channel,
                request_id=request_id,
                journal=journal,
                approver=approver,
                new_session=new_session,
                client=client,
            )
            try:
                result = await run_turn(ctx, self.hooks)
            finally:
                if ctx.recorder is not None and (journal is None or journal.holds()):
                    ctx.recorder.commit()  # whatever whole steps a failing run left
            if ctx.recorder is not None:
                result.warnings.extend(ctx.recorder.warnings())
            # A failed run (the model after its retries, a stage, a hook, refused input, an
            # answer that never matched its schema) leaves the session as it was: its output
            # is an account of the failure, not an answer, and the next turn must not read it
            # as history. The trail keeps the whole failed turn.
            failed = result.loop_status in ("failed", "timed_out")
            if journal is not None and not dry_run:
                saved = [] if failed else redact_messages(ctx.messages_to_save(), self.redactor)
                await journal.save_turn(session_id, saved)  # failures fail the attempt
            elif ctx.new_messages and not dry_run and not failed:
                turn = redact_messages(ctx.messages_to_save(), self.redactor)
                sessions = self.sessions
                problem = await off_the_loop(
                    sessions, session_id, lambda: save_turn(sessions, session_id, turn), append=True
                )
                if problem is not None:  # the tools have run: a turn not saved is a warning
                    result.warnings.append(problem)
            if isinstance(lock, AcquiresAsync) and lock.unheld is not None:
                result.warnings.append(lock.unheld)
            run_pricing(self).fill(result)
        finally:
            lock.release()
        if options.spec is not None and result.status == Status.UNPROCESSABLE:
            raise OutputValidationError(
                result.error or "the answer did not match the output type",
                result=result,
                problems=ctx.output_problems,
            )
        return result

    async def astream(
        self,
        message: str,
        *,
        session_id: str | None = None,
        tool_choice: ToolChoice | None = None,
        toolsets: Iterable[str] | None = None,
        output_type: OutputType | None = None,
        variables: Mapping[str, object] | None = None,
    ) -> AsyncIterator[Event]:
        """Yield events as the run happens (see ``hermes_agent.events`` for every kind):
        ``TextDeltaEvent``, ``ToolCallStartedEvent``, ``ToolCallParsedEvent``,
        ``ToolResultsEvent``, ... and finally a ``ResultEvent`` whose ``result`` is the
        ``RunResult``."""
        queue: asyncio.Queue[Event | None] = asyncio.Queue()
        task = asyncio.create_task(
            self.arun(
                message,
                session_id=session_id,
                tool_choice=tool_choice,
                toolsets=toolsets,
                listener=queue.put_nowait,
                stream=True,
                output_type=output_type,
                variables=variables,
            )
        )
        task.add_done_callback(lambda _: queue.put_nowait(None))
        try:
            while (event := await queue.get()) is not None:
                yield event
            yield ResultEvent(task.result())
        finally:
            if not task.done():
                task.cancel()

    def replay(self, request_id: str) -> ReplayReport:
        """Re-run a recorded request with its recorded model outputs against the current tools
        and prompts; the ``ReplayReport`` says per step whether calls, results and the output
        still match. Needs ``storage`` (where the request was recorded)."""
        if self.storage is None:
            raise HermesAgentError(
                "replay needs the store the request was recorded in; create the agent with "
                "storage='sqlite:///.hermes/state.db' (or your storage URL)"
            )
        from hermes_agent.replay import replay

        return replay(_Replaying(self), request_id, self.storage)

    def _thread_pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max_workers=max(4, self.limits.max_concurrency),
                thread_name_prefix="hermes-tool",
            )
        return self._executor

    def on_close(self, callback: Callable[[], None]) -> None:
        """Have ``close`` call ``callback`` (e.g. to stop the MCP servers this agent's tools
        talk to, which start again on the next call)."""
        self._closers.append(callback)

    async def close_connections(self) -> None:
        """Close what the agent's models (``ClosesConnections``) opened on the running loop;
        its owner calls it before the loop ends (``close`` does, for the sync facade's)."""
        await close_connections_of((self._model, self.answer_model))

    def close(self) -> None:
        """Release the tool thread pool, worker processes and this thread's sync-facade
        connections (the agent stays usable; they start again on demand)."""
        on_thread_loop(self.close_connections)
        for callback in list(self._closers):
            callback()
        self.runtime.close()
        if self.audit_sink is not None:
            self.audit_sink.flush()
        if self._owns_storage and self.storage is not None:
            self.storage.close()  # opened from a URL by this agent, so closed by it too
            self.storage = None
            self.audit_sink = None
            self.sessions = InMemorySessionStore()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


class _Replaying:
    """The agent as replay forks it: the recorded model serves the answer model's turns too
    (the trail holds both models' completions, in order)."""

    def __init__(self, agent: Agent) -> None:
        self._agent = agent

    def fork(self, *, model: Model, storage: Storage, approver: Approver) -> Agent:
        routed = self._agent.answer_model is not None
        return self._agent.fork(
            model=model,
            answer_model=model if routed else _Keep.KEEP,
            storage=storage,
            approver=approver,
        )
