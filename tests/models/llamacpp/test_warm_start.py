"""Warm start: ``Agent.warmup`` loads the embedded model and leaves the system prompt evaluated
in llama.cpp's context; the service warms its agent in the background at start-up (what
``hermes-agent serve`` asks for) and ``/readyz`` is 503 until that is done."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from hermes_agent import Agent, Message, ModelSettings, ScriptedModel
from hermes_agent.demo_tools import demo_tools
from hermes_agent.server import ServiceSettings, create_app
from server_harness import serve, wait_for

pytest.importorskip("llama_cpp")


def test_warmup_leaves_the_first_requests_prefix_evaluated() -> None:
    from hermes_agent.models.llamacpp import LlamaCpp

    agent = Agent(system_prompt="You answer questions about flights.", tools=demo_tools())
    took = agent.warmup()
    assert took > 0
    model = agent.model
    assert isinstance(model, LlamaCpp)
    llm = model.llama
    tools = [tool.spec() for tool in agent.tools]
    # The prompt of a real first request: the same system turn and tools, another message.
    first = [Message("system", "You answer questions about flights."), Message("user", "2+2?")]
    prompt = model.render_prompt(first, tools, ModelSettings(tool_choice="auto"))
    system_part = prompt[: prompt.index("<|im_start|>user")]
    wanted = llm.tokenize(prompt.encode(), add_bos=False, special=True)
    needed = len(llm.tokenize(system_part.encode(), add_bos=False, special=True))
    kept = [list(llm._input_ids.tolist())]
    kept += [snapshot.tokens for snapshot in model._loaded().snapshots]
    shared = max(llm.longest_token_prefix(tokens, wanted) for tokens in kept)
    # The warmup's call decision can go either way (it hangs on the CPU's arithmetic): when it
    # decided to call, the context holds the `required` rendering, which parts from this one
    # only at the system prompt's last line.
    required = model.render_prompt(first, tools, ModelSettings(tool_choice="required"))
    parting = llm.longest_token_prefix(
        llm.tokenize(required.encode(), add_bos=False, special=True), wanted
    )
    assert needed - parting < 20  # the renderings share the tool prompt
    # Everything up to the user's turn (the Hermes tool prompt: hundreds of tokens), or up to
    # where the two renderings part, is there.
    assert needed > 300 and shared >= min(needed - 2, parting)


def test_warmup_asks_nothing_of_a_model_that_has_nothing_to_load() -> None:
    model = ScriptedModel(["the only answer"])
    agent = Agent(model, tools=demo_tools())
    agent.warmup()
    assert model.requests == []  # no scripted answer spent, no endpoint called
    assert agent.run("hi").output == "the only answer"


def _ready(url: str) -> httpx.Response:
    return httpx.get(f"{url}/readyz", timeout=10)


def test_readyz_is_503_while_the_service_warms_up(tmp_path: Path) -> None:
    agent = Agent(ScriptedModel(["hello"]), storage=f"sqlite:///{tmp_path / 'state.db'}")
    release = threading.Event()
    calls: list[float] = []

    def slow_warmup() -> float:
        calls.append(time.monotonic())
        release.wait(30)
        return 0.5

    agent.warmup = slow_warmup  # type: ignore[method-assign]
    app = create_app(agent=agent, settings=ServiceSettings(auth="none"), warmup=True)
    with serve(app) as url:
        waiting = _ready(url)
        assert waiting.status_code == 503 and waiting.json() == {"status": "warming up"}
        assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200  # alive meanwhile
        release.set()
        wait_for(lambda: _ready(url).status_code == 200, 20, "/readyz 200")
        assert _ready(url).json() == {"status": "ready"}
        answer = httpx.post(f"{url}/v1/runs", json={"message": "hi"}, timeout=30)
        assert answer.status_code == 200 and answer.json()["output"] == "hello"
    assert len(calls) == 1
    assert app.state.warm.seconds == 0.5


def test_a_failed_warmup_keeps_readyz_503_and_says_why_in_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agent = Agent(ScriptedModel(["hello"]), storage=f"sqlite:///{tmp_path / 'state.db'}")

    def broken() -> float:
        raise RuntimeError("model file is damaged")

    agent.warmup = broken  # type: ignore[method-assign]
    app = create_app(agent=agent, settings=ServiceSettings(auth="none"), warmup=True)
    with serve(app) as url:
        deadline = time.monotonic() + 20
        body: Any = None
        while time.monotonic() < deadline:
            body = _ready(url).json()
            if body["status"] != "warming up":
                break
            time.sleep(0.05)  # the polling pace, bounded by the deadline above
        assert body == {
            "status": "unavailable",
            "error": "the model could not be loaded (see the log)",
        }
    assert "model file is damaged" in caplog.text


def test_without_warmup_readyz_does_not_wait(tmp_path: Path) -> None:
    agent = Agent(ScriptedModel(["hello"]), storage=f"sqlite:///{tmp_path / 'state.db'}")

    def never() -> float:
        raise AssertionError("warmup was not asked for")

    agent.warmup = never  # type: ignore[method-assign]
    with serve(create_app(agent=agent, settings=ServiceSettings(auth="none"))) as url:
        assert _ready(url).json() == {"status": "ready"}
