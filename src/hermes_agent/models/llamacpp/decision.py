"""The call decision of an ``auto`` turn: how much more likely the model is to open a tool call
than to begin a text answer, measured against the same prompt with a neutral user message (see
``LlamaCpp``'s ``call_bias``)."""

from __future__ import annotations

from typing import Any

from hermes_agent.models.llamacpp.context import Candidates, LoadedModel, tokenize_prompt
from hermes_agent.models.llamacpp.files import import_llama_cpp
from hermes_agent.models.llamacpp.guide import WIDE_CHECK, top_ids

__all__ = [
    "CALL_OPENER",
    "CALL_WEIGHT",
    "DEFAULT_CALL_BIAS",
    "NEUTRAL_MESSAGE",
    "call_baseline",
    "call_likelihood",
    "call_margin",
]

DEFAULT_CALL_BIAS = 6.5
"""Added to the call side of the decision of an ``auto`` turn (see ``LlamaCpp``): calibrated on
BFCL (``benchmarks/bfcl_call_bias.py``, docs/evaluation.md) for the bundled SmolLM2-135M."""

NEUTRAL_MESSAGE = "OK."
"""The user message of a decision's baseline: the same system prompt and tools, a message that
asks for nothing. Every tool's text in the prompt makes the call opener more likely whatever the
question (with SmolLM2, 0.3 to 1.3 nats from one demo tool to three), so an absolute margin calls
less the fewer tools there are; measured against this baseline, it does not."""

CALL_WEIGHT = 4.0
"""How much the call itself weighs in the decision: ``CALL_WEIGHT`` times the mean log-probability
per token of the call greedy decoding would write (``call_likelihood``). The opener says whether
the model expects *a* call; the call says whether it has one to make: asked "Hello!" beside the
calculator, SmolLM2 opens a call as readily as after "What is 17 * 23?", but then invents its
argument (about -1.7 nats a token, against -0.7 for a call that copies the question). Fitted on
BFCL (``benchmarks/bfcl_call_bias.py``): 4 to 8 separate the two sides best."""

_MAX_BASELINES = 32

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


def call_baseline(loaded: LoadedModel, prompt: str, text_grammar: str) -> float | None:
    """``call_margin`` of ``prompt`` (the conversation's system prompt and tools, then
    ``NEUTRAL_MESSAGE``), computed once per prompt and kept (a toolset's first turn pays it).
    Runs under ``loaded.lock``."""
    key = f"{text_grammar}\x00{prompt}"
    if key in loaded.baselines:
        return loaded.baselines[key]
    baseline = call_margin(loaded, prompt, text_grammar)
    if len(loaded.baselines) >= _MAX_BASELINES:
        loaded.baselines.pop(next(iter(loaded.baselines)))
    loaded.baselines[key] = baseline
    return baseline


def call_likelihood(loaded: LoadedModel, prompt: str, calls_grammar: str, max_tokens: int) -> float:
    """The mean log-probability per token the model gives the call it writes greedily after
    ``prompt`` under ``calls_grammar`` (at most ``max_tokens`` tokens; the end of the turn not
    counted). The call is decoded, then scored as the model would spell it (the grammar guide
    may split a token the model wanted), with the model's own probabilities, before the grammar
    masks anything: a call the grammar had to force scores low. Runs under ``loaded.lock``."""
    import numpy as np

    from hermes_agent.models.llamacpp.guide import GrammarGuide

    llm = loaded.llm
    prompt_tokens = tokenize_prompt(llm, prompt)
    n_vocab = llm.n_vocab()

    def logits() -> Any:
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,)).astype(np.single)

    def evaluate_prompt() -> None:
        loaded.reuse_context(prompt_tokens)
        kept = min(
            llm.longest_token_prefix(llm._input_ids.tolist(), prompt_tokens),
            len(prompt_tokens) - 1,
        )
        llm.n_tokens = kept
        llm.eval(prompt_tokens[kept:])

    evaluate_prompt()
    ends = {llm.token_eos(), *llm.tokenize(b"<|im_end|>", add_bos=False, special=True)}
    guide = GrammarGuide(loaded, loaded.grammar_sampler(calls_grammar), greedy=True)
    written: list[int] = []
    while len(written) < max_tokens and llm.n_tokens < llm.n_ctx():
        token = int(np.argmax(guide(llm._input_ids, logits())))
        if guide.lost or token in ends:
            break
        written.append(token)
        llm.eval([token])
    spelled = llm.tokenize(llm.detokenize(written), add_bos=False, special=True)
    if not spelled:
        return float("-inf")
    evaluate_prompt()
    total = 0.0
    for token in spelled:
        if llm.n_tokens >= llm.n_ctx():
            break
        scores = logits().astype(np.float64)
        top = scores.max()
        total += float(scores[token] - top - np.log(np.exp(scores - top).sum()))
        llm.eval([token])
    return total / len(spelled)
