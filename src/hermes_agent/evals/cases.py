"""Tool-calling regression suites: questions and the calls you expect, in a YAML file.

    name: weather assistant
    tools: [eval_tools.py]          # Python files with @tool functions, relative to this file
    cases:
      - id: paris
        question: What's the weather in Paris?
        expect:
          - name: get_weather
            arguments:
              city: [Paris, "Paris, France"]   # a list: any of these values
              unit: ["", celsius]              # "" among them: the argument may be left out
      - id: small-talk
        question: Hello!
        expect: none                           # no call expected

Each case runs through the agent (prompt → model → parse → validate; ``execute: true`` also
runs the tools and the model's answer), and passes when the calls the pipeline accepted match the
expected ones: same number, each expected call matched by one actual call in any order, same
name, every argument among its acceptable values (strings compared ignoring case and surrounding
space, numbers by value), no argument that the case does not list.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from rich.console import Console

from hermes_agent.agent import Agent
from hermes_agent.config import HermesConfig, load_config
from hermes_agent.errors import ConfigError
from hermes_agent.evals.report import CaseResult, Report, record_run, run_with_progress
from hermes_agent.loading import load_tools_file
from hermes_agent.models.base import Model
from hermes_agent.models.registry import build_model
from hermes_agent.tools.registry import Tool

OPTIONAL = ""
"""Among an argument's acceptable values, ``""`` means the argument may be left out."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ExpectedCall(_Strict):
    """A call the model should make: the tool name and, per argument, its acceptable values."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)

    def options(self, argument: str) -> list[Any]:
        """The acceptable values of ``argument`` (a single value is a list of one)."""
        value = self.arguments[argument]
        return list(value) if isinstance(value, list) else [value]


class EvalCase(_Strict):
    """One question and what should come of it.

    ``expect`` is a list of calls, or ``none`` (an empty list works too) when the model should
    answer without calling a tool — even a refused or malformed attempt then fails the case.
    ``execute`` runs the tools and lets the model answer; ``output_contains`` then checks the
    answer (case-insensitive).
    """

    id: str
    question: str
    expect: list[ExpectedCall] | Literal["none"]
    tool_choice: str | None = None
    execute: bool | None = None
    output_contains: str | None = None

    @property
    def expected_calls(self) -> list[ExpectedCall]:
        return [] if self.expect == "none" else self.expect


class EvalSuite(_Strict):
    """A suite: its cases, the tools they need and how to run them.

    ``tools`` are Python files (relative to the suite file) whose tools to load, as with
    ``hermes-agent run --tools``; ``demo_tools`` adds the built-in ones. ``config`` names a
    Hermes config file (model and agent settings; relative to the suite file) — the
    ``--config`` option overrides it; without either, the embedded model runs the suite.
    """

    name: str = "eval suite"
    config: str | None = None
    tools: list[str] = Field(default_factory=list)
    demo_tools: bool = False
    system_prompt: str | None = None
    tool_choice: str = "auto"
    execute: bool = False
    cases: list[EvalCase]
    source: Path | None = Field(default=None, exclude=True)

    @field_validator("cases")
    @classmethod
    def _unique_ids(cls, cases: list[EvalCase]) -> list[EvalCase]:
        seen: set[str] = set()
        for case in cases:
            if case.id in seen:
                raise ValueError(f"two cases have the id {case.id!r}; ids must be unique")
            seen.add(case.id)
        if not cases:
            raise ValueError("a suite needs at least one case")
        return cases

    def folder(self) -> Path:
        return self.source.parent if self.source is not None else Path.cwd()


def load_suite(path: str | os.PathLike[str]) -> EvalSuite:
    """Read and check a YAML suite; errors name the file and the key."""
    file = Path(path)
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read the suite ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{file}: the top level must be a mapping with a 'cases:' list")
    try:
        suite = EvalSuite.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}" for error in exc.errors()
        )
        raise ConfigError(f"{file}: {problems}") from exc
    suite.source = file
    return suite


# -- matching ---------------------------------------------------------------------------------


def values_equal(actual: Any, expected: Any) -> bool:
    """Loose equality for arguments: strings ignoring case and surrounding space, numbers by
    value (``2 == 2.0``, but ``True`` is not ``1``), lists and mappings element by element."""
    if isinstance(actual, bool) or isinstance(expected, bool):
        return isinstance(actual, bool) and isinstance(expected, bool) and actual == expected
    if isinstance(actual, str) and isinstance(expected, str):
        return actual.strip().casefold() == expected.strip().casefold()
    if isinstance(actual, int | float) and isinstance(expected, int | float):
        return float(actual) == float(expected)
    if isinstance(actual, list) and isinstance(expected, list):
        return len(actual) == len(expected) and all(
            values_equal(a, e) for a, e in zip(actual, expected, strict=True)
        )
    if isinstance(actual, Mapping) and isinstance(expected, Mapping):
        return set(actual) == set(expected) and all(
            values_equal(actual[key], expected[key]) for key in expected
        )
    return bool(actual == expected)


def call_mismatch(expected: ExpectedCall, name: str, arguments: Mapping[str, Any]) -> str | None:
    """Why one actual call does not match ``expected`` (``None`` when it does)."""
    if name != expected.name:
        return f"called {name}, expected {expected.name}"
    for argument in arguments:
        if argument not in expected.arguments:
            return f"{name}: unexpected argument {argument!r}"
    for argument in expected.arguments:
        options = expected.options(argument)
        if argument not in arguments:
            if OPTIONAL not in options:
                return f"{name}: missing argument {argument!r}"
            continue
        value = arguments[argument]
        if not any(values_equal(value, option) for option in options if option != OPTIONAL):
            wanted = [option for option in options if option != OPTIONAL]
            return f"{name}: {argument!r} is {value!r}, expected one of {wanted!r}"
    return None


def calls_mismatch(
    expected: Sequence[ExpectedCall], actual: Sequence[Mapping[str, Any]]
) -> str | None:
    """Why the actual calls do not match the expected ones, in any order (``None``: they do)."""
    if len(actual) != len(expected):
        names = ", ".join(str(call["name"]) for call in actual) or "none"
        return f"expected {len(expected)} call(s), got {len(actual)} ({names})"
    unmatched = list(actual)
    for want in expected:
        reasons = []
        for index, call in enumerate(unmatched):
            reason = call_mismatch(want, call["name"], call["arguments"])
            if reason is None:
                del unmatched[index]
                break
            reasons.append(reason)
        else:
            same_name = [r for r in reasons if not r.startswith("called ")]
            return (same_name or reasons or [f"no call matches {want.name}"])[0]
    return None


# -- running ----------------------------------------------------------------------------------


class SuiteRunner:
    """Runs the cases of a suite, each in a fresh agent with the same model and tools."""

    def __init__(self, suite: EvalSuite, config: HermesConfig, model: Model, tools: list[Tool]):
        self.suite = suite
        self.config = config
        self.model = model
        self.tools = tools

    def run_case(self, case: EvalCase) -> CaseResult:
        started = time.perf_counter()
        execute = case.execute if case.execute is not None else self.suite.execute
        agent = Agent.from_settings(self.config, model=self.model, tools=self.tools)
        if self.suite.system_prompt is not None:
            agent.system_prompt = self.suite.system_prompt
        tool_choice = case.tool_choice or self.suite.tool_choice
        result = CaseResult(case.id, self.suite.name, False)
        try:
            run = agent.run(case.question, tool_choice=tool_choice, dry_run=not execute)
        except Exception as exc:  # a broken case is a failed case, not a crashed suite
            result.error = f"the run failed: {type(exc).__name__}: {exc}"
            return result
        finally:
            agent.close()
        record_run(result, run)
        result.error = calls_mismatch(case.expected_calls, result.calls)
        if result.error is None and not case.expected_calls and result.made_call:
            tried = ", ".join(c["name"] for c in result.parsed_calls) or "a malformed call"
            result.error = f"expected no call, the model tried {tried}"
        if result.error is None and run.status >= 400:
            result.error = f"the run ended with status {run.status}: {run.error or run.output}"
        wanted = case.output_contains
        if result.error is None and wanted and wanted.casefold() not in run.output.casefold():
            result.error = f"the answer does not contain {case.output_contains!r}"
        result.correct = result.error is None
        result.verdict = {"valid": result.correct, "status": run.status}
        result.duration_s = round(time.perf_counter() - started, 4)
        return result


def suite_config(suite: EvalSuite, config: str | os.PathLike[str] | None) -> HermesConfig:
    """The config that runs ``suite``: ``config`` if given, else the suite's, else defaults."""
    if config is not None:
        return load_config(config)
    if suite.config is not None:
        return load_config(suite.folder() / suite.config)
    return HermesConfig()


def suite_tools(suite: EvalSuite) -> list[Tool]:
    """The tools a suite names (its files, plus the demo tools when asked for)."""
    tools: dict[str, Tool] = {}
    if suite.demo_tools:
        from hermes_agent.demo_tools import demo_tools

        tools.update((tool.name, tool) for tool in demo_tools())
    for name in suite.tools:
        tools.update((tool.name, tool) for tool in load_tools_file(suite.folder() / name))
    return list(tools.values())


def run_suite(
    suite: EvalSuite,
    *,
    config: HermesConfig | None = None,
    model: Model | None = None,
    console: Console | None = None,
) -> Report:
    """Run every case of ``suite``; with a ``console``, show a progress bar on it."""
    settings = config if config is not None else suite_config(suite, None)
    chosen = model if model is not None else build_model(settings.model)
    runner = SuiteRunner(suite, settings, chosen, suite_tools(suite))
    shown = console if console is not None else Console(quiet=True)
    results = run_with_progress(
        suite.cases, runner.run_case, shown, suite.name, show=console is not None
    )
    return Report(
        title=suite.name,
        results=list(results),
        settings={
            "suite": str(suite.source) if suite.source else None,
            "model": getattr(chosen, "name", type(chosen).__name__),
        },
    )
