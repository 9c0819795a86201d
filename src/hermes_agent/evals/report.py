"""Per-case results, the summary per category, the JSON report and the rich summary table.

Both the user-suite runner (``cases.py``) and the BFCL harness (``bfcl.py``) produce
``CaseResult`` objects; ``Report`` groups them by category and writes them out::

    report = Report(title="my suite", results=[...])
    report.write_json("out.json")
    print_summary(report, console)
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from hermes_agent.pipeline.status import REFUSED, Status
from hermes_agent.protocol.parser import parse_completion
from hermes_agent.types import RunResult

_INVALID = (Status.INVALID, Status.UNKNOWN_TOOL)
PARSE_ERROR_NAME = "invalid_tool_call"
"""The name the ToolSelector gives a ``<tool_call>`` block that could not be parsed."""

T = TypeVar("T")
R = TypeVar("R")


@dataclass(slots=True)
class CaseResult:
    """The outcome of one evaluation case.

    ``completions`` are the raw model turns, ``parsed_calls`` the calls the parser found in them
    (before validation), ``calls`` the calls the pipeline accepted (validated arguments),
    ``refused`` those it turned down (with the status and the error the model was shown), and
    ``verdict`` what the checker said. ``malformed`` means a ``<tool_call>`` block could not be
    parsed; ``invalid`` that a parsed call was refused (unknown tool or arguments failing the
    schema). ``error`` says why a case is not correct, in one line; ``model_error`` is set when
    a run ended because the model did not answer at all (an endpoint down, a timeout, an
    empty reply).
    """

    id: str
    category: str
    correct: bool
    completions: list[str] = field(default_factory=list)
    parsed_calls: list[dict[str, Any]] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    refused: list[dict[str, Any]] = field(default_factory=list)
    verdict: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    malformed: bool = False
    invalid: bool = False
    made_call: bool = False
    duration_s: float = 0.0
    model_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def record_run(result: CaseResult, run: RunResult) -> None:
    """Add what the model wrote in ``run`` and what the pipeline made of it to ``result``."""
    for step in run.steps:
        result.completions.append(step.completion_text)
        parsed = parse_completion(step.completion_text)
        result.parsed_calls.extend(
            {"name": call.name, "arguments": call.arguments} for call in parsed.tool_calls
        )
        result.malformed = result.malformed or bool(parsed.errors)
        for call in step.tool_calls:
            if call.status_code in REFUSED:  # never ran (a rate-limited call included)
                result.invalid = result.invalid or (
                    call.status_code in _INVALID and call.name != PARSE_ERROR_NAME
                )
                # The pipeline could not read a call its parser was given (for instance native
                # arguments that are not JSON, though the text they were rendered as reads).
                result.malformed = result.malformed or call.name == PARSE_ERROR_NAME
                result.refused.append(
                    {"name": call.name, "status": call.status_code, "error": call.error}
                )
            else:
                result.calls.append({"name": call.name, "arguments": call.arguments})
    result.made_call = bool(result.parsed_calls) or result.malformed
    # A 502 is also how a run ends when a required call never came: that one the model did
    # answer (in text), so it is a verdict on the model, not a failure to reach it.
    if run.status == Status.MODEL_ERROR and not (run.error or "").startswith("tool_choice"):
        result.model_error = run.error or "the model failed"


@dataclass(slots=True)
class CategorySummary:
    """Counts and rates for one category."""

    category: str
    total: int
    correct: int
    malformed: int
    invalid: int
    no_call: int
    seconds: float

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["accuracy"] = round(self.accuracy, 4)
        data["malformed_rate"] = round(self.malformed / self.total, 4) if self.total else 0.0
        data["invalid_rate"] = round(self.invalid / self.total, 4) if self.total else 0.0
        data["no_call_rate"] = round(self.no_call / self.total, 4) if self.total else 0.0
        return data


@dataclass
class Report:
    """All results of one evaluation run, plus what produced them (``settings``)."""

    title: str
    results: list[CaseResult] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    created: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    @property
    def total(self) -> int:
        return len(self.results)

    @property
    def correct(self) -> int:
        return sum(result.correct for result in self.results)

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0

    def categories(self) -> list[CategorySummary]:
        """One summary per category, in the order the categories first appear."""
        groups: dict[str, list[CaseResult]] = {}
        for result in self.results:
            groups.setdefault(result.category, []).append(result)
        return [
            CategorySummary(
                category=name,
                total=len(items),
                correct=sum(r.correct for r in items),
                malformed=sum(r.malformed for r in items),
                invalid=sum(r.invalid for r in items),
                no_call=sum(not r.made_call for r in items),
                seconds=round(sum(r.duration_s for r in items), 3),
            )
            for name, items in groups.items()
        ]

    def failures(self) -> list[CaseResult]:
        return [result for result in self.results if not result.correct]

    def to_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "created": self.created,
            "settings": self.settings,
            "summary": {
                "total": self.total,
                "correct": self.correct,
                "accuracy": round(self.accuracy, 4),
                "categories": [summary.to_dict() for summary in self.categories()],
            },
            "cases": [result.to_dict() for result in self.results],
        }

    def write_json(self, path: str | os.PathLike[str]) -> Path:
        """Write the report as JSON (UTF-8, indented); return the path."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.to_dict(), ensure_ascii=False, indent=1, default=str)
        target.write_text(text + "\n", encoding="utf-8")
        return target


def summary_table(report: Report) -> Table:
    """A rich table: one row per category and a total row."""
    table = Table(title=report.title)
    table.add_column("category", style="bold")
    table.add_column("cases", justify="right")
    table.add_column("correct", justify="right")
    table.add_column("accuracy", justify="right")
    table.add_column("malformed", justify="right")
    table.add_column("invalid", justify="right")
    table.add_column("no call", justify="right")
    table.add_column("seconds", justify="right")
    for summary in report.categories():
        colour = "green" if summary.correct == summary.total else "yellow"
        table.add_row(
            summary.category,
            str(summary.total),
            str(summary.correct),
            f"[{colour}]{summary.accuracy:.1%}[/{colour}]",
            str(summary.malformed),
            str(summary.invalid),
            str(summary.no_call),
            f"{summary.seconds:.1f}",
        )
    if len(report.categories()) > 1:
        table.add_row(
            "total", str(report.total), str(report.correct), f"{report.accuracy:.1%}", style="bold"
        )
    return table


def print_summary(report: Report, console: Console, *, max_failures: int = 20) -> None:
    """The summary table, then the first failures with their reasons."""
    console.print(summary_table(report))
    failures = report.failures()
    for result in failures[:max_failures]:
        console.print(
            f"[red]✗[/red] {result.id}: {result.error or 'incorrect'}", highlight=False, markup=True
        )
    if len(failures) > max_failures:
        console.print(f"... and {len(failures) - max_failures} more failures (see the report)")


@contextmanager
def progress_bar(console: Console, total: int, description: str) -> Iterator[Callable[[], None]]:
    """A rich progress bar; the context yields a function that advances it by one."""
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(description, total=total)
        yield lambda: progress.advance(task)


def run_with_progress(
    items: Sequence[T],
    run_one: Callable[[T], R],
    console: Console,
    description: str,
    *,
    show: bool = True,
) -> Iterable[R]:
    """Run ``run_one`` over ``items`` with a progress bar (``show=False``: without one)."""
    if not show:
        return [run_one(item) for item in items]
    results: list[R] = []
    with progress_bar(console, len(items), description) as advance:
        for item in items:
            results.append(run_one(item))
            advance()
    return results
