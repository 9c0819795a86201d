"""Benchmark: parse_completion (one shot) against StreamParser fed token-sized chunks.

Run: ``python benchmarks/bench_stream_parser.py [--chunk 4 16 ...] [--quick]``

Builds completions of about 1k, 10k and 100k characters (prose, a scratch pad and tool calls
whose arguments hold braces, quotes and tags), then times both ways of parsing them with
``time.perf_counter``, many repeats, and reports the median. Linear cost shows as a flat
"µs per 1k chars" column; the ratio column is the price of streaming.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

from hermes_agent.protocol.chatml import render_tool_call
from hermes_agent.protocol.parser import StreamParser, parse_completion
from hermes_agent.types import ToolCall

SIZES = (1_000, 10_000, 100_000)
WORDS = ["the", "weather", "in", "Tokyo", "東京", "is", "<", "30", "{so}", "we", "call", "now"]


def build_completion(size: int, seed: int = 0) -> str:
    """About ``size`` characters: a scratch pad, then prose and tool calls alternating."""
    rng = random.Random(seed)
    parts = ["<scratch_pad>\nGoal: answer.\nActions: search, then summarise.\n</scratch_pad>\n"]
    length = len(parts[0])
    n = 0
    while length < size:
        if rng.random() < 0.5:
            piece = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 40))) + "\n"
        else:
            n += 1
            arguments = {
                "query": " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 12))),
                "filters": {"lang": "ja", "tags": ["a", 'b"c', "</tool_call>"]},
                "limit": rng.randint(1, 100),
                "exact": rng.random() < 0.5,
            }
            piece = render_tool_call(ToolCall(name=f"search.v{n}", arguments=arguments)) + "\n"
        parts.append(piece)
        length += len(piece)
    return "".join(parts) + "<|im_end|>"


def chunked(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm up
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def stream(chunks: list[str]) -> None:
    parser = StreamParser()
    for chunk in chunks:
        parser.feed(chunk)
    parser.flush()
    parser.close()


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument(
        "--chunk", type=int, nargs="+", default=[4], help="characters per chunk (default 4)"
    )
    args.add_argument("--quick", action="store_true", help="fewer repeats")
    options = args.parse_args()
    for chunk_size in options.chunk:
        table(chunk_size, quick=options.quick)


def table(chunk_size: int, *, quick: bool) -> None:
    print(f"\nStreamParser fed {chunk_size}-character chunks; medians of many runs\n")
    print(
        "| size (chars) | calls | one-shot median | stream median | stream / one-shot "
        "| one-shot µs per 1k chars | stream µs per 1k chars |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for size in SIZES:
        text = build_completion(size)
        chunks = chunked(text, chunk_size)
        completion = parse_completion(text)
        if completion.content != _streamed_content(chunks) or completion.errors:
            raise SystemExit("streamed and one-shot results differ: fix the parser first")
        repeats = max(5, (2_000_000 // size) // (10 if quick else 1))
        one_shot = median_seconds(lambda text=text: parse_completion(text), repeats)
        streamed = median_seconds(lambda chunks=chunks: stream(chunks), repeats)
        per_k = 1_000 / len(text) * 1e6
        print(
            f"| {len(text):,} | {len(completion.tool_calls)} | {one_shot * 1e3:.3f} ms "
            f"| {streamed * 1e3:.3f} ms | {streamed / one_shot:.2f}× "
            f"| {one_shot * per_k:.1f} | {streamed * per_k:.1f} |"
        )


def _streamed_content(chunks: list[str]) -> str:
    parser = StreamParser()
    for chunk in chunks:
        parser.feed(chunk)
    return parser.close().content


if __name__ == "__main__":
    main()
