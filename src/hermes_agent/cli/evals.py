"""``hermes-agent eval``: run a YAML regression suite, or the BFCL harness.

    hermes-agent eval examples/eval_cases.yaml          # report: .hermes/eval-report.json
    hermes-agent eval examples/eval_cases.yaml --report out.json
    hermes-agent eval bfcl --category simple_python,multiple --limit 20 --model oracle
    hermes-agent eval bfcl --category simple_python --limit 5 --model embedded --no-grammar
    hermes-agent eval bfcl --setup      # install BFCL's data and checkers for the harness

Exit codes: 0 when the accuracy is at least ``--min-accuracy`` (1.0 for a suite: every case
must pass; 0 for BFCL: report only), 1 below it, 2 for a usage or configuration error.
Nothing is written but the report (``--report``; by default ``.hermes/eval-report.json`` or
``.hermes/bfcl-report.json`` under the working folder, beside the command line's state), unless
the config has a ``storage:`` section. The summary goes to stdout; progress, the report's path
and a failed threshold to stderr.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hermes_agent.cli._common import ConfigOption, config_error, err, fail, out, styled, warn
from hermes_agent.errors import HermesAgentError
from hermes_agent.evals import bfcl, bfcl_compat, bfcl_install
from hermes_agent.evals.report import Report, summary_table

REPORT_FOLDER = Path(".hermes")
"""Where reports go unless ``--report`` says: beside the command line's ``state.db``, never
loose in the working folder."""
MAX_FAILURES_SHOWN = 20


def eval_command(
    target: Annotated[
        str, typer.Argument(help="A YAML suite file, or 'bfcl' for the BFCL harness.")
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
    """Evaluate tool calling: a YAML suite of expected calls, or BFCL ('bfcl')."""
    if setup:
        _setup_bfcl(target)
        return
    try:
        if target == "bfcl":
            chosen = model or ("config" if config is not None else "oracle")
            result = _run_bfcl(category, limit, chosen, grammar, config, quiet)
            threshold = 0.0 if min_accuracy is None else min_accuracy
            default_report = REPORT_FOLDER / "bfcl-report.json"
        else:
            result = _run_suite(Path(target), config, quiet)
            threshold = 1.0 if min_accuracy is None else min_accuracy
            default_report = REPORT_FOLDER / "eval-report.json"
    except HermesAgentError as exc:
        fail(config_error(config, exc))
    _print_summary(result)
    written = result.write_json(report or default_report)
    err().print(f"report: {written}")
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


def _run_bfcl(
    categories: str,
    limit: int | None,
    model: str,
    grammar: bool,
    config: Path | None,
    quiet: bool,
) -> Report:
    names = bfcl.parse_categories(categories)
    model_for, model_name, tool_choice = _bfcl_model(model, grammar, config)
    harness = bfcl.BfclHarness(model_for, tool_choice=tool_choice)
    cases = [case for name in names for case in bfcl.load_cases(name, limit)]
    settings = {
        "categories": names,
        "limit": limit,
        "model": model_name,
        "grammar": grammar if model == "embedded" else None,
        "tool_choice": tool_choice,
        "run_key": harness.run_key,
        "bfcl_eval": bfcl_compat.installed_version(),
    }
    return harness.run(
        cases,
        console=None if quiet else err(),
        title=f"BFCL · {model_name}",
        settings=settings,
    )


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


def _bfcl_model(
    model: str, grammar: bool, config: Path | None
) -> tuple[bfcl.ModelFactory, str, str]:
    from hermes_agent.config import load_config
    from hermes_agent.models.registry import build_model

    if model == "oracle":
        return bfcl.oracle_model_for, "oracle", "auto"
    if model == "embedded":
        from hermes_agent.models.llamacpp import LlamaCpp

        embedded = LlamaCpp(use_grammar=grammar)
        suffix = "grammar" if grammar else "no grammar"
        return bfcl.shared_model(embedded), f"{embedded.name} ({suffix})", "auto"
    if model == "config":
        if config is None:
            raise HermesAgentError("--model config needs --config model.yaml")
        settings = load_config(config)
        built = build_model(settings.model)
        return bfcl.shared_model(built), built.name, settings.agent.tool_choice
    raise HermesAgentError(f"unknown --model {model!r}; use oracle, embedded or config")
