"""The call decision of an ``auto`` turn: how much more likely the model is to open a tool call
than to begin a text answer (see ``LlamaCpp``'s ``call_bias``)."""

from __future__ import annotations

from typing import Any

from hermes_agent.models.llamacpp.context import Candidates, LoadedModel, tokenize_prompt
from hermes_agent.models.llamacpp.files import import_llama_cpp
from hermes_agent.models.llamacpp.guide import WIDE_CHECK, top_ids

__all__ = ["CALL_OPENER", "DEFAULT_CALL_BIAS", "call_margin"]

DEFAULT_CALL_BIAS = 7.875
"""Added to the call side of the decision of an ``auto`` turn (see ``LlamaCpp``): calibrated on
BFCL (``benchmarks/bfcl_call_bias.py``, docs/evaluation.md) for the bundled SmolLM2-135M."""

CALL_OPENER = '<tool_call>\n{"name": "'
"""What every call starts with under the grammar, up to the tool's name."""


def call_margin(loaded: LoadedModel, prompt: str, text_grammar: str) -> float | None:
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
    prompt_tokens = tokenize_prompt(llm, prompt)
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
        loaded.candidates = Candidates(import_llama_cpp(), n_vocab)
    sampler = loaded.grammar_sampler(text_grammar)
    text = float("-inf")
    for width in (1, WIDE_CHECK, n_vocab):
        ids = top_ids(first, width)
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
