"""Tool call cost by execution mode: inline, in_process (thread pool), subprocess (pooled).

Each sample is one ``ToolExecutor`` call of a trivial tool through a full agent step with a
ScriptedModel; the figure is the median per-step time, and the subprocess overhead is its
difference from in_process (the same step with the worker-process round trip added).

    python benchmarks/bench_tool_modes.py
"""

from __future__ import annotations

import gc
import statistics
import time

# The scripted agent of the overhead benchmark (this folder is on sys.path when run as a script).
from bench_overhead import Script, echo

from hermes_agent import Agent, ScriptedModel, Tool

STEPS = 50


def per_step(mode: str, runs: int) -> float:
    script = Script()
    tool = Tool.from_function(echo, execution_mode=mode)
    agent = Agent(model=ScriptedModel(script), tools=[tool], max_iterations=STEPS + 1)
    script.remaining = STEPS
    agent.run("warm up")  # starts the thread pool / worker process
    samples = []
    for _ in range(runs):
        script.remaining = STEPS
        gc.collect()
        started = time.perf_counter()
        result = agent.run("go")
        samples.append((time.perf_counter() - started) / STEPS)
        assert result.status == 200 and len(result.tool_calls) == STEPS
    agent.close()
    return statistics.median(samples)


def main() -> None:
    medians = {mode: per_step(mode, 30) for mode in ("inline", "in_process", "subprocess")}
    print("| execution mode | median per step (one tool call) |")
    print("|---|---|")
    for mode, seconds in medians.items():
        print(f"| {mode} | {seconds * 1e6:.1f} µs |")
    extra = (medians["subprocess"] - medians["in_process"]) * 1e3
    print(f"\nSubprocess (pooled) overhead per call vs in_process: {extra:.3f} ms (target ≤ 5 ms)")


if __name__ == "__main__":
    main()
