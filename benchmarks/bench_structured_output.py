"""Structured output, measured: passes per try for each OpenAI client against the default
service (embedded SmolLM2, demo tools), and, per engine and mode, the tool calls made and
the typed answers given for a task that needs one call and a typed answer.

    python benchmarks/bench_structured_output.py --tries 3

Clients (each try: one request; a pass is an instance of the client's type): openai SDK
``chat.completions.parse`` and ``responses.parse``, pydantic-ai ``NativeOutput`` and
``ToolOutput``, openai-agents ``output_type`` (Responses and chat models), and the same with
a tool of the client's (a pass then also needs the tool to have run).

Engines (``Agent.arun(output_type=Product)`` with a ``get_price`` tool): the embedded model,
and ``llama_cpp.server`` serving the same GGUF in ``hermes`` mode (with and without
``grammar``) and ``native`` mode (``chatml-function-calling``).
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
from pydantic import BaseModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "harness"))
from hermes_agent import Agent
from hermes_agent.demo_tools import demo_tools
from hermes_agent.loading import build_agent
from hermes_agent.models.openai import OpenAICompatible
from hermes_agent.server import ServiceSettings, create_app
from server_harness import free_port, serve

ASK = "A laptop costs 999.5 dollars. Give the product as JSON."
ASK_TOOL = "What is the price of a laptop? Use the price tool."


class Product(BaseModel):
    name: str
    price: float


def clients(url: str) -> dict[str, Callable[[], bool]]:
    import agents
    import pydantic_ai
    from agents import OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, function_tool
    from pydantic_ai import NativeOutput, ToolOutput
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    agents.set_tracing_disabled(True)
    sdk = openai.OpenAI(base_url=url, api_key="x", max_retries=0)

    def pai(output: Any, tool: bool) -> bool:
        model = OpenAIChatModel("hermes-agent", provider=OpenAIProvider(base_url=url, api_key="x"))
        agent = pydantic_ai.Agent(model, output_type=output)
        ran: list[str] = []

        def get_price(product: str) -> float:
            """The price of a product in dollars."""
            ran.append(product)
            return 999.5

        if tool:
            agent.tool_plain(get_price)
        out = agent.run_sync(ASK_TOOL if tool else ASK).output
        return isinstance(out, Product) and (bool(ran) or not tool)

    def oa(kind: str, tool: bool) -> bool:
        ran: list[str] = []

        @function_tool
        def get_price(product: str) -> float:
            """The price of a product in dollars."""
            ran.append(product)
            return 999.5

        cls = OpenAIResponsesModel if kind == "responses" else OpenAIChatCompletionsModel
        client = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0)
        agent = agents.Agent(
            name="shop",
            instructions="Answer in JSON.",
            tools=[get_price] if tool else [],
            model=cls(model="hermes-agent", openai_client=client),
            output_type=Product,
        )
        out = asyncio.run(Runner.run(agent, ASK_TOOL if tool else ASK)).final_output
        return isinstance(out, Product) and (bool(ran) or not tool)

    return {
        "openai chat json_schema": lambda: isinstance(
            sdk.chat.completions.parse(
                model="hermes-agent",
                messages=[{"role": "user", "content": ASK}],
                response_format=Product,
            )
            .choices[0]
            .message.parsed,
            Product,
        ),
        "openai responses json_schema": lambda: isinstance(
            sdk.responses.parse(model="hermes-agent", input=ASK, text_format=Product).output_parsed,
            Product,
        ),
        "pydantic-ai NativeOutput": lambda: pai(NativeOutput(Product), False),
        "pydantic-ai ToolOutput": lambda: pai(ToolOutput(Product), False),
        "openai-agents output_type (responses)": lambda: oa("responses", False),
        "openai-agents output_type (chat)": lambda: oa("chat", False),
        "pydantic-ai NativeOutput + tool": lambda: pai(NativeOutput(Product), True),
        "pydantic-ai ToolOutput + tool": lambda: pai(ToolOutput(Product), True),
        "openai-agents output_type + tool (responses)": lambda: oa("responses", True),
        "openai-agents output_type + tool (chat)": lambda: oa("chat", True),
    }


def measure_clients(tries: int) -> None:
    agent = build_agent(None, tools=demo_tools())
    with serve(create_app(agent=agent, settings=ServiceSettings(auth="none"))) as base:
        for name, attempt in clients(f"{base}/v1").items():
            passes, started = 0, time.perf_counter()
            for _ in range(tries):
                try:
                    passes += bool(attempt())
                except Exception as exc:  # a failure is a try that did not pass
                    print(f"  {name}: {type(exc).__name__}: {str(exc)[:160]}")
            spent = (time.perf_counter() - started) / tries
            print(f"{name}: {passes}/{tries} ({spent:.1f} s per try)", flush=True)
    agent.close()


@contextmanager
def llama_server(chat_format: str) -> Iterator[str]:
    port = free_port()
    command = [
        sys.executable, "-m", "hermes_agent", "llama-server", "--chat-format", chat_format,
        "--port", str(port), "--n-ctx", "2048", "--n-threads", "2",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        yield url
    finally:
        process.terminate()
        process.wait(10)


def measure_engine(name: str, make: Callable[[], Agent], tries: int) -> None:
    calls = typed = 0
    for _ in range(tries):
        agent = make()

        @agent.tool
        def get_price(product: str) -> float:
            """The price of a product in dollars."""
            return 999.5

        try:
            result = asyncio.run(agent.arun(ASK_TOOL, output_type=Product))
            calls += sum(
                1 for c in result.tool_calls if c.name == "get_price" and c.status_code == 200
            )
            typed += isinstance(result.data, Product)
        except Exception as exc:
            print(f"  {name}: {type(exc).__name__}: {str(exc)[:160]}")
    print(f"{name}: tool calls {calls}/{tries} expected, typed answers {typed}/{tries}", flush=True)


def measure_engines(tries: int) -> None:
    measure_engine("embedded", lambda: Agent(max_iterations=4), tries)
    for chat_format, modes in (
        ("chatml", ("hermes+grammar", "hermes")),
        ("chatml-function-calling", ("native",)),
    ):
        with llama_server(chat_format) as url:
            for mode in modes:

                def make(mode: str = mode, url: str = url) -> Agent:
                    model = OpenAICompatible(
                        "smollm2",
                        base_url=url,
                        mode="native" if mode == "native" else "hermes",
                        grammar=mode == "hermes+grammar",
                        max_tokens=128,
                        temperature=0.0,
                        timeout=120,
                        max_retries=0,
                    )
                    return Agent(model=model, max_iterations=4)

                measure_engine(f"llama_cpp.server {mode}", make, tries)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=3)
    parser.add_argument("--only", choices=["clients", "engines"])
    args = parser.parse_args()
    if args.only != "engines":
        measure_clients(args.tries)
    if args.only != "clients":
        measure_engines(args.tries)
