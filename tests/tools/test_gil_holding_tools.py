"""A tool that holds the GIL stalls the other runs of its process unless it runs in a process of
its own (``execution_mode="subprocess"``), as docs/service.md says: a run beside a grinding tool
answers while the tool grinds when the tool is a ``subprocess`` one, and waits on it when the
same tool runs in process."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import pytest

from hermes_agent import Agent, ScriptedModel
from hermes_agent.tools.registry import Tool
from hermes_agent.types import Message

GRIND_S = 3.0


def grind(seconds: float) -> str:
    """Hold the GIL: each ``sum`` is one C call, which no other thread interrupts."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sum(range(20_000_000))
    return "ground"


async def pause() -> str:
    """Wait a little, as a run waits on its model or a service: the loop lets go of the GIL."""
    await asyncio.sleep(0.02)  # a wait on the loop, as a run waits on its model
    return "paused"


def _call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


def _script(messages: Sequence[Message], _tools: Sequence[dict[str, Any]]) -> str:
    last_user = max(i for i, m in enumerate(messages) if m.role == "user")
    results = sum(1 for m in messages[last_user:] if m.role == "tool")
    if messages[last_user].content == "grind":
        return "done" if results else _call("grind", f'{{"seconds": {GRIND_S}}}')
    return "quick answer" if results >= 3 else _call("pause", "{}")


def _quick_run_beside_grinding(mode: str) -> float:
    """Seconds a run of three short waits takes while the other run's tool grinds."""
    agent = Agent(model=ScriptedModel(_script))
    agent.add_tool(Tool.from_function(grind, execution_mode=mode, timeout=60))
    agent.add_tool(Tool.from_function(pause))

    async def scenario() -> float:
        grinding = asyncio.create_task(agent.arun("grind"))
        await asyncio.sleep(0.5)  # the tool is grinding (a subprocess worker has started)
        assert not grinding.done()
        started = time.monotonic()
        quick = await agent.arun("hello")
        took = time.monotonic() - started
        assert quick.output == "quick answer"
        assert (await grinding).output == "done"
        return took

    try:
        return asyncio.run(scenario())
    finally:
        agent.close()


@pytest.mark.timeout(60)
def test_a_subprocess_tool_that_holds_the_gil_does_not_stall_other_runs() -> None:
    beside_subprocess = _quick_run_beside_grinding("subprocess")
    beside_in_process = _quick_run_beside_grinding("in_process")
    assert beside_subprocess < 1.0, beside_subprocess
    assert beside_in_process > 4 * beside_subprocess, (beside_in_process, beside_subprocess)
