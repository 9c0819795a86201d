"""One loaded ``Llama`` and what its users share: the lock, compiled grammar samplers, token
texts, the reusable candidate buffer the grammar checks fill, and the contexts copied aside and
put back (``LoadedModel.reuse_context``).

A prompt that shares a prefix with what the model evaluated last evaluates only the rest
(llama-cpp-python's prefix reuse). A context about to be overwritten past a long shared prefix is
first copied aside, and put back when a later prompt shares more with it: the call decision's two
renderings of one conversation, and two conversations taking turns, then evaluate each new turn
once. Up to two copies are kept, each the size of the KV cache it holds (for SmolLM2 about 23 KB a
token: up to 190 MB at ``n_ctx`` 8192, and a third while one is swapped for the live context).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hermes_agent.errors import ModelError
from hermes_agent.models.llamacpp.files import import_llama_cpp
from hermes_agent.protocol.chatml import escape_content

__all__ = ["Candidates", "LoadedModel", "tokenize_prompt", "unescaped_controls"]

_MAX_CACHED_GRAMMARS = 32
_SNAPSHOTS = 2  # contexts kept aside by LoadedModel.reuse_context, most recently used last
_SNAPSHOT_MIN_TOKENS = 64  # fewer evaluated tokens at stake than this: not worth a copy


@dataclass
class LoadedModel:
    """One loaded ``Llama``, the lock that serialises its use, and what its grammar guides share.

    Everything here except ``llm`` and ``lock`` is only touched while ``lock`` is held.
    """

    llm: Any
    lock: threading.Lock = field(default_factory=threading.Lock)
    grammars: dict[str, Any] = field(default_factory=dict)  # GBNF text -> llama_sampler
    candidates: Candidates | None = None
    pieces: dict[bytes, int] | None = None  # token text -> token id, for GrammarGuide
    snapshots: list[_Snapshot] = field(default_factory=list)  # see reuse_context
    baselines: dict[str, float | None] = field(default_factory=dict)  # see decision.call_baseline

    def grammar_sampler(self, text: str) -> Any:
        """A llama.cpp grammar sampler for ``text`` in its initial state (compiled once)."""
        llama_cpp = import_llama_cpp()
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
        llama_cpp = import_llama_cpp()
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
        llama_cpp = import_llama_cpp()
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


def tokenize_prompt(llm: Any, prompt: str) -> list[int]:
    """``prompt`` as ``create_completion`` tokenizes it: special tokens are parsed, so the
    template's markers are control tokens. Content cannot be: the renderer escaped every
    control-token string in it (``protocol.chatml.escape_content``)."""
    tokens: list[int] = llm.tokenize(prompt.encode("utf-8"), special=True)
    return tokens


def unescaped_controls(llm: Any) -> list[str]:
    """The control tokens of ``llm``'s vocabulary that ``escape_content`` leaves whole: none for
    the bundled SmolLM2 and every ``<|...|>`` vocabulary; a GGUF of another family may have
    some, and content holding them would reach that model as control tokens."""
    llama_cpp = import_llama_cpp()
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    control = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL
    texts = (
        llm.detokenize([token], special=True).decode("utf-8", "replace")
        for token in range(llm.n_vocab())
        if llama_cpp.llama_vocab_get_attr(vocab, token) & control
    )
    return sorted({text for text in texts if text and escape_content(text) == text})


class Candidates:
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
