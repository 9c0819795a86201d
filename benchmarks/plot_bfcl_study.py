"""Bar chart of the embedded-model BFCL study: benchmarks/results/bfcl_study.json → PNG.

    python benchmarks/plot_bfcl_study.py           # writes docs/img/bfcl_study.png

Needs matplotlib (pip install matplotlib); nothing else in the project does.
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
    ("accuracy", "accuracy (BFCL checker)"),
    ("malformed_rate", "malformed <tool_call> output"),
    ("invalid_rate", "calls refused by validation"),
    ("no_call_rate", "answered without a call"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args()
    study = json.loads(args.results.read_text(encoding="utf-8"))
    runs = study["runs"]
    groups = list(dict.fromkeys(f"{r['category']}\n{r['tool_choice']}" for r in runs))
    figure, grid = plt.subplots(2, 2, figsize=(11, 7.5), sharey=True)
    axes = list(grid.flat)
    width = 0.38
    for axis, (key, title) in zip(axes, PANELS, strict=True):
        for offset, grammar, colour in (
            (-width / 2, True, "#2b6cb0"),
            (width / 2, False, "#dd6b20"),
        ):
            values = []
            for group in groups:
                match = [
                    r
                    for r in runs
                    if f"{r['category']}\n{r['tool_choice']}" == group and r["grammar"] is grammar
                ]
                values.append(100 * match[0][key] if match else 0.0)
            positions = [i + offset for i in range(len(groups))]
            label = "grammar on" if grammar else "grammar off"
            bars = axis.bar(positions, values, width, label=label, color=colour)
            axis.bar_label(bars, fmt="%.0f", fontsize=7)
        axis.set_title(title, fontsize=10)
        axis.set_xticks(range(len(groups)), groups, fontsize=8)
        axis.set_ylim(0, 110)
    axes[0].set_ylabel("% of cases")
    axes[2].set_ylabel("% of cases")
    axes[0].legend(fontsize=8, loc="upper left")
    limit = study["settings"].get("limit_per_category")
    scope = f"first {limit} cases per category" if limit else "full categories"
    figure.suptitle(f"SmolLM2-135M on BFCL through Hermes Agent ({scope})", fontsize=11)
    figure.tight_layout()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.output, dpi=120)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
