"""Structured output, measured: passes per try for each OpenAI client against a real
``hermes-agent serve`` with no config (embedded SmolLM2, demo tools, a key in
``.hermes/api-key``), and, per engine and mode, the tool calls made and the typed answers given
for a task that needs one call and a typed answer.

    python benchmarks/bench_structured_output.py --only clients --clients plain --tries 10
    python benchmarks/bench_structured_output.py --only clients --clients tool --tries 4
    python benchmarks/bench_structured_output.py --only engines --tries 4

Clients (each try: one request or one framework run; a pass is an instance of the client's
type): openai SDK ``chat.completions.parse`` and ``responses.parse``, pydantic-ai
``NativeOutput`` and ``ToolOutput``, openai-agents ``output_type`` (Responses and chat models),
and the same with a tool of the client's (``response_format`` + ``tools``: the tool's calls
and the typed answers are counted apart, and a pass needs both).

Engines (``Agent.arun(output_type=Product)`` with a ``get_price`` tool): the embedded model,
and ``llama_cpp.server`` serving the same GGUF in ``hermes`` mode (with and without
``grammar``) and ``native`` mode (``chatml-function-calling``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
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
from hermes_agent.models.openai import OpenAICompatible
from server_harness import free_port

PRICES = {"laptop": 999.5, "phone": 599.0, "desk": 250.0, "lamp": 35.5, "chair": 120.0}
"""One product per try, in turn: at temperature 0 the same request gets the same answer."""


def ask(try_: int) -> str:
    product = list(PRICES)[try_ % len(PRICES)]
    return f"A {product} costs {PRICES[product]} dollars. Give the product as JSON."


def ask_tool(try_: int) -> str:
    return f"What is the price of a {list(PRICES)[try_ % len(PRICES)]}? Use the price tool."


REQUEST_LIMIT = 8
"""pydantic-ai's requests per run (its own default is 50): a model that calls its tool over
and over fails the try in minutes rather than an hour."""


def price(product: str) -> float:
    return PRICES.get(product.strip().lower(), 100.0)


class Product(BaseModel):
    name: str
    price: float


Outcome = tuple[bool, int]
"""One try: whether the answer is an instance of the client's type, and how many times the
client's own tool ran (0 for the clients without one)."""


def clients(url: str, key: str) -> dict[str, Callable[[int], Outcome]]:
    import agents
    import pydantic_ai
    from agents import OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, function_tool
    from pydantic_ai import NativeOutput, ToolOutput
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.usage import UsageLimits

    agents.set_tracing_disabled(True)
    sdk = openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=300)

    def chat(n: int) -> Outcome:
        reply = sdk.chat.completions.parse(
            model="hermes-agent",
            messages=[{"role": "user", "content": ask(n)}],
            response_format=Product,
        )
        return isinstance(reply.choices[0].message.parsed, Product), 0

    def responses(n: int) -> Outcome:
        reply = sdk.responses.parse(model="hermes-agent", input=ask(n), text_format=Product)
        return isinstance(reply.output_parsed, Product), 0

    def pai(n: int, output: Any, tool: bool) -> Outcome:
        provider = OpenAIProvider(base_url=url, api_key=key)
        agent = pydantic_ai.Agent(
            OpenAIChatModel("hermes-agent", provider=provider), output_type=output
        )
        ran: list[str] = []

        def get_price(product: str) -> float:
            """The price of a product in dollars."""
            ran.append(product)
            return price(product)

        if tool:
            agent.tool_plain(get_price)
        limits = UsageLimits(request_limit=REQUEST_LIMIT)
        out = agent.run_sync(ask_tool(n) if tool else ask(n), usage_limits=limits).output
        return isinstance(out, Product), len(ran)

    def oa(n: int, kind: str, tool: bool) -> Outcome:
        ran: list[str] = []

        @function_tool
        def get_price(product: str) -> float:
            """The price of a product in dollars."""
            ran.append(product)
            return price(product)

        async def run() -> Any:
            cls = OpenAIResponsesModel if kind == "responses" else OpenAIChatCompletionsModel
            async with openai.AsyncOpenAI(
                base_url=url, api_key=key, max_retries=0, timeout=300
            ) as client:
                agent = agents.Agent(
                    name="shop",
                    instructions="Answer in JSON.",
                    tools=[get_price] if tool else [],
                    model=cls(model="hermes-agent", openai_client=client),
                    output_type=Product,
                )
                return (await Runner.run(agent, ask_tool(n) if tool else ask(n))).final_output

        return isinstance(asyncio.run(run()), Product), len(ran)

    return {
        "openai SDK chat.completions.parse (json_schema)": chat,
        "openai SDK responses.parse (text.format)": responses,
        "pydantic-ai NativeOutput": lambda n: pai(n, NativeOutput(Product), False),
        "pydantic-ai ToolOutput": lambda n: pai(n, ToolOutput(Product), False),
        "openai-agents output_type (Responses model)": lambda n: oa(n, "responses", False),
        "openai-agents output_type (chat model)": lambda n: oa(n, "chat", False),
        "pydantic-ai NativeOutput + tool": lambda n: pai(n, NativeOutput(Product), True),
        "pydantic-ai ToolOutput + tool": lambda n: pai(n, ToolOutput(Product), True),
        "openai-agents output_type + tool (Responses model)": lambda n: oa(n, "responses", True),
        "openai-agents output_type + tool (chat model)": lambda n: oa(n, "chat", True),
    }


@contextmanager
def hermes_serve() -> Iterator[tuple[str, str]]:
    """``hermes-agent serve`` with no config, in a fresh folder (its ``HOME`` too): its
    ``/v1`` URL once ``/readyz`` says 200, and the key it made for the user ``local``."""
    with tempfile.TemporaryDirectory(prefix="hermes-structured-") as folder:
        port = free_port()
        command = [sys.executable, "-m", "hermes_agent", "serve", "--port", str(port)]
        env = {k: v for k, v in os.environ.items() if k != "HERMES_DEBUG"}
        with (Path(folder) / "serve.log").open("wb") as log:
            process = subprocess.Popen(
                command, cwd=folder, env={**env, "HOME": folder}, stdout=log, stderr=log
            )
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 300
            while True:
                if process.poll() is not None:
                    raise RuntimeError((Path(folder) / "serve.log").read_text()[-2000:])
                try:
                    if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError("serve was not ready in 300 s")
                time.sleep(0.2)
            key = (Path(folder) / ".hermes" / "api-key").read_text().strip()
            yield f"{base}/v1", key
        finally:
            process.terminate()
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def measure_clients(tries: int, which: str) -> None:
    with hermes_serve() as (url, key):
        for name, attempt in clients(url, key).items():
            with_tool = "+ tool" in name
            if which != "all" and with_tool != (which == "tool"):
                continue
            passes = typed = called = 0
            started = time.perf_counter()
            for n in range(tries):
                try:
                    is_typed, ran = attempt(n)
                except Exception as exc:  # a failure is a try that did not pass
                    print(f"  {name}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                    continue
                typed += is_typed
                called += ran >= 1
                passes += is_typed and (ran >= 1 or not with_tool)
            spent = (time.perf_counter() - started) / tries
            detail = (
                f"; tool called in {called}/{tries}, typed {typed}/{tries}" if with_tool else ""
            )
            print(f"{name}: {passes}/{tries} passed{detail} ({spent:.1f} s per try)", flush=True)


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
        process.terminate()  # a server busy in a long completion may not stop at once
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def measure_engine(name: str, make: Callable[[], Agent], tries: int) -> None:
    """Each try: one run that needs one ``get_price`` call and a typed answer. Counted: the
    runs whose call ran (and all calls made), and the runs whose answer is a ``Product``."""
    called = calls = typed = 0
    for n in range(tries):
        agent = make()

        @agent.tool
        def get_price(product: str) -> float:
            """The price of a product in dollars."""
            return price(product)

        async def run(agent: Agent = agent, n: int = n) -> Any:
            try:
                return await agent.arun(ask_tool(n), output_type=Product)
            finally:
                await agent.close_connections()

        try:
            result = asyncio.run(run())
        except Exception as exc:
            print(f"  {name}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            continue
        made = [c for c in result.tool_calls if c.name == "get_price" and c.status_code == 200]
        called += bool(made)
        calls += len(made)
        typed += isinstance(result.data, Product)
        if not isinstance(result.data, Product):
            print(f"  {name}: {result.status} {result.loop_status}: {result.output[:160]!r}")
    print(
        f"{name}: runs that called {called}/{tries} (calls made {calls}), "
        f"typed answers {typed}/{tries}",
        flush=True,
    )


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
    parser.add_argument(
        "--clients",
        choices=["all", "plain", "tool"],
        default="all",
        help="plain: the clients alone; tool: with a tool of the client's",
    )
    args = parser.parse_args()
    if args.only != "engines":
        measure_clients(args.tries, args.clients)
    if args.only != "clients":
        measure_engines(args.tries)
