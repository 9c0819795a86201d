"""Build an agent from a config file and a tools file, and ask it one question.

python examples/build_from_config.py "What's the weather in Paris?"
"""

import sys
from pathlib import Path

from hermes_agent import build_agent

here = Path(__file__).parent
agent = build_agent(here / "scripted_config.yaml", tools_files=[here / "eval_tools.py"])
result = agent.run(sys.argv[1] if len(sys.argv) > 1 else "What's the weather in Paris?")
for call in result.tool_calls:
    print(f"called {call.name}({call.arguments}) -> {call.result}")
print(result.output)
