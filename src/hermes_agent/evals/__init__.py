"""Evaluation: tool-calling regression suites and the Berkeley Function Calling Leaderboard.

    hermes-agent eval cases.yaml                        # your own suite (see docs/evaluation.md)
    hermes-agent eval bfcl --category simple_python --limit 20 --model oracle

``cases`` runs YAML suites of questions and expected calls; ``bfcl`` runs BFCL through the real
Agent pipeline and scores it with BFCL's own checkers; ``report`` holds the results. A public
module: import from here (``BfclHarness``, ``load_cases``, ``oracle_model_for``, ``shared_model``
are BFCL's), not from those.
"""

from hermes_agent.evals.bfcl import BfclHarness, load_cases, oracle_model_for, shared_model
from hermes_agent.evals.cases import EvalCase, EvalSuite, load_suite, run_suite
from hermes_agent.evals.report import CaseResult, CategorySummary, Report

__all__ = [
    "BfclHarness",
    "CaseResult",
    "CategorySummary",
    "EvalCase",
    "EvalSuite",
    "Report",
    "load_cases",
    "load_suite",
    "oracle_model_for",
    "run_suite",
    "shared_model",
]
