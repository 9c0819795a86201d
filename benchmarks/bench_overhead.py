"""Framework overhead per agent step: ScriptedModel + a trivial sync tool, N=10 and N=200 steps.

Each run makes N tool-calling steps and one final answer; the per-step cost is the run's wall
time divided by N. The model does no work, so what is measured is the runtime itself: parsing,
selection, validation, thread-pool dispatch, result rendering and bookkeeping.

    python benchmarks/bench_overhead.py            # prints a markdown table
    python benchmarks/bench_overhead.py --runs 50
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

from hermes_agent import Agent, ScriptedModel, Tool

CALL = '<tool_call>\n{"name": "echo", "arguments": {"value": 1}}\n</tool_call>'


def echo(value: int) -> int:
    """Return the value."""
    return value


class Script:
    """Answers ``steps`` tool calls, then a final text; ``reset`` before each run."""

    def __init__(self) -> None:
        self.remaining = 0

    def __call__(self, messages: object, tools: object) -> str:
        self.remaining -= 1
        return CALL if self.remaining >= 0 else "done"


def time_runs(steps: int, runs: int, mode: str = "in_process") -> list[float]:
    """Seconds per step for each of ``runs`` runs of ``steps`` tool-calling steps.

    One agent serves every run, as in an application; each run starts a fresh session so the
    history does not grow from run to run.
    """
    script = Script()
    tool = Tool.from_function(echo, execution_mode=mode)
    agent = Agent(model=ScriptedModel(script), tools=[tool], max_iterations=steps + 1)
    samples = []
    for _ in range(runs):
        script.remaining = steps
        gc.collect()
        started = time.perf_counter()
        result = agent.run("go")
        elapsed = time.perf_counter() - started
        assert result.status == 200 and len(result.tool_calls) == steps, result.output
        samples.append(elapsed / steps)
    agent.close()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=30, help="runs per size (median taken)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of markdown")
    options = parser.parse_args()
    time_runs(10, 5)  # warm up imports and the event loop
    results: dict[str, dict[int, float]] = {}
    for mode in ("in_process", "inline"):
        medians = results[mode] = {}
        for steps in (10, 200):
            runs = options.runs if steps == 10 else max(5, options.runs // 4)
            medians[steps] = statistics.median(time_runs(steps, runs, mode))
    if options.json:
        print(json.dumps({m: {k: v * 1e6 for k, v in r.items()} for m, r in results.items()}))
        return
    print("| sync tool mode | N=10 per step | N=200 per step | N=200 / N=10 |")
    print("|---|---|---|---|")
    for mode, medians in results.items():
        ratio = medians[200] / medians[10]
        print(
            f"| {mode} | {medians[10] * 1e6:.1f} µs | {medians[200] * 1e6:.1f} µs | {ratio:.2f} |"
        )
    print("\nTargets: ≤ 120 µs per step at N=10; N=200 / N=10 ≤ 1.5.")


if __name__ == "__main__":
    main()
