"""Calibrating when the embedded model calls a tool on its own (``LlamaCpp(call_bias=...)``).

    nohup python benchmarks/bfcl_call_bias.py measure &     # ~15 min on 2 cores
    python benchmarks/bfcl_call_bias.py curve               # the curve, the chart, the pick
    nohup python benchmarks/bfcl_call_bias.py before-after &  # auto on the first 20 (~10 min)
    python benchmarks/bfcl_call_bias.py toolsets            # 1, 2 and 3 demo tools (~3 min)

With ``tool_choice="auto"`` the model decides at the first token of its answer between opening a
call and writing text: it opens a call when ``margin + call_bias >= 0``, where ``margin`` is the
log-probability it gives the call opener minus that of its best first text token, less the same
for the conversation's system prompt and tools with a user message that asks for nothing (the
baseline), plus ``CALL_WEIGHT`` times the mean log-probability per token of the call it would
write. Each case is run once, and the decision for every bias follows from its margin:

- should-call side (``simple_python``, ``multiple``, ``live_simple``): the model is made to
  call (a huge bias), which gives the margin and whether BFCL's checker accepts the call; at
  bias ``b`` the case is right when ``margin + b >= 0`` and the call is right;
- no-call side (``irrelevance``, ``live_irrelevance``): made to call too, for the margin; at bias
  ``b`` the case is right when ``margin + b < 0``.

The cases are 20 onwards of each category, so the first 20 (the embedded study's, and the
before/after comparison) are not used to pick the bias. Results go to
``benchmarks/results/bfcl_call_bias.json``; the chart to ``docs/img/bfcl_call_bias.png``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from hermes_agent.evals.bfcl import BfclHarness, load_cases, shared_model
from hermes_agent.evals.report import CaseResult

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "bfcl_call_bias.json"
BEFORE_AFTER = ROOT / "benchmarks" / "results" / "bfcl_call_bias_before_after.json"
CHART = ROOT / "docs" / "img" / "bfcl_call_bias.png"
SHOULD_CALL = ("simple_python", "multiple", "live_simple")
NO_CALL = ("irrelevance", "live_irrelevance")
START = 20
FORCE = 1e9
GRID = [step / 4 for step in range(-60, 61)]  # -15 .. 15
QUICK_START = "What is 17 * 23?"
GREETING = "Hello! How are you today?"
TOOLSETS_RESULTS = ROOT / "benchmarks" / "results" / "bfcl_call_bias_toolsets.json"
# The toolsets study: questions each demo tool answers, and questions none does.
SHOULD_CALL_DEMO = {
    "calculator": [
        QUICK_START,
        "Compute 1234 + 5678.",
        "What is 2 to the power of 10?",
        "How much is 15% of 240?",
        "Calculate (45 - 12) / 3.",
        "What's 999 * 999?",
    ],
    "convert_units": [
        "Convert 5 km to miles.",
        "How many pounds is 70 kg?",
        "What is 100 F in Celsius?",
        "Convert 3 miles to kilometers.",
        "How many feet are in 10 meters?",
        "Convert 20 C to Fahrenheit.",
    ],
    "current_datetime": [
        "What time is it now?",
        "What is today's date?",
        "What day of the week is it today?",
        "Tell me the current date and time.",
        "What year is it right now?",
        "What is the time in UTC?",
    ],
}
NO_CALL_DEMO = [
    GREETING,
    "What is the capital of France?",
    "Tell me a joke.",
    "Who wrote Hamlet?",
    "Thanks, that's all.",
    "Write a haiku about the sea.",
    "What is your name?",
    "Why is the sky blue?",
]


def _cases(categories: tuple[str, ...], count: int) -> list[Any]:
    return [case for name in categories for case in load_cases(name, START + count)[START:]]


def measure(per_category: dict[str, int]) -> None:
    from hermes_agent.models.llamacpp import LlamaCpp

    rows: list[dict[str, Any]] = []
    for side, categories, bias, max_tokens in (
        ("should_call", SHOULD_CALL, FORCE, 256),
        ("no_call", NO_CALL, FORCE, 256),
    ):
        model = LlamaCpp(call_bias=bias, max_tokens=max_tokens)
        cases = _cases(categories, per_category[side])

        def record(result: CaseResult, side: str = side, model: Any = model) -> None:
            rows.append(
                {
                    "id": result.id,
                    "category": result.category,
                    "side": side,
                    "margin": model.last_call_margin,
                    "call_correct": result.correct if side == "should_call" else None,
                    "seconds": result.duration_s,
                }
            )
            print(json.dumps(rows[-1]), flush=True)

        BfclHarness(shared_model(model)).run(cases, on_result=record)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"start": START, "cases": rows}, indent=1) + "\n")


def curve(rows: list[dict[str, Any]]) -> list[dict[str, float]]:
    should = [r for r in rows if r["side"] == "should_call"]
    no_call = [r for r in rows if r["side"] == "no_call"]
    points = []
    for bias in GRID:
        calls = [r["margin"] + bias >= 0 for r in should]
        right = [c and r["call_correct"] for c, r in zip(calls, should, strict=True)]
        quiet = [r["margin"] + bias < 0 for r in no_call]
        call_rate = sum(calls) / len(should)
        should_acc = sum(right) / len(should)
        no_call_acc = sum(quiet) / len(no_call)
        points.append(
            {
                "bias": bias,
                "should_call_accuracy": should_acc,
                "should_call_call_rate": call_rate,
                "no_call_accuracy": no_call_acc,
                "balanced": (should_acc + no_call_acc) / 2,
                "decision": (call_rate + no_call_acc) / 2,
            }
        )
    return points


def plateau(points: list[dict[str, float]], per_side: int) -> list[float]:
    """The biases whose decision accuracy is within two cases per side of the best: with
    ``per_side`` cases a side, smaller differences are noise."""
    best = max(p["decision"] for p in points)
    return [p["bias"] for p in points if p["decision"] >= best - 2 / per_side - 1e-9]


def demo_margins(questions: list[str], tool_names: list[str]) -> dict[str, float]:
    """The margin of each question's first turn (a dry run), with these demo tools."""
    from hermes_agent import Agent
    from hermes_agent.demo_tools import demo_tools
    from hermes_agent.models.llamacpp import LlamaCpp

    model = LlamaCpp(call_bias=FORCE, max_tokens=256)  # the whole score: the call is decoded
    tools = [tool for tool in demo_tools() if tool.name in tool_names]
    agent = Agent(model=model, tools=tools)
    margins = {}
    for question in questions:
        agent.run(question, dry_run=True)
        assert model.last_call_margin is not None
        margins[question] = model.last_call_margin
    return margins


def quick_start_margins() -> dict[str, float]:
    """The margins of the quick start's question and of a greeting, with the calculator alone
    and with the three demo tools."""
    margins = {}
    for label, names in (("calculator", ["calculator"]), ("demo", list(SHOULD_CALL_DEMO))):
        for question, margin in demo_margins([QUICK_START, GREETING], names).items():
            margins[f"{label}: {question}"] = margin
    return margins


def pick(points: list[dict[str, float]], per_side: int, margins: dict[str, float]) -> float:
    """On the plateau of the decision curve, the bias nearest the middle between the quick
    start's lowest question margin and its highest greeting margin (the arithmetic question must
    call and the greeting must not, with one tool as with three)."""
    asks = min(margin for key, margin in margins.items() if key.endswith(QUICK_START))
    greets = max(margin for key, margin in margins.items() if key.endswith(GREETING))
    middle = -(asks + greets) / 2
    return min(plateau(points, per_side), key=lambda bias: abs(bias - middle))


def toolsets(bias: float) -> dict[str, Any]:
    """With 1, 2 and 3 demo tools, how often the first turn calls at ``bias``: for questions a
    registered tool answers (one tool: the one that answers; two: it and another; three: all),
    and for questions none answers (each one-tool and two-tool set, and all three)."""
    names = list(SHOULD_CALL_DEMO)
    rows: list[dict[str, Any]] = []
    for needed, questions in SHOULD_CALL_DEMO.items():
        other = next(name for name in names if name != needed)
        for count, tool_names in ((1, [needed]), (2, [needed, other]), (3, names)):
            for question, margin in demo_margins(questions, tool_names).items():
                rows.append(
                    {
                        "side": "should_call",
                        "tools": count,
                        "question": question,
                        "tool_names": tool_names,
                        "margin": margin,
                    }
                )
    no_call_sets = [(1, [name]) for name in names] + [(2, names[:2]), (2, names[1:]), (3, names)]
    for count, tool_names in no_call_sets:
        for question, margin in demo_margins(NO_CALL_DEMO, tool_names).items():
            rows.append(
                {
                    "side": "no_call",
                    "tools": count,
                    "question": question,
                    "tool_names": tool_names,
                    "margin": margin,
                }
            )
    rates = {}
    for side in ("should_call", "no_call"):
        for count in (1, 2, 3):
            chosen = [row for row in rows if row["side"] == side and row["tools"] == count]
            calls = sum(row["margin"] + bias >= 0 for row in chosen)
            rates[f"{side}, {count} tools"] = f"{calls}/{len(chosen)}"
    return {"call_bias": bias, "rates": rates, "cases": rows}


def chart(points: list[dict[str, float]], chosen: float, flat: tuple[float, float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    biases = [p["bias"] for p in points]
    figure, axis = plt.subplots(figsize=(8.5, 4.8))
    for key, label, style in (
        ("should_call_call_rate", "should call: called", "-"),
        ("should_call_accuracy", "should call: BFCL accuracy", "-"),
        ("no_call_accuracy", "irrelevance: did not call (= BFCL accuracy)", "-"),
        ("decision", "decision accuracy (mean of called / did not call)", "--"),
        ("balanced", "BFCL accuracy, mean of the two sides", ":"),
    ):
        axis.plot(biases, [100 * p[key] for p in points], style, label=label)
    axis.axvspan(*flat, color="grey", alpha=0.15, label="decision plateau (±2 cases a side)")
    axis.axvline(chosen, color="black", linestyle="--", linewidth=1, label=f"default {chosen:g}")
    axis.set_xlabel("call_bias (added to the call side of the decision, in nats)")
    axis.set_ylabel("% of cases")
    axis.set_xlim(-2, 15)
    axis.set_ylim(-2, 102)
    axis.grid(alpha=0.3)
    axis.legend(loc="center left", fontsize=7.5)
    axis.set_title("SmolLM2-135M, tool_choice=auto: when to call (BFCL, 48 cases a side)")
    figure.tight_layout()
    CHART.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(CHART, dpi=110)


def before_after(bias: float | None, label: str) -> None:
    """``tool_choice=auto`` on the first 20 cases of three categories at ``bias``, stored under
    ``label`` beside what other labels measured (run ``--label before`` on the older tree)."""
    from hermes_agent.models.llamacpp import LlamaCpp

    out: dict[str, Any] = json.loads(BEFORE_AFTER.read_text()) if BEFORE_AFTER.exists() else {}
    model = LlamaCpp(call_bias=bias)
    for name in ("simple_python", "live_simple", "multiple", "irrelevance"):
        started = time.perf_counter()
        report = BfclHarness(shared_model(model)).run(load_cases(name, 20))
        (summary,) = report.categories()
        out[f"{label}:{name}"] = {
            "call_bias": bias,
            **summary.to_dict(),
            "wall_s": round(time.perf_counter() - started, 1),
        }
        print(json.dumps(out[f"{label}:{name}"] | {"which": f"{label}:{name}"}), flush=True)
    BEFORE_AFTER.write_text(json.dumps(out, indent=1) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["measure", "curve", "before-after", "toolsets"])
    parser.add_argument("--should-call", type=int, default=16, help="cases per category")
    parser.add_argument("--no-call", type=int, default=24, help="cases per category")
    parser.add_argument("--bias", type=float, help="before-after, toolsets: the bias")
    parser.add_argument("--label", default="after", help="before-after: what to store it as")
    args = parser.parse_args()
    if args.step == "measure":
        measure({"should_call": args.should_call, "no_call": args.no_call})
        return 0
    if args.step in ("before-after", "toolsets"):
        from hermes_agent.models.llamacpp import DEFAULT_CALL_BIAS

        bias = DEFAULT_CALL_BIAS if args.bias is None else args.bias
        if args.step == "before-after":
            before_after(bias, args.label)
            return 0
        found = toolsets(bias)
        TOOLSETS_RESULTS.write_text(json.dumps(found, indent=1) + "\n")
        print(json.dumps(found["rates"]))
        return 0
    data = json.loads(RESULTS.read_text())
    points = curve(data["cases"])
    per_side = min(
        sum(r["side"] == side for r in data["cases"]) for side in ("should_call", "no_call")
    )
    margins = quick_start_margins()
    chosen = pick(points, per_side, margins)
    flat = plateau(points, per_side)
    chart(points, chosen, (flat[0], flat[-1]))
    data.update(curve=points, plateau=[flat[0], flat[-1]], quick_start_margins=margins)
    data["chosen"] = chosen
    RESULTS.write_text(json.dumps(data, indent=1) + "\n")
    at = next(p for p in points if p["bias"] == chosen)
    print(json.dumps({"chosen": chosen, "plateau": [flat[0], flat[-1]], **margins, **at}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
