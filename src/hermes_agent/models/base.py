"""The model seam: one async method to complete a conversation, one to stream it, and what the
model declares about itself.

A model receives protocol-neutral ``Message`` objects and the tools as OpenAI-format dicts, and
decides how to put them on its wire: a Hermes model renders the system prompt with
``protocol.chatml.render_conversation``; an OpenAI-compatible endpoint in ``native`` mode sends
``tools`` as structured data. Either way it returns a parsed ``Completion`` plus the raw text.

What the pipeline needs to know about a model beyond that — its context window, how it counts
tokens, what its prompt looks like on the wire, whether it can summarise — is part of the
contract (``Model.profile``, ``render_prompt``, ``count_tokens``), not discovered by probing.
``ModelBase`` gives sensible defaults, so a new backend writes only ``complete`` and ``stream``::

    class EchoModel(ModelBase):
        name = "echo"

        async def complete(self, messages, tools, settings):
            text = messages[-1].content
            return ModelResponse(Completion(content=text), text, model_name=self.name)

        async def stream(self, messages, tools, settings):
            yield StreamChunk(messages[-1].content)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from hermes_agent.models.profiles import ThoughtPolicy
from hermes_agent.protocol.chatml import render_conversation, to_chatml
from hermes_agent.types import Message, ModelResponse, StreamChunk, ToolChoice

ToolChoiceEnforcement = Literal["grammar", "server", "prompt"]


@dataclass(slots=True)
class ModelSettings:
    """Per-request generation settings; ``None`` means the model's own default."""

    temperature: float | None = None
    max_tokens: int | None = None
    tool_choice: ToolChoice = "auto"
    scratch_pad: bool = False
    output_schema: dict[str, Any] | None = None
    """Structured output: the JSON Schema a text answer must match (the pipeline validates it
    and states it in the prompt). A model that constrains decoding keeps its text answers
    inside the schema (the embedded model's grammar does); others may ignore it."""
    preamble: str | None = None
    """The opening role text of the Hermes tools prompt (``None``: the Hermes text,
    ``protocol.prompts.HERMES_PREAMBLE``); config ``prompt.preamble``."""


def grammar_tool_choice(messages: Sequence[Message], settings: ModelSettings) -> ToolChoice:
    """The tool choice a turn decoded under the project's grammar is held to (the embedded
    model; an endpoint in ``hermes`` mode with ``grammar``): ``settings.tool_choice``, except
    that a structured turn (``output_schema``) free to choose (``auto``) with tool results in
    hand answers (``"none"``: the grammar of the schema's JSON alone).

    Offered "a valid call or the schema's JSON" there, a small model calls the same tool
    again at every turn until the run's bound (SmolLM2 does, whether it runs embedded or
    behind ``llama_cpp.server``), and the caller gets no answer at all. So a structured run
    on such a model calls in one round, then answers; the turn that answers the user keeps
    the choice between a call and the answer."""
    after_results = bool(messages) and messages[-1].role == "tool"
    if settings.output_schema is not None and settings.tool_choice == "auto" and after_results:
        return "none"
    return settings.tool_choice


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """What a model declares about itself.

    ``context_window``: prompt and answer together, in tokens; when set, the pipeline fits each
    prompt to it (``None``: unknown, prompts are sent as they are). ``max_tokens``: the answer
    length the model uses when a request does not say (the room kept free for the answer).
    ``can_summarize``: the agent may ask this model to summarise old turns of a long session
    (a 135M model cannot do it usefully; an endpoint model can). ``tool_choice_enforcement``:
    how a required call is put to the model — ``grammar`` (decoding constrained to valid calls,
    locally or by the server), ``server`` (the endpoint's own ``tool_choice``) or ``prompt``
    (an instruction only); the pipeline checks that a call came whichever it is.
    ``price_per_1k_prompt`` / ``price_per_1k_completion``: what 1,000 tokens cost, for
    ``RunResult.cost`` and ``max_run_cost`` (``None``: not priced); prices given to the
    ``Agent`` take precedence (see ``hermes_agent.pricing``). ``provider``: who serves the
    model, as OpenTelemetry's ``gen_ai.provider.name`` names it (``openai`` for any
    OpenAI-compatible endpoint: the API the client speaks; empty: the model's class name).
    ``server_url``: where requests go, for a model called over the network (``None``: in this
    process). ``thought``: what a call written inside the model's thought is, and whether its
    template opens the thought (``models.profiles``); ``None``: the family's, by the model's
    name.
    """

    context_window: int | None = None
    max_tokens: int | None = None
    can_summarize: bool = False
    tool_choice_enforcement: ToolChoiceEnforcement = "prompt"
    price_per_1k_prompt: float | None = None
    price_per_1k_completion: float | None = None
    provider: str = ""
    server_url: str | None = None
    thought: ThoughtPolicy | None = None


@runtime_checkable
class Model(Protocol):
    """Anything that can complete a conversation (see ``ModelBase`` for the defaults)."""

    name: str

    @property
    def profile(self) -> ModelProfile:
        """What this model declares about itself (read at each request: it may change)."""
        ...

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        settings: ModelSettings,
    ) -> ModelResponse:
        """Return the model's next turn for ``messages``."""
        ...

    def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        settings: ModelSettings,
    ) -> AsyncIterator[StreamChunk]:
        """Yield the next turn as Hermes-format text chunks; the last chunk carries usage."""
        ...

    def render_prompt(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        settings: ModelSettings,
    ) -> str:
        """The request as it goes on the wire (text), for the audit trail and for counting."""
        ...

    def count_tokens(self, text: str) -> int:
        """How many tokens ``text`` takes for this model (an estimate is fine)."""
        ...


@runtime_checkable
class ClosesConnections(Protocol):
    """A model that holds connections on the event loop that opened them (``OpenAICompatible``):
    whoever owns a loop — the service, a worker, the sync facade's thread — calls ``aclose`` on
    it before the loop ends (``Agent.close_connections``)."""

    async def aclose(self) -> None:
        """Close the connections this model opened on the running event loop."""
        ...


class ModelBase:
    """Defaults for the optional parts of the ``Model`` contract: no declared context window,
    a ChatML rendering of the prompt, and a token estimate of one per three characters (which
    errs on the safe side for English and code). Subclasses write ``complete`` and ``stream``.
    """

    name: str = "model"

    @property
    def profile(self) -> ModelProfile:
        return ModelProfile()

    def render_prompt(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        settings: ModelSettings,
    ) -> str:
        wire = render_conversation(
            messages,
            tools,
            scratch_pad=settings.scratch_pad,
            tool_choice=settings.tool_choice,
            preamble=settings.preamble,
        )
        return to_chatml(wire)

    def count_tokens(self, text: str) -> int:
        return estimate_tokens(text)


def estimate_tokens(text: str) -> int:
    """One token per three characters, rounded up: safe for English and code."""
    return len(text) // 3 + 1
