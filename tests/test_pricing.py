"""hermes_agent.pricing: a run's cost from each model's prices, given to the Agent or declared
on the model's profile."""

from __future__ import annotations

from hermes_agent import Agent, Pricing
from hermes_agent.agent_context import cost_of
from hermes_agent.models.base import ModelProfile
from hermes_agent.models.scripted import ScriptedModel
from hermes_agent.pricing import Prices, RunPricing, cost
from hermes_agent.types import Usage


class PricedModel(ScriptedModel):
    """A scripted model whose profile declares its prices."""

    @property
    def profile(self) -> ModelProfile:
        return ModelProfile(price_per_1k_prompt=1.0, price_per_1k_completion=2.0)


def test_no_price_is_no_cost_not_zero() -> None:
    assert cost(Usage(1000, 1000), Prices()) is None
    assert cost(Usage(1000, 1000), Prices(None, 0.0)) == 0.0


def test_the_profile_prices_a_run_when_the_agent_sets_none() -> None:
    agent = Agent(model=PricedModel(["ok"], name="priced"))
    result = agent.run("hi")
    usage = result.usage_by_model["priced"]
    expected = round(usage.prompt_tokens / 1000 * 1.0 + usage.completion_tokens / 1000 * 2.0, 8)
    assert result.cost == expected
    assert result.cost_by_model == {"priced": expected}


def test_prices_given_to_the_agent_win_over_the_profile() -> None:
    agent = Agent(model=PricedModel(["ok"]), pricing=Pricing(prompt_per_1k=10.0))
    assert cost_of(agent, {"scripted": Usage(1000, 1000)}) == 10.0


def test_each_model_is_priced_by_its_own_name() -> None:
    main, answer = PricedModel([], name="main"), ScriptedModel([], name="answer")
    pricing = RunPricing(main, answer, (None, None), (0.5, None))
    assert pricing.prices("main") == Prices(1.0, 2.0)
    assert pricing.prices("answer") == Prices(0.5, None)
    assert pricing.cost_of({"main": Usage(1000, 0), "answer": Usage(2000, 0)}) == 2.0
    assert (
        RunPricing(ScriptedModel([]), None, (None, None), (None, None)).cost_of(
            {"scripted": Usage(5, 5)}
        )
        is None
    )
