"""Two or more JSON reports side by side: a table, and a chart image.

    hermes-agent eval --compare native.json hermes.json --chart compare.png

For every category any report has, each report's accuracy, malformed rate, invalid rate and
no-call rate (the ``summary.categories`` of a report written by ``hermes-agent eval``), plus a
total row. The chart needs matplotlib (``pip install "hermes-agent-core[eval]"``); without it the
table is still printed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from hermes_agent.errors import HermesAgentError, MissingDependencyError

METRICS = (
    ("accuracy", "accuracy"),
    ("malformed_rate", "malformed"),
    ("invalid_rate", "invalid"),
    ("no_call_rate", "no call"),
)
"""(key in a category summary, label) for each metric compared."""
TOTAL = "total"


@dataclass
class ComparedReport:
    """One report as compared: its label, and per category the four rates and the case count."""

    label: str
    path: Path
    categories: dict[str, dict[str, float]] = field(default_factory=dict)

    def rate(self, category: str, metric: str) -> float | None:
        values = self.categories.get(category)
        return None if values is None else values[metric]


def load_report(path: Path, label: str | None = None) -> ComparedReport:
    """Read the summary of a report written by ``hermes-agent eval`` (a suite or BFCL)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        summaries = data["summary"]["categories"]
    except FileNotFoundError as exc:
        raise HermesAgentError(f"no report at {path}") from exc
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise HermesAgentError(
            f"{path} is not a report written by `hermes-agent eval` ({type(exc).__name__}: {exc})"
        ) from exc
    compared = ComparedReport(label or _label(data, path), path)
    totals = {"total": 0.0, "correct": 0.0, "malformed": 0.0, "invalid": 0.0, "no_call": 0.0}
    for summary in summaries:
        compared.categories[summary["category"]] = {
            "total": float(summary["total"]),
            **{key: float(summary.get(key, 0.0)) for key, _ in METRICS},
        }
        for key in totals:
            totals[key] += float(summary.get(key, 0))
    if totals["total"]:
        count = totals["total"]
        compared.categories[TOTAL] = {
            "total": count,
            "accuracy": totals["correct"] / count,
            "malformed_rate": totals["malformed"] / count,
            "invalid_rate": totals["invalid"] / count,
            "no_call_rate": totals["no_call"] / count,
        }
    return compared


def _label(data: dict[str, Any], path: Path) -> str:
    settings = data.get("settings") or {}
    model = settings.get("model")
    mode = settings.get("mode")
    if model and mode:
        return f"{model} ({mode})"
    return str(model or data.get("title") or path.stem)


def load_reports(paths: Sequence[Path]) -> list[ComparedReport]:
    """The reports to compare (two or more); labels made unique with the file name."""
    if len(paths) < 2:
        raise HermesAgentError("--compare needs two or more reports")
    reports = [load_report(path) for path in paths]
    labels = [report.label for report in reports]
    for report in reports:
        if labels.count(report.label) > 1:
            report.label = f"{report.label} · {report.path.name}"
    return reports


def categories(reports: Sequence[ComparedReport]) -> list[str]:
    """Every category any report has, in the order they first appear, the total last."""
    names: list[str] = []
    for report in reports:
        names.extend(name for name in report.categories if name not in names and name != TOTAL)
    return [*names, TOTAL]


def compare_table(reports: Sequence[ComparedReport]) -> Table:
    """One row per category; for each metric, one column per report (A, B, ...: see the
    caption)."""
    letters = [chr(ord("A") + index) for index in range(len(reports))]
    legend = "   ".join(f"{letter}: {r.label}" for letter, r in zip(letters, reports, strict=True))
    table = Table(title="comparison", caption=legend)
    table.add_column("category", style="bold")
    table.add_column("cases", justify="right")
    for _, label in METRICS:
        for letter in letters:
            table.add_column(f"{label} {letter}", justify="right")
    for name in categories(reports):
        counts = {int(r.categories[name]["total"]) for r in reports if name in r.categories}
        cells = [name, "/".join(str(count) for count in sorted(counts))]
        for metric, _ in METRICS:
            for report in reports:
                value = report.rate(name, metric)
                cells.append("–" if value is None else f"{value:.1%}")
        table.add_row(*cells, style="bold" if name == TOTAL else None)
    return table


def write_chart(reports: Sequence[ComparedReport], path: Path) -> Path:
    """A PNG: one panel per metric, a group of bars per category, one colour per report.

    Raises ``MissingDependencyError`` when matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display needed
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingDependencyError(
            'the comparison chart needs matplotlib: pip install "hermes-agent-core[eval]"'
        ) from exc
    names = categories(reports)
    height = 0.8 / len(reports)
    tall = 0.45 * len(names) * max(1.0, len(reports) / 2) + 1.5
    figure, axes = plt.subplots(1, len(METRICS), figsize=(4 * len(METRICS), tall), sharey=True)
    for axis, (metric, label) in zip(axes, METRICS, strict=True):
        for index, report in enumerate(reports):
            positions = [row + index * height for row in range(len(names))]
            values = [100 * (report.rate(name, metric) or 0.0) for name in names]
            axis.barh(positions, values, height=height, label=report.label)
        axis.set_title(f"{label} (%)")
        axis.set_xlim(0, 100)
        axis.grid(axis="x", alpha=0.3)
    axes[0].set_yticks([row + height * (len(reports) - 1) / 2 for row in range(len(names))])
    axes[0].set_yticklabels(names)
    axes[0].invert_yaxis()
    figure.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=len(reports))
    figure.tight_layout(rect=(0, 0.06, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
