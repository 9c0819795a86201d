"""``hermes-agent eval``: run a YAML regression suite, or the BFCL harness; compare reports.

    hermes-agent eval examples/eval_cases.yaml          # report: .hermes/eval-report.json
    hermes-agent eval examples/eval_cases.yaml --report out.json
    hermes-agent eval bfcl --category simple_python,multiple --limit 20 --model oracle
    hermes-agent eval bfcl --category simple_python --limit 5 --model embedded --no-grammar
    hermes-agent eval bfcl --category all --config endpoint.yaml --workers 8 -r run.json
    hermes-agent eval bfcl --category all --config endpoint.yaml --workers 8 -r run.json --resume
    hermes-agent eval --compare native.json hermes.json --chart compare.png
    hermes-agent eval bfcl --setup      # install BFCL's data and checkers for the harness

Exit codes: 0 when the accuracy is at least ``--min-accuracy`` (1.0 for a suite: every case
must pass; 0 for BFCL: report only), 1 below it, 2 for a usage or configuration error, 130
when a BFCL run is interrupted (its report so far is written; ``--resume`` continues it).
Nothing is written but the report (``--report``; by default ``.hermes/eval-report.json`` or
``.hermes/bfcl-report.json`` under the working folder, beside the command line's state), unless
the config has a ``storage:`` section. A BFCL run also keeps a journal beside its report while
it goes (``<report>.partial.jsonl``, removed when the run ends). The summary goes to stdout;
progress, the report's path and a failed threshold to stderr.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hermes_agent.cli._common import ConfigOption, config_error, err, fail, out, styled, warn
from hermes_agent.errors import HermesAgentError, MissingDependencyError
from hermes_agent.evals import bfcl, bfcl_compat, bfcl_install
from hermes_agent.evals.report import Report, summary_table
from hermes_agent.evals.resume import ReportWriter

REPORT_FOLDER = Path(".hermes")
"""Where reports go unless ``--report`` says: beside the command line's ``state.db``, never
loose in the working folder."""
MAX_FAILURES_SHOWN = 20
RUN_IDENTITY = ("model", "mode", "endpoint", "grammar", "tool_choice", "bfcl_eval")
"""The settings a resumed BFCL run must share with the run it continues."""
INTERRUPTED = 130


def eval_command(
    targets: Annotated[
        list[str],
        typer.Argument(
            help="A YAML suite file, or 'bfcl' for the BFCL harness; with --compare, two or "
            "more JSON reports.",
            show_default=False,
        ),
    ],
    config: ConfigOption = None,
    report: Annotated[
        Path | None,
        typer.Option(
            "--report",
            "-r",
            help="Where to write the JSON report (default: .hermes/eval-report.json, or "
            ".hermes/bfcl-report.json for bfcl).",
        ),
    ] = None,
    min_accuracy: Annotated[
        float | None,
        typer.Option(
            "--min-accuracy",
            min=0.0,
            max=1.0,
            help="Exit 1 below this accuracy (default: 1.0 for a suite, 0 for bfcl).",
        ),
    ] = None,
    category: Annotated[
        str,
        typer.Option("--category", help="bfcl: comma-separated categories, or 'all'."),
    ] = "simple_python",
    limit: Annotated[
        int | None,
        typer.Option("--limit", "-n", min=1, help="bfcl: the first N cases of each category."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            "-m",
            help="bfcl: oracle | embedded | config (the model of --config; the default when "
            "--config is given, else oracle).",
        ),
    ] = None,
    grammar: Annotated[
        bool,
        typer.Option("--grammar/--no-grammar", help="bfcl embedded: constrained decoding."),
    ] = True,
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            "-w",
            min=1,
            help="bfcl: cases run at once (concurrent requests to an endpoint; the embedded "
            "model takes one at a time).",
        ),
    ] = 1,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="bfcl: continue the run that wrote --report (kept: its finished cases; run "
            "again: the rest, and cases that ended in a harness or model error).",
        ),
    ] = False,
    compare: Annotated[
        bool,
        typer.Option(
            "--compare",
            help="Compare two or more JSON reports (the arguments): a table, and a chart.",
        ),
    ] = False,
    chart: Annotated[
        Path | None,
        typer.Option(
            "--chart",
            help="--compare: where to write the chart (PNG; default .hermes/compare.png).",
        ),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    setup: Annotated[
        bool,
        typer.Option(
            "--setup",
            help="bfcl: install BFCL's data and checkers (bfcl-eval, without its dependencies) "
            "into the harness's own folder ($HERMES_BFCL_DIR, else inside this Python "
            "environment), then exit.",
        ),
    ] = False,
) -> None:
    """Evaluate tool calling: a YAML suite of expected calls, or BFCL ('bfcl'); or compare
    reports (--compare)."""
    if compare:
        _compare(targets, chart)
        return
    if len(targets) != 1:
        fail(f"give one suite file or 'bfcl', not {len(targets)} arguments (or use --compare)")
    (target,) = targets
    if setup:
        _setup_bfcl(target)
        return
    try:
        if target == "bfcl":
            chosen = model or ("config" if config is not None else "oracle")
            path = report or REPORT_FOLDER / "bfcl-report.json"
            options = _BfclOptions(category, limit, chosen, grammar, workers, resume, quiet)
            result = _run_bfcl(options, config, path)
            threshold = 0.0 if min_accuracy is None else min_accuracy
        else:
            result = _run_suite(Path(target), config, quiet)
            threshold = 1.0 if min_accuracy is None else min_accuracy
            path = result.write_json(report or REPORT_FOLDER / "eval-report.json")
    except HermesAgentError as exc:
        fail(config_error(config, exc))
    _print_summary(result)
    err().print(f"report: {path}")
    if result.accuracy < threshold:
        err().print(
            styled(
                ("error: ", "bold red"),
                f"accuracy {result.accuracy:.1%} is below --min-accuracy {threshold:.1%}",
            )
        )
        raise typer.Exit(1)


def _print_summary(result: Report) -> None:
    """The summary table (stdout), then the first failures with their reasons, printed as they
    are (a reason quotes the model's arguments, brackets and all)."""
    out(markup=True).print(summary_table(result))  # the table's own colours are markup
    failures = result.failures()
    console = out()
    for failed in failures[:MAX_FAILURES_SHOWN]:
        console.print(styled(("✗ ", "red"), f"{failed.id}: {failed.error or 'incorrect'}"))
    if len(failures) > MAX_FAILURES_SHOWN:
        hidden = len(failures) - MAX_FAILURES_SHOWN
        console.print(f"... and {hidden} more failures (see the report)")


def _run_suite(path: Path, config: Path | None, quiet: bool) -> Report:
    from hermes_agent.evals.cases import load_suite, run_suite, suite_config

    suite = load_suite(path)
    return run_suite(suite, config=suite_config(suite, config), console=None if quiet else err())


class _BfclOptions:
    """The command line's BFCL choices, in one place."""

    def __init__(
        self,
        category: str,
        limit: int | None,
        model: str,
        grammar: bool,
        workers: int,
        resume: bool,
        quiet: bool,
    ) -> None:
        self.category = category
        self.limit = limit
        self.model = model
        self.grammar = grammar
        self.workers = workers
        self.resume = resume
        self.quiet = quiet


def _run_bfcl(options: _BfclOptions, config: Path | None, path: Path) -> Report:
    names = bfcl.parse_categories(options.category)
    if options.workers > 1 and options.model == "embedded":
        raise HermesAgentError(
            "the embedded model answers one case at a time: --workers is for the oracle and "
            "endpoint models (--model config)"
        )
    chosen = _bfcl_model(options.model, options.grammar, config)
    harness = bfcl.BfclHarness(chosen.model_for, tool_choice=chosen.tool_choice)
    cases = [case for name in names for case in bfcl.load_cases(name, options.limit)]
    settings = {
        "categories": names,
        "limit": options.limit,
        "model": chosen.name,
        "mode": chosen.mode,
        "endpoint": chosen.endpoint,
        "grammar": chosen.grammar,
        "tool_choice": chosen.tool_choice,
        "workers": options.workers,
        "run_key": harness.run_key,
        "bfcl_eval": bfcl_compat.installed_version(),
    }
    title = f"BFCL · {chosen.name}" + (f" ({chosen.mode})" if chosen.mode else "")
    writer = ReportWriter(path, title, settings)
    done = writer.resume(RUN_IDENTITY) if options.resume else {}
    wanted = {case.id for case in cases}
    done = {case_id: result for case_id, result in done.items() if case_id in wanted}
    if options.resume:
        err().print(f"resuming {path}: {len(done)} of {len(cases)} cases already done")
    writer.start(done.values())
    try:
        result = harness.run(
            cases,
            console=None if options.quiet else err(),
            title=title,
            settings=settings,
            workers=options.workers,
            done=done,
            on_result=writer.add,
        )
    except KeyboardInterrupt:
        partial = writer.checkpoint()
        writer.close()
        err().print(
            f"interrupted: {partial.total} of {len(cases)} cases done, written to {path}; "
            "run the same command with --resume to continue"
        )
        raise typer.Exit(INTERRUPTED) from None
    return writer.finish(result.results)


def _compare(paths: list[str], chart: Path | None) -> None:
    """``eval --compare a.json b.json ...``: the table on stdout, the chart to ``--chart``."""
    from hermes_agent.evals.compare import compare_table, load_reports, write_chart

    try:
        reports = load_reports([Path(p) for p in paths])
    except HermesAgentError as exc:
        fail(str(exc))
    out(markup=True).print(compare_table(reports))
    try:
        written = write_chart(reports, chart or REPORT_FOLDER / "compare.png")
    except MissingDependencyError as exc:
        warn(f"no chart: {exc}")
        return
    err().print(f"chart: {written}")


def _setup_bfcl(target: str) -> None:
    """``eval bfcl --setup``: bfcl-eval into the harness's folder, never the environment's
    packages (so ``pip check`` stays clean), and a word on the ``eval`` extra if it is missing."""
    if target != "bfcl":
        fail(f"--setup is for the BFCL harness: `{bfcl_install.SETUP_COMMAND}`, not {target!r}")
    try:
        folder, ran = bfcl_install.install()
    except HermesAgentError as exc:
        fail(str(exc))
    done = "installed" if ran else "already installed"
    out().print(f"bfcl-eval {bfcl_install.VERSION} {done} in {folder} (not in site-packages)")
    missing = bfcl_install.missing_extra()
    if missing:
        warn(f"BFCL's checkers also need {', '.join(missing)}: {bfcl_install.EXTRA_HINT}")


class _ChosenModel:
    """What ``--model`` resolved to: a model per case, and what the report says about it."""

    def __init__(
        self,
        model_for: bfcl.ModelFactory,
        name: str,
        tool_choice: str,
        mode: str | None = None,
        endpoint: str | None = None,
        grammar: bool | None = None,
    ) -> None:
        self.model_for = model_for
        self.name = name
        self.tool_choice = tool_choice
        self.mode = mode
        self.endpoint = endpoint
        self.grammar = grammar


def _bfcl_model(model: str, grammar: bool, config: Path | None) -> _ChosenModel:
    from hermes_agent.config import OpenAIConfig, load_config
    from hermes_agent.models.registry import build_model

    if model == "oracle":
        return _ChosenModel(bfcl.oracle_model_for, "oracle", "auto")
    if model == "embedded":
        from hermes_agent.models.llamacpp import LlamaCpp

        embedded = LlamaCpp(use_grammar=grammar)
        suffix = "grammar" if grammar else "no grammar"
        name = f"{embedded.name} ({suffix})"
        return _ChosenModel(bfcl.shared_model(embedded), name, "auto", grammar=grammar)
    if model == "config":
        if config is None:
            raise HermesAgentError("--model config needs --config model.yaml")
        settings = load_config(config)
        built = build_model(settings.model)
        section = settings.model
        shared, tool_choice = bfcl.shared_model(built), settings.agent.tool_choice
        if isinstance(section, OpenAIConfig):
            return _ChosenModel(
                shared, built.name, tool_choice, section.mode, section.base_url, section.grammar
            )
        return _ChosenModel(shared, built.name, tool_choice)
    raise HermesAgentError(f"unknown --model {model!r}; use oracle, embedded or config")
