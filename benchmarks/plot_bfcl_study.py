"""Bar chart of the embedded-model BFCL study: benchmarks/results/bfcl_study.json → PNG.

    python benchmarks/plot_bfcl_study.py           # writes docs/img/bfcl_study.png

One panel per rate (accuracy, malformed, invalid, no call), one group of bars per category, one
bar per condition: ``auto`` and ``required``, grammar on and off (``required`` only where the
study runs it). Needs matplotlib (the ``eval`` extra).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "bfcl_study.json"
OUTPUT = ROOT / "docs" / "img" / "bfcl_study.png"
PANELS = (
    ("accuracy", "accuracy (BFCL's checkers)"),
    ("malformed_rate", "malformed <tool_call> output"),
    ("invalid_rate", "calls refused by validation"),
    ("no_call_rate", "no call at all"),
)
CONDITIONS = (
    ("auto", True, "auto, grammar on", "#2b6cb0"),
    ("auto", False, "auto, grammar off", "#90cdf4"),
    ("required", True, "required, grammar on", "#c05621"),
    ("required", False, "required, grammar off", "#fbd38d"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args()
    study = json.loads(args.results.read_text(encoding="utf-8"))
    runs = {(r["category"], r["tool_choice"], r["grammar"]): r for r in study["runs"]}
    categories = list(dict.fromkeys(r["category"] for r in study["runs"]))
    figure, axes = plt.subplots(len(PANELS), 1, figsize=(15, 13), sharex=True)
    width = 0.2
    for axis, (key, title) in zip(axes, PANELS, strict=True):
        for index, (choice, grammar, label, colour) in enumerate(CONDITIONS):
            offset = (index - 1.5) * width
            present = [
                (position, runs[(category, choice, grammar)][key])
                for position, category in enumerate(categories)
                if (category, choice, grammar) in runs
            ]
            if not present:
                continue
            bars = axis.bar(
                [position + offset for position, _ in present],
                [100 * value for _, value in present],
                width,
                label=label,
                color=colour,
            )
            axis.bar_label(bars, fmt="%.0f", fontsize=6)
        axis.set_title(title, fontsize=10)
        axis.set_ylim(0, 112)
        axis.set_ylabel("% of cases")
    settings = study["settings"]
    labels = []
    for category in categories:
        cases = max(r["total"] for r in study["runs"] if r["category"] == category)
        few = cases < settings["limit_per_category"]
        labels.append(f"{category}\n({cases} case{'s' if cases > 1 else ''})" if few else category)
    axes[-1].set_xticks(range(len(categories)), labels, rotation=30, ha="right", fontsize=8)
    handles, names = axes[0].get_legend_handles_labels()
    figure.legend(handles, names, fontsize=9, ncol=4, loc="lower center")
    scope = f"first {settings['limit_per_category']} cases per category"
    multi = settings.get("limit_per_multi_turn_category")
    if multi is not None and multi != settings["limit_per_category"]:
        scope += f", {multi} per multi-turn category"
    figure.suptitle(
        f"SmolLM2-135M on BFCL through Hermes Agent ({scope}; call_bias {settings['call_bias']})",
        fontsize=11,
    )
    figure.tight_layout(rect=(0, 0.03, 1, 1))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.output, dpi=110)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
