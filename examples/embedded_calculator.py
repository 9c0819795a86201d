"""Ask the embedded model (offline) a question it answers with a tool.

python examples/embedded_calculator.py "What is 12 * 12?"
"""

from __future__ import annotations

import sys

from hermes_agent import Agent
from hermes_agent.demo_tools import calculator


def main(question: str) -> int:
    agent = Agent(tools=[calculator])  # no model given: the embedded SmolLM2 model
    result = agent.run(question, tool_choice="required")
    for call in result.tool_calls:
        print(f"called {call.name}({call.arguments}) -> {call.result}")
    print(result.output)
    return 0 if result.status < 400 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "What is 12 * 12?"))
