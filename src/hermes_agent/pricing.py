"""What a run costs: each model's token usage at that model's prices.

A model's prices are the ones given to the ``Agent`` (``price_per_1k_*`` for ``model``,
``answer_price_per_1k_*`` for ``answer_model``; the config's ``price_per_1k_*`` keys), else the
ones its ``ModelProfile`` declares. Usage is reported per model name, so each name is priced at
the prices of the model that has it. No price at all is ``None``, never ``0.0``.

    >>> from hermes_agent.types import Usage
    >>> cost(Usage(prompt_tokens=2000, completion_tokens=500), Prices(0.5, 1.0))
    1.5
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from hermes_agent.models.base import Model
from hermes_agent.types import RunResult, Usage

__all__ = ["Prices", "RunPricing", "cost", "profile_prices"]


class Prices(NamedTuple):
    """Per 1,000 tokens; ``None``: not priced (a run with no price has no cost)."""

    prompt: float | None = None
    completion: float | None = None

    @property
    def known(self) -> bool:
        return self.prompt is not None or self.completion is not None


def cost(usage: Usage, prices: tuple[float | None, float | None]) -> float | None:
    """What ``usage`` costs at ``prices`` (``None`` when neither price is set)."""
    prompt_price, completion_price = prices
    if prompt_price is None and completion_price is None:
        return None
    return round(
        usage.prompt_tokens / 1000 * (prompt_price or 0.0)
        + usage.completion_tokens / 1000 * (completion_price or 0.0),
        8,
    )


def profile_prices(model: Model | None) -> Prices:
    """The prices ``model``'s profile declares (none for no model)."""
    if model is None:
        return Prices()
    profile = model.profile
    return Prices(profile.price_per_1k_prompt, profile.price_per_1k_completion)


class RunPricing:
    """The prices of one run's models, by the names their usage is reported under."""

    def __init__(
        self,
        model: Model,
        answer_model: Model | None,
        prices: tuple[float | None, float | None],
        answer_prices: tuple[float | None, float | None],
    ) -> None:
        given, answer_given = Prices(*prices), Prices(*answer_prices)
        self._prices = given if given.known else profile_prices(model)
        self._answer_name = answer_model.name if answer_model is not None else None
        self._answer_prices = answer_given if answer_given.known else profile_prices(answer_model)

    def prices(self, name: str) -> Prices:
        """The prices of the model named ``name`` (the answer model's for its name)."""
        return self._answer_prices if name == self._answer_name else self._prices

    def cost_of(self, usage_by_model: Mapping[str, Usage]) -> float | None:
        """What ``usage_by_model`` costs at each model's prices (``None``: no price set)."""
        costs = [cost(usage, self.prices(name)) for name, usage in usage_by_model.items()]
        known = [value for value in costs if value is not None]
        return round(sum(known), 8) if known else None

    def fill(self, result: RunResult) -> None:
        """Set ``result.cost_by_model`` and ``result.cost`` from its usage per model."""
        for name, usage in result.usage_by_model.items():
            value = cost(usage, self.prices(name))
            if value is not None:
                result.cost_by_model[name] = value
        if result.cost_by_model:
            result.cost = round(sum(result.cost_by_model.values()), 8)
