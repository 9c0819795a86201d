"""A conversation on the embedded model: what copying contexts aside saves an ``auto`` agent.

    python benchmarks/bench_embedded_conversation.py [--rounds 3] [--questions 8]

One conversation is what the pipeline does with a calculator tool and ``tool_choice="auto"``:
for each user question the model makes the call decision (scored on the ``auto`` rendering),
then, when it calls, is decoded on the ``required`` rendering; the tool's result goes back and
the model answers. The two renderings part at the end of the system prompt, so without the
context copies of ``LoadedModel.reuse_context`` every switch between them evaluated the whole
conversation after the system prompt again.

Two variants on the same loaded model, interleaved round by round so that noise from other work
falls on both alike: copies on (the default) and off (``_SNAPSHOT_MIN_TOKENS`` set out of
reach, which is the behaviour before them). Reported: the median wall-clock and CPU seconds of a
whole conversation, the tokens evaluated (prompt and generated, counted at ``Llama.eval``) and
the model turns. Greedy decoding; the two variants can still write different text, because
llama.cpp's numbers for a token evaluated alone differ slightly from those of the same token
evaluated in a batch (the copies keep the generated tokens as they were evaluated).
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import operator
import os
import platform
import statistics
import time
from typing import Any

from _common import code_version

from hermes_agent.models.base import ModelSettings
from hermes_agent.models.llamacpp import LlamaCpp
from hermes_agent.models.llamacpp import context as llama_context
from hermes_agent.protocol.prompts import openai_tool
from hermes_agent.types import Message, ToolResult

CALCULATOR = openai_tool(
    "calculator",
    "Evaluate an arithmetic expression with + - * / and parentheses.",
    {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "e.g. 17 * 23"}},
        "required": ["expression"],
        "additionalProperties": False,
    },
)
SYSTEM = (
    "You are the assistant of a small shop. Prices: apples 3 coins, pears 4 coins, plums 2 "
    "coins, cherries 7 coins, melons 11 coins. Use the calculator for every sum."
)


_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def calculate(expression: str) -> str:
    """The calculator: numbers, + - * / and parentheses (the model's text is untrusted: no
    power, no names, at most 200 characters); anything else is an error text for the model."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return float(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return float(_OPERATORS[type(node.op)](value(node.left), value(node.right)))
        raise ValueError("only numbers and + - * / ( ) are allowed")

    try:
        if len(expression) > 200:
            raise ValueError("the expression is longer than 200 characters")
        result = value(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as exc:
        return f"error: {exc}"
    return f"{result:g}"


async def conversation(model: LlamaCpp, questions: int) -> int:
    """Run the conversation; return the number of model turns."""
    messages = [Message(role="system", content=SYSTEM)]
    settings = ModelSettings(tool_choice="auto")
    turns = 0
    for index in range(questions):
        messages.append(
            Message(role="user", content=f"What do {index + 2} apples and {index + 3} pears cost?")
        )
        for _ in range(3):  # the pipeline's bound on steps, kept small
            response = await model.complete(messages, [CALCULATOR], settings)
            turns += 1
            calls = response.completion.tool_calls
            messages.append(
                Message(role="assistant", content=response.completion.content, tool_calls=calls)
            )
            if not calls:
                break
            results = [
                ToolResult(
                    call_id=call.id,
                    name=call.name,
                    content=calculate(str(call.arguments.get("expression", ""))),
                )
                for call in calls
            ]
            messages.append(Message(role="tool", tool_results=results))
    return turns


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = parser.parse_args()

    import llama_cpp

    evaluated = [0]
    eval_tokens = llama_cpp.Llama.eval

    def counting(self: Any, batch: Any) -> None:
        evaluated[0] += len(batch)
        eval_tokens(self, batch)

    llama_cpp.Llama.eval = counting  # type: ignore[method-assign]
    model = LlamaCpp(n_ctx=8192)
    minimum = llama_context._SNAPSHOT_MIN_TOKENS
    variants = {"copies on": minimum, "copies off": 10**9}
    samples: dict[str, list[tuple[float, float, int, int]]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, setting in variants.items():
            llama_context._SNAPSHOT_MIN_TOKENS = setting
            loaded = model._loaded()
            loaded.snapshots.clear()
            loaded.llm.n_tokens = 0  # every conversation starts from an empty context
            evaluated[0] = 0
            wall, cpu = time.perf_counter(), os.times()
            turns = asyncio.run(conversation(model, args.questions))
            after = os.times()
            cpu_s = after.user + after.system - cpu.user - cpu.system
            samples[name].append((time.perf_counter() - wall, cpu_s, evaluated[0], turns))
    llama_context._SNAPSHOT_MIN_TOKENS = minimum

    rows = {}
    for name, runs in samples.items():
        rows[name] = {
            "wall_s": statistics.median(run[0] for run in runs),
            "cpu_s": statistics.median(run[1] for run in runs),
            "tokens_evaluated": statistics.median(run[2] for run in runs),
            "model_turns": statistics.median(run[3] for run in runs),
        }
    print(
        f"{args.questions} questions, {args.rounds} rounds, medians; "
        f"{platform.machine()}, Python {platform.python_version()}, "
        f"{model.n_threads} thread(s), code {code_version()}\n"
    )
    print("| variant | wall s | CPU s | tokens evaluated | model turns |")
    print("|---|---:|---:|---:|---:|")
    for name, row in rows.items():
        print(
            f"| {name} | {row['wall_s']:.1f} | {row['cpu_s']:.1f} | "
            f"{row['tokens_evaluated']:,.0f} | {row['model_turns']:.0f} |"
        )
    on, off = rows["copies on"], rows["copies off"]
    print(
        f"\ncopies on / off: wall {on['wall_s'] / off['wall_s']:.2f}x, "
        f"CPU {on['cpu_s'] / off['cpu_s']:.2f}x, "
        f"tokens evaluated {on['tokens_evaluated'] / off['tokens_evaluated']:.2f}x"
    )
    if args.json:
        print(json.dumps({"rows": rows, "samples": samples}, indent=1))


if __name__ == "__main__":
    main()
