"""Long evaluation runs: cases on several threads, a report written as they finish, and resuming.

    writer = ReportWriter(Path("bfcl.json"), "BFCL · my-model", settings)
    done = writer.resume(IDENTITY)          # {} unless an earlier run left results
    writer.start(done.values())
    report = harness.run(cases, workers=4, done=done, on_result=writer.add)
    report = writer.finish(report.results)

While a run goes, every finished case is appended as one JSON line to a *journal* beside the
report (``bfcl.json.partial.jsonl``; its first line holds the run's settings), and the report
itself is rewritten, complete so far, every few seconds. A run that is killed loses at most the
cases that were in flight. ``resume`` reads the journal (or, when the run had finished, the
report) and returns the results that can be kept: those of a run with the same identity
(model, mode, grammar, tool choice, bfcl-eval version) whose case did not end in a harness or
model error (an endpoint that was down is asked again).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, Protocol, TypeVar

from rich.console import Console

from hermes_agent.errors import HermesAgentError
from hermes_agent.evals.report import CaseResult, Report, progress_bar

JOURNAL_SUFFIX = ".partial.jsonl"
CHECKPOINT_SECONDS = 10.0
"""How often the report is rewritten while a run goes (the journal gets every case at once)."""
HARNESS_ERROR = "harness error"

_FIELDS = {field.name for field in fields(CaseResult)}


class _HasId(Protocol):
    @property
    def id(self) -> str: ...


C = TypeVar("C", bound=_HasId)


def case_from_dict(data: Mapping[str, Any]) -> CaseResult:
    """A ``CaseResult`` back from its JSON form (unknown keys ignored)."""
    return CaseResult(**{key: value for key, value in data.items() if key in _FIELDS})


def journal_path(report: Path) -> Path:
    """Where the journal of the report at ``report`` goes."""
    return report.with_name(report.name + JOURNAL_SUFFIX)


def retryable(result: CaseResult) -> bool:
    """A case that says nothing about the model: the harness broke, or the model could not be
    reached. A resumed run asks again."""
    return result.model_error is not None or (result.error or "").startswith(HARNESS_ERROR)


class ReportWriter:
    """Writes one run's report as it goes: the journal per case, the report every few seconds,
    the final report at the end (and the journal is then removed)."""

    def __init__(
        self,
        path: Path,
        title: str,
        settings: Mapping[str, Any],
        *,
        interval: float = CHECKPOINT_SECONDS,
    ) -> None:
        self.path = path
        self.journal = journal_path(path)
        self.title = title
        self.settings = dict(settings)
        self.interval = interval
        self._results: list[CaseResult] = []
        self._lock = threading.Lock()
        self._handle: Any = None
        self._written = 0.0

    def resume(self, identity: Sequence[str]) -> dict[str, CaseResult]:
        """The results an earlier run with this report path left, by case id.

        Raises ``HermesAgentError`` when that run's ``identity`` settings differ from this
        one's (its results would not measure the same thing).
        """
        previous = self._previous()
        if previous is None:
            return {}
        settings, results = previous
        differ = [key for key in identity if settings.get(key) != self.settings.get(key)]
        if differ:
            shown = ", ".join(
                f"{key}: {settings.get(key)!r} then, {self.settings.get(key)!r} now"
                for key in differ
            )
            raise HermesAgentError(
                f"cannot resume {self.path}: it was made with other settings ({shown}); "
                "choose another --report, or run without --resume to start over"
            )
        return {result.id: result for result in results if not retryable(result)}

    def _previous(self) -> tuple[dict[str, Any], list[CaseResult]] | None:
        if self.journal.is_file():
            lines = self.journal.read_text(encoding="utf-8").splitlines()
            records = []
            for line in lines:
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # the line a killed run was writing
            if records and "settings" in records[0]:
                return records[0]["settings"], [case_from_dict(r) for r in records[1:]]
        if self.path.is_file():
            try:
                data = json.loads(self.path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as exc:
                raise HermesAgentError(
                    f"cannot resume {self.path}: not a JSON report ({exc})"
                ) from exc
            return data.get("settings", {}), [case_from_dict(c) for c in data.get("cases", [])]
        return None

    def start(self, carried: Iterable[CaseResult] = ()) -> None:
        """Begin a fresh journal: the settings, then the results carried over from before."""
        self.journal.parent.mkdir(parents=True, exist_ok=True)
        self._handle = self.journal.open("w", encoding="utf-8")
        self._line({"settings": self.settings})
        for result in carried:
            self._results.append(result)
            self._line(result.to_dict())
        self._handle.flush()
        self._written = time.monotonic()

    def _line(self, data: Mapping[str, Any]) -> None:
        self._handle.write(json.dumps(data, ensure_ascii=False, default=str) + "\n")

    def add(self, result: CaseResult) -> None:
        """Record one finished case (thread-safe); rewrite the report when it is time."""
        with self._lock:
            self._results.append(result)
            if self._handle is not None:
                self._line(result.to_dict())
                self._handle.flush()
            if time.monotonic() - self._written >= self.interval:
                self._write(list(self._results), complete=False)

    def _write(self, results: list[CaseResult], *, complete: bool) -> Report:
        settings = {**self.settings, "complete": complete}
        report = Report(title=self.title, results=results, settings=settings)
        temporary = self.path.with_name(self.path.name + ".tmp")
        report.write_json(temporary)
        os.replace(temporary, self.path)
        self._written = time.monotonic()
        return report

    def checkpoint(self) -> Report:
        """Write the report as it stands (an interrupted run: ``complete`` is false)."""
        with self._lock:
            return self._write(list(self._results), complete=False)

    def finish(self, results: list[CaseResult]) -> Report:
        """Write the final report (``results`` in case order) and remove the journal."""
        with self._lock:
            report = self._write(results, complete=True)
            self.close()
            self.journal.unlink(missing_ok=True)
            return report

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def run_cases(
    cases: Sequence[C],
    arun_one: Callable[[C], Awaitable[CaseResult]],
    loop: asyncio.AbstractEventLoop,
    *,
    workers: int = 1,
    done: Mapping[str, CaseResult] | None = None,
    on_result: Callable[[CaseResult], None] | None = None,
    console: Console | None = None,
    description: str = "cases",
) -> list[CaseResult]:
    """Run the cases not in ``done``, ``workers`` at a time on ``loop``; return every result
    in case order.

    ``on_result`` sees each new result as it finishes. Ctrl-C stops the run: the cases in
    flight are cancelled (a resumed run does them again), and the interrupt goes on to the
    caller.
    """
    done = dict(done or {})
    todo = [case for case in cases if case.id not in done]
    results: dict[str, CaseResult] = dict(done)
    with _progress(console, len(cases), description) as advance:
        for _ in done:
            advance()
        main = loop.create_task(_run_all(todo, arun_one, workers, results, on_result, advance))
        try:
            loop.run_until_complete(main)
        except BaseException:
            main.cancel()
            with contextlib.suppress(BaseException):
                loop.run_until_complete(main)
            raise
    return [results[case.id] for case in cases if case.id in results]


async def _run_all(
    todo: Sequence[C],
    arun_one: Callable[[C], Awaitable[CaseResult]],
    workers: int,
    results: dict[str, CaseResult],
    on_result: Callable[[CaseResult], None] | None,
    advance: Callable[[], None],
) -> None:
    queue = iter(todo)

    async def worker() -> None:
        for case in queue:  # shared: each case goes to the first free worker, in order
            result = await arun_one(case)
            results[result.id] = result
            if on_result is not None:
                on_result(result)
            advance()

    await asyncio.gather(*(worker() for _ in range(max(1, workers))))


class _Quiet:
    def __enter__(self) -> Callable[[], None]:
        return lambda: None

    def __exit__(self, *exc: object) -> None:
        return None


def _progress(console: Console | None, total: int, description: str) -> Any:
    if console is None:
        return _Quiet()
    return progress_bar(console, total, description)
