"""Embedded model throughput: what LlamaCpp and its tool-call grammar cost over llama.cpp itself.

    python benchmarks/bench_embedded.py [--repeats 7] [--max-tokens 128] [--threads N]

Prints a markdown table. All variants run the same rendered prompt (the Hermes tools prompt with
a calculator tool and ``tool_choice="required"``) on the same loaded ``Llama`` object, greedy,
with the same ``max_tokens``; the rounds interleave the variants so that noise from other work
on the machine falls on all of them alike, and medians are reported.

- (a) ``llama_cpp.Llama.create_completion`` called directly, no grammar;
- (b) ``LlamaCpp.complete`` with ``use_grammar=False`` (rendering, worker thread, parsing);
- (c) ``LlamaCpp.complete`` with the grammar (the default);
- (d) for reference, llama-cpp-python's own grammar path: ``create_completion(grammar=
  LlamaGrammar)``, which checks every vocabulary entry at every step.

Runs under the grammar write different text (tool calls, not prose) of a different length, so
the grammar's cost is compared as time per generated token. The prompt is in the KV cache after
the first call, so the numbers are about generation, not prompt evaluation. CPU time (of the
whole process) is shown beside wall-clock time because it is steadier on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from hermes_agent.models.base import ModelSettings
from hermes_agent.models.llamacpp import STOP, LlamaCpp
from hermes_agent.protocol.prompts import openai_tool
from hermes_agent.types import Message

CALCULATOR = openai_tool(
    "calculator",
    "Evaluate an arithmetic expression.",
    {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "e.g. 2 + 2"}},
        "required": ["expression"],
        "additionalProperties": False,
    },
)
# Asks for a long answer, so that runs without the grammar write prose up to max_tokens.
MESSAGES = [
    Message(
        role="user",
        content="Write a long story about a robot who learns to cook, then compute 17 * 23.",
    )
]


async def main(repeats: int, max_tokens: int, threads: int | None) -> None:
    import llama_cpp

    plain = LlamaCpp(use_grammar=False, max_tokens=max_tokens, n_threads=threads)
    guided = LlamaCpp(max_tokens=max_tokens, n_threads=threads)
    settings = ModelSettings(tool_choice="required")
    tools = [CALCULATOR]
    prompt = plain.render_prompt(MESSAGES, tools, settings)
    grammar_text = guided.grammar(tools, settings)
    assert grammar_text is not None
    llm = plain.llama
    assert guided.llama is llm

    async def direct(grammar: Any = None) -> int:  # on the loop's thread, as a script would
        response = llm.create_completion(
            prompt,
            max_tokens=max_tokens,
            temperature=0.0,
            top_k=40,
            stop=STOP,
            seed=0,
            grammar=grammar,
        )
        return int(response["usage"]["completion_tokens"])

    async def through(model: LlamaCpp) -> int:
        response = await model.complete(MESSAGES, tools, settings)
        return response.usage.completion_tokens

    variants: dict[str, Callable[[], Awaitable[int]]] = {
        "(a) llama-cpp-python create_completion, no grammar": direct,
        "(b) LlamaCpp.complete, no grammar": lambda: through(plain),
        "(c) LlamaCpp.complete, grammar (tool_choice=required)": lambda: through(guided),
        "(d) create_completion(grammar=LlamaGrammar), for reference": lambda: direct(
            llama_cpp.LlamaGrammar.from_string(grammar_text, verbose=False)
        ),
    }
    for run in variants.values():  # warm up: load, prompt into the KV cache, grammar compiled
        await run()
    results: dict[str, list[tuple[int, float, float]]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, run in variants.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            tokens = await run()
            wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
            results[name].append((tokens, wall, cpu))

    rows = {}
    for name, samples in results.items():
        tokens = statistics.median(t for t, _, _ in samples)
        seconds = statistics.median(w for _, w, _ in samples)
        per_token = statistics.median(w / t for t, w, _ in samples)
        cpu_per_token = statistics.median(c / t for t, _, c in samples)
        rows[name] = (tokens, seconds, 1 / per_token, per_token * 1000, cpu_per_token * 1000)

    a, b, c, d = (rows[name] for name in variants)
    print(
        f"Embedded model: {plain.name}, llama-cpp-python {llama_cpp.__version__}, "
        f"{plain.n_threads} thread(s) of {os.cpu_count()} CPUs ({platform.machine()}), "
        f"max_tokens={max_tokens}, temperature=0, {repeats} rounds, medians.\n"
    )
    print("| variant | tokens | seconds | tokens/s | ms/token | CPU ms/token |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (tokens, seconds, rate, ms, cpu_ms) in rows.items():
        print(f"| {name} | {tokens:.0f} | {seconds:.3f} | {rate:.1f} | {ms:.2f} | {cpu_ms:.2f} |")
    print()
    print("| ratio | wall clock | CPU time | target |")
    print("|---|---:|---:|---:|")
    print(f"| (b)/(a) tokens/s | {b[2] / a[2]:.3f} | {a[4] / b[4]:.3f} | >= 0.95 |")
    print(f"| (c)/(b) time per token | {c[3] / b[3]:.3f} | {c[4] / b[4]:.3f} | <= 1.3 |")
    print(f"| (d)/(b) time per token | {d[3] / b[3]:.3f} | {d[4] / b[4]:.3f} | (reference) |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    asyncio.run(main(args.repeats, args.max_tokens, args.threads))
