"""The oracle on every BFCL category: does the pipeline lose anything?

    python benchmarks/bfcl_oracle.py          # writes benchmarks/results/bfcl_oracle.json
    python benchmarks/bfcl_oracle.py --table  # the markdown tables for docs/evaluation.md

The oracle answers every case with BFCL's ground truth (``hermes_agent.evals.oracle``). A miss
is either our bug or one of the known data conflicts (``DATA_CONFLICTS``); the run fails (exit
1) when the misses are anything but exactly those.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from hermes_agent.evals import bfcl_compat
from hermes_agent.evals.bfcl import CATEGORIES, BfclHarness, load_cases, oracle_model_for
from hermes_agent.evals.oracle import DATA_CONFLICTS

RESULTS = Path(__file__).parent / "results" / "bfcl_oracle.json"


def run(workers: int) -> dict[str, object]:
    cases = [case for name in CATEGORIES for case in load_cases(name)]
    started = time.perf_counter()
    report = BfclHarness(oracle_model_for).run(cases, workers=workers)
    seconds = time.perf_counter() - started
    return {
        "bfcl_eval": bfcl_compat.installed_version(),
        "workers": workers,
        "seconds": round(seconds, 1),
        "categories": [summary.to_dict() for summary in report.categories()],
        "misses": [
            {"id": r.id, "category": r.category, "error": r.error} for r in report.failures()
        ],
    }


def table(data: dict[str, object]) -> str:
    misses = data["misses"]
    assert isinstance(misses, list)
    conflicts_by_category: dict[str, int] = {}
    for miss in misses:
        conflicts_by_category[miss["category"]] = conflicts_by_category.get(miss["category"], 0) + 1
    lines = [
        "| category | cases | correct | accuracy | data conflicts | accuracy without them |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    total = correct = 0
    categories = data["categories"]
    assert isinstance(categories, list)
    for summary in categories:
        conflicts = conflicts_by_category.get(summary["category"], 0)
        clean = summary["correct"] / (summary["total"] - conflicts)
        total += summary["total"]
        correct += summary["correct"]
        lines.append(
            f"| {summary['category']} | {summary['total']} | {summary['correct']} | "
            f"{summary['accuracy']:.1%} | {conflicts} | {clean:.0%} |"
        )
    lines.append(
        f"| **total** | **{total}** | **{correct}** | **{correct / total:.1%}** | "
        f"**{len(misses)}** | **{correct / (total - len(misses)):.0%}** |"
    )
    lines += ["", "| id | why no answer passes |", "|---|---|"]
    lines += [
        f"| {miss['id']} | {DATA_CONFLICTS.get(miss['id'], '**not a known conflict**')} |"
        for miss in misses
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", action="store_true", help="print the tables of the last run")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(RESULTS.read_text(encoding="utf-8"))))
        return 0
    data = run(args.workers)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    missed = {miss["id"] for miss in data["misses"]}  # type: ignore[attr-defined]
    print(table(data))
    unexpected = sorted(missed - set(DATA_CONFLICTS))
    passed_anyway = sorted(set(DATA_CONFLICTS) - missed)
    if unexpected or passed_anyway:
        print(f"unexpected misses: {unexpected}; known conflicts that passed: {passed_anyway}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
