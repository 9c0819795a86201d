"""Run budgets: how many tokens, how much money and how much wall time one run may use.

``max_iterations`` bounds the rounds of tool calls; these bound what a run spends. Each is set
on the agent (``Agent(budget=Budget(max_run_tokens=..., max_run_cost=...,
run_timeout_s=...))``, or the config's ``agent:`` section) and may be changed per run
(``agent.run(..., max_run_tokens=...)``).

- ``max_run_tokens`` and ``max_run_cost`` are checked between steps: before each model turn,
  and before the calls of a turn run. Once the run has used its budget it stops there —
  status 206, ``loop_status == "budget_exceeded"``, ``stopped_by`` naming the budget, and an
  output that says so with the last tool results (like ``max_iterations``). The turn that
  crossed the line has been paid for: a final answer it brought is kept, with a warning. The
  cost is each model's usage at its prices (``price_per_1k_*``), the history summary included.
- ``run_timeout_s`` is a deadline for the whole run, counted from its start: whatever is under
  way when it passes (a model turn, a tool call) is cancelled, and the run ends with status
  504, ``loop_status == "timed_out"`` and an error saying so. Like a failed run, its turn is
  not saved to the session.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from hermes_agent.pipeline.status import Status
from hermes_agent.types import LoopStatus, Usage

CostOf = Callable[[Mapping[str, Usage]], float | None]
"""What usage per model costs at the agent's prices (``None``: no price is set)."""


@dataclass(frozen=True, slots=True)
class RunBudget:
    """The budgets of one run (``None``: unbounded) and how its cost is reckoned."""

    max_tokens: int | None = None
    max_cost: float | None = None
    timeout_s: float | None = None
    cost_of: CostOf | None = None

    def problem(self) -> str | None:
        """What is wrong with these budgets, for the caller to fix (``None``: nothing)."""
        for name, value in (
            ("max_run_tokens", self.max_tokens),
            ("max_run_cost", self.max_cost),
            ("run_timeout_s", self.timeout_s),
        ):
            if value is not None and (isinstance(value, bool) or not value > 0):
                return f"{name} must be a positive number, got {value!r}"
        if self.max_cost is not None and (
            self.cost_of is None or self.cost_of({"": Usage(1000, 1000)}) is None
        ):
            return (
                "max_run_cost needs prices to count a cost against: set price_per_1k_prompt "
                "and price_per_1k_completion (the config's model section), or "
                "Agent(pricing=Pricing(prompt_per_1k=..., completion_per_1k=...))"
            )
        return None


class RunContext(Protocol):
    """What a budget reads and sets of a run (the pipeline's ``RunContext``)."""

    budget: RunBudget
    usage: Usage
    usage_by_model: dict[str, Usage]
    status: int
    error: str | None
    finished: bool
    loop_status: LoopStatus
    stopped_by: str | None
    output: str
    step: int
    warnings: list[str]


def spent(ctx: RunContext) -> bool:
    """Stop the run when its token or cost budget is used up (see the module docstring);
    ``True`` when it stopped."""
    budget = ctx.budget
    used = ctx.usage.total_tokens
    if budget.max_tokens is not None and used >= budget.max_tokens:
        _stop(
            ctx,
            "max_run_tokens",
            f"this run used {used:,} tokens and its budget is {budget.max_tokens:,}",
        )
        return True
    if budget.max_cost is not None and budget.cost_of is not None:
        cost = budget.cost_of(ctx.usage_by_model) or 0.0
        if cost >= budget.max_cost:
            _stop(
                ctx,
                "max_run_cost",
                f"this run cost {cost:g} and its budget is {budget.max_cost:g}",
            )
            return True
    return False


def note_overrun(ctx: RunContext) -> None:
    """The run answered, and its last turn took it past a budget: the answer stands (it is
    paid for), and the result says what it cost."""
    budget = ctx.budget
    used = ctx.usage.total_tokens
    if budget.max_tokens is not None and used > budget.max_tokens:
        ctx.warnings.append(
            f"budget: the last model turn took this run to {used:,} tokens, over its "
            f"max_run_tokens of {budget.max_tokens:,}; the answer it brought was kept"
        )
    if budget.max_cost is not None and budget.cost_of is not None:
        cost = budget.cost_of(ctx.usage_by_model) or 0.0
        if cost > budget.max_cost:
            ctx.warnings.append(
                f"budget: the last model turn took this run's cost to {cost:g}, over its "
                f"max_run_cost of {budget.max_cost:g}; the answer it brought was kept"
            )


def timed_out(ctx: RunContext) -> None:
    """End the run at its ``run_timeout_s``."""
    limit = ctx.budget.timeout_s
    message = (
        f"the run took longer than its run_timeout_s ({limit:g} s) and was stopped "
        f"during step {ctx.step}"
    )
    ctx.status = Status.RUN_TIMEOUT
    ctx.error = message
    ctx.finished = True
    ctx.loop_status = "timed_out"
    ctx.stopped_by = "run_timeout_s"
    ctx.output = f"I could not finish in time: {message}."


def _stop(ctx: RunContext, which: str, spending: str) -> None:
    ctx.status = Status.PARTIAL
    ctx.finished = True
    ctx.loop_status = "budget_exceeded"
    ctx.stopped_by = which
    # The OutputRenderer adds the last tool results, as it does after max_iterations.
    ctx.output = f"I stopped before a final answer: {spending} ({which})."
