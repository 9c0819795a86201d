"""Long parser fuzz: many generated completions, one-shot against streamed, timed.

Run: ``python benchmarks/fuzz_parser.py [--inputs 100000] [--seed 0]``

Input ``i`` is ``random_completion(random.Random(f"{seed}:{i}"))`` from
tests/protocol/test_parser_fuzz.py (the generator the test suite fuzzes with: tags with and without
newlines, valid and broken JSON, Python-style dicts, deep nesting, double encoding, code fences,
lists of calls with and without their commas, unclosed tags, tags and braces inside strings, CJK,
garbage between; and the forms of thinking and Qwen models: ``<think>`` thoughts closed, unclosed
and pre-opened with calls inside them, Qwen3-Coder XML calls, ``<tools>`` blocks, echoed tool
definitions). Every 500th input is a large one (10k to 200k characters). Each input is parsed by
``parse_completion`` and by a ``StreamParser`` fed a random chunking (token-sized, random cuts, one
character at a time, or whole), and counted as

- an exception: either path raised;
- a disagreement: the streamed completion differs from the one-shot one (ids included), or
  its events break the invariants tests/protocol/test_stream_parser.py checks.

It prints both counts (with the seeds of the first failures, to replay one alone), how many
inputs held each of the newer forms, the median throughput of both paths, and the worst time
per MB among inputs of 10k characters or more (each is timed again, one-shot and in
4-character chunks, median of 3, so that one scheduling hiccup does not count).
Exits 1 if anything failed.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

# The generator and the comparison live in the test suite (pytest and hypothesis must be
# installed: the dev extra).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from hermes_agent.protocol.parser import (
    NOTE_CALL_IN_THOUGHT,
    NOTE_REVEALED_THOUGHT,
    NOTE_UNCLOSED_THOUGHT,
    parse_completion,
)
from hermes_agent.types import Completion
from test_parser import counter_ids
from test_parser_fuzz import random_completion
from test_stream_parser import check_events, split, stream

LARGE_EVERY = 500
TIMED_MIN_CHARS = 10_000


@dataclass
class Tally:
    inputs: int = 0
    chars: int = 0
    exceptions: list[str] = field(default_factory=list)
    disagreements: list[str] = field(default_factory=list)
    one_shot_rates: list[float] = field(default_factory=list)  # MB/s, inputs of >= 1k chars
    stream_rates: list[float] = field(default_factory=list)
    large: list[str] = field(default_factory=list)  # seeds of inputs of >= 10k characters
    forms: dict[str, int] = field(default_factory=dict)  # inputs that hold each newer form


def chunk_cuts(text: str, rng: random.Random) -> tuple[str, list[int]]:
    """A random chunking of ``text``: its name and where it cuts."""
    how = rng.choice(["tokens", "tokens", "random", "chars", "whole"])
    if how == "chars" and len(text) > 5_000:
        how = "tokens"
    if how == "tokens":
        cuts, pos = [], 0
        while pos < len(text):
            pos += rng.randint(1, 8)
            cuts.append(pos)
        return how, cuts
    if how == "random":
        return how, [rng.randint(0, len(text)) for _ in range(rng.randint(1, 1 + len(text) // 4))]
    if how == "chars":
        return how, list(range(len(text)))
    return how, []


def timed(fn: Callable[[], object]) -> tuple[object, float]:
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def check_one(seed: str, tally: Tally) -> None:
    index = int(seed.rsplit(":", 1)[1])
    rng = random.Random(seed)
    text = random_completion(rng, large=index % LARGE_EVERY == LARGE_EVERY - 1)
    how, cuts = chunk_cuts(text, rng)
    chunks = split(text, cuts)
    tally.inputs += 1
    tally.chars += len(text)
    try:
        parsed, one_shot = timed(lambda: parse_completion(text, new_id=counter_ids()))
        expected = cast(Completion, parsed)
        (got, events), streamed = timed(lambda: stream(chunks))
    except Exception as exc:
        tally.exceptions.append(f"{seed}: {type(exc).__name__}: {str(exc)[:200]}")
        return
    try:
        assert got == expected, "streamed completion differs"
        check_events(got, events)
    except AssertionError as exc:
        tally.disagreements.append(f"{seed} ({how} chunks): {str(exc)[:200]}")
    count_forms(expected, tally.forms)
    if len(text) >= 1_000:
        tally.one_shot_rates.append(len(text) / 1e6 / one_shot)
        tally.stream_rates.append(len(text) / 1e6 / streamed)
    if len(text) >= TIMED_MIN_CHARS:
        tally.large.append(seed)


def count_forms(completion: Completion, forms: dict[str, int]) -> None:
    seen = {
        "a thought": completion.thought is not None,
        "a call inside a thought (not run)": NOTE_CALL_IN_THOUGHT in completion.notes,
        "a pre-opened thought (bare </think>)": NOTE_REVEALED_THOUGHT in completion.notes,
        "an unclosed thought": NOTE_UNCLOSED_THOUGHT in completion.notes,
        "an XML call": any(call.text_arguments for call in completion.tool_calls),
        "a broken XML call": any("XML call" in e.message for e in completion.errors),
        "an echoed tool definition": any("definition" in e.message for e in completion.errors),
    }
    for form, present in seen.items():
        forms[form] = forms.get(form, 0) + present


def retime(seed: str) -> tuple[float, float, int]:
    """Seconds per MB (one-shot, streamed in 4-character chunks) for one input, median of 3."""
    index = int(seed.rsplit(":", 1)[1])
    text = random_completion(random.Random(seed), large=index % LARGE_EVERY == LARGE_EVERY - 1)
    chunks = split(text, list(range(0, len(text), 4)))
    one_shot = statistics.median(timed(lambda: parse_completion(text))[1] for _ in range(3))
    streamed = statistics.median(timed(lambda: stream(chunks))[1] for _ in range(3))
    mb = len(text) / 1e6
    return one_shot / mb, streamed / mb, len(text)


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--inputs", type=int, default=100_000, help="how many (default 100,000)")
    args.add_argument("--seed", default="0", help="seed prefix (default 0)")
    options = args.parse_args()
    tally = Tally()
    started = time.perf_counter()
    for i in range(options.inputs):
        check_one(f"{options.seed}:{i}", tally)
        if (i + 1) % 10_000 == 0:
            print(f"  {i + 1:,} inputs, {time.perf_counter() - started:.0f} s", flush=True)
    elapsed = time.perf_counter() - started
    worst = [(*retime(seed), seed) for seed in tally.large]
    worst_one_shot = max(worst, default=(0.0, 0.0, 0, ""), key=lambda w: w[0])
    worst_stream = max(worst, default=(0.0, 0.0, 0, ""), key=lambda w: w[1])

    print(f"\ninputs: {tally.inputs:,} ({tally.chars / 1e6:.1f} M characters) in {elapsed:.0f} s")
    print(f"large inputs (>= {TIMED_MIN_CHARS:,} characters): {len(tally.large)}")
    print(f"exceptions: {len(tally.exceptions)}")
    print(f"one-shot/stream disagreements: {len(tally.disagreements)}")
    print("inputs holding " + ", ".join(f"{form}: {n:,}" for form, n in tally.forms.items()))
    for line in (tally.exceptions + tally.disagreements)[:10]:
        print(f"  {line}")
    print(
        f"median throughput (inputs >= 1k characters): one-shot "
        f"{statistics.median(tally.one_shot_rates):.1f} MB/s, stream (random chunking) "
        f"{statistics.median(tally.stream_rates):.1f} MB/s"
    )
    print(
        f"worst one-shot time per MB: {worst_one_shot[0]:.3f} s "
        f"(input {worst_one_shot[3]}, {worst_one_shot[2]:,} characters)"
    )
    print(
        f"worst stream time per MB (4-character chunks): {worst_stream[1]:.3f} s "
        f"(input {worst_stream[3]}, {worst_stream[2]:,} characters)"
    )
    if tally.exceptions or tally.disagreements:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
