"""What OpenTelemetry tracing costs per agent step: the same runs with tracing off and on.

A ``ScriptedModel`` (no model work) and a trivial ``inline`` tool, so that what is measured is
the runtime and the tracer, not a thread hop; each run makes N tool-calling steps and one final
answer, per-step cost = run time / N. Variants, run interleaved round by round in one process
(so that a noisy neighbour slows them all alike):

- ``off``: not instrumented (the default);
- ``noop``: instrumented, with OpenTelemetry's no-op provider (the API alone, nothing recorded);
- ``on``: instrumented, SDK provider, a ``BatchSpanProcessor`` and an exporter that drops the
  spans (export happens on the processor's thread, as in production);
- ``on-sync``: the same with a ``SimpleSpanProcessor`` (each span handed to the exporter as it
  ends, on the run's thread: no second thread competing for the GIL);
- ``on+content``: ``on`` with ``capture_content=True`` (messages and arguments serialised and
  masked on every step).

    python benchmarks/bench_tracing.py                     # prints a markdown table
    python benchmarks/bench_tracing.py --rounds 60 --out benchmarks/results/tracing.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace import NoOpTracerProvider

from hermes_agent import Agent, ScriptedModel, Tool
from hermes_agent.tracing import SEMCONV_VERSION, instrument

CALL = '<tool_call>\n{"name": "echo", "arguments": {"value": 1}}\n</tool_call>'
VARIANTS = ("off", "noop", "on", "on-sync", "on+content")


def echo(value: int) -> int:
    """Return the value."""
    return value


class Script:
    """Answers ``remaining`` tool calls, then a final text."""

    def __init__(self) -> None:
        self.remaining = 0

    def __call__(self, messages: object, tools: object) -> str:
        self.remaining -= 1
        return CALL if self.remaining >= 0 else "done"


class Dropped(SpanExporter):
    """Counts the spans it is given and keeps none of them."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


def build(variant: str, steps: int, exporter: Dropped) -> tuple[Agent, Script, Any]:
    script = Script()
    tool = Tool.from_function(echo, execution_mode="inline")
    agent = Agent(model=ScriptedModel(script), tools=[tool], max_iterations=steps + 1)
    provider: Any = None
    if variant == "noop":
        instrument(agent, tracer_provider=NoOpTracerProvider())
    elif variant.startswith("on"):
        provider = TracerProvider()
        if variant == "on-sync":
            provider.add_span_processor(SimpleSpanProcessor(exporter))
        else:
            provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=65536))
        instrument(agent, tracer_provider=provider, capture_content=variant == "on+content")
    return agent, script, provider


def one_run(agent: Agent, script: Script, steps: int) -> float:
    script.remaining = steps
    started = time.perf_counter()
    result = agent.run("go")
    elapsed = time.perf_counter() - started
    assert result.status == 200 and len(result.tool_calls) == steps, result.output
    return elapsed / steps


def measure(steps: int, rounds: int) -> tuple[dict[str, list[float]], int]:
    exporter = Dropped()
    built = {v: build(v, steps, exporter) for v in VARIANTS}
    for agent, script, _ in built.values():  # warm up
        for _ in range(3):
            one_run(agent, script, steps)
    samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
    order = list(VARIANTS)
    for _ in range(rounds):
        random.shuffle(order)
        for variant in order:
            agent, script, _ = built[variant]
            gc.collect()
            samples[variant].append(one_run(agent, script, steps))
    for agent, _, provider in built.values():
        agent.close()
        if provider is not None:
            provider.shutdown()  # flushes: every span reached the exporter
    return samples, exporter.spans


def sdk_span_cost(rounds: int) -> float:
    """Microseconds the SDK takes to start, make current, and end one span with four
    attributes (a ``BatchSpanProcessor`` and the dropping exporter): the floor under ``on``."""
    from opentelemetry import context, trace

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropped(), max_queue_size=65536))
    tracer = provider.get_tracer("bench")
    attributes = {"a.b": "chat", "a.c": "scripted", "a.d": "scripted", "a.e": "x" * 32}

    def one() -> None:
        span = tracer.start_span("span", attributes=attributes)
        token = context.attach(trace.set_span_in_context(span))
        context.detach(token)
        span.end()

    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(1000):
            one()
        samples.append((time.perf_counter() - started) / 1000 * 1e6)
    provider.shutdown()
    return statistics.median(samples)


def spans_per_run(steps: int) -> int:
    exporter = Dropped()
    agent, script, provider = build("on-sync", steps, exporter)
    one_run(agent, script, steps)
    agent.close()
    provider.shutdown()
    return exporter.spans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=10, help="tool-calling steps per run")
    parser.add_argument("--rounds", type=int, default=40, help="runs per variant (median taken)")
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    options = parser.parse_args()
    samples, exported = measure(options.steps, options.rounds)
    per_span = sdk_span_cost(max(5, options.rounds // 4))
    per_step_spans = spans_per_run(options.steps) / options.steps
    medians = {v: statistics.median(s) * 1e6 for v, s in samples.items()}
    off = medians["off"]
    rows = []
    print(f"| variant | per step (median of {options.rounds}) | added per step | × off |")
    print("|---|---|---|---|")
    for variant in VARIANTS:
        added, ratio = medians[variant] - off, medians[variant] / off
        rows.append(
            {
                "variant": variant,
                "per_step_us": round(medians[variant], 1),
                "added_per_step_us": round(added, 1),
                "ratio_to_off": round(ratio, 3),
            }
        )
        print(f"| `{variant}` | {medians[variant]:.1f} µs | {added:+.1f} µs | {ratio:.2f} |")
    print(
        f"\n{per_step_spans:.1f} spans per step; the SDK alone takes {per_span:.1f} µs per span "
        f"(start, make current, end), {per_span * per_step_spans:.1f} µs per step. "
        f"{exported} spans exported (dropped) by the recording variants."
    )
    if options.out:
        report = {
            "benchmark": "tracing",
            "semconv": SEMCONV_VERSION,
            "steps_per_run": options.steps,
            "rounds": options.rounds,
            "tool_mode": "inline",
            "results": rows,
            "spans_per_step": round(per_step_spans, 2),
            "sdk_span_us": round(per_span, 1),
            "spans_exported": exported,
            "machine": f"{os.cpu_count()} CPUs (shared), {platform.python_implementation()} "
            f"{platform.python_version()}, {platform.machine()}",
            "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        options.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
