"""Run an agent against any OpenAI-compatible server (vLLM, Ollama, llama.cpp server, ...).

    HERMES_BASE_URL=http://localhost:8000/v1 HERMES_MODEL=hermes-3 \
        python examples/openai_endpoint.py "What's the weather in Paris?"

HERMES_MODE picks ``hermes`` (default: Hermes prompt, parse the text) or ``native`` (send
``tools``, read ``tool_calls``).
"""

from __future__ import annotations

import os
import sys

from hermes_agent import Agent, OpenAICompatible


def build_agent() -> Agent:
    model = OpenAICompatible(
        os.environ.get("HERMES_MODEL", "hermes-3"),
        base_url=os.environ.get("HERMES_BASE_URL", "http://localhost:8000/v1"),
        mode=os.environ.get("HERMES_MODE", "hermes"),  # type: ignore[arg-type]
    )
    agent = Agent(model=model, system_prompt="Answer in one sentence.")

    @agent.tool
    def get_weather(city: str) -> dict:
        """Current weather for a city.

        Args:
            city: City name, e.g. Paris.
        """
        return {"city": city, "temperature": 21, "sky": "clear"}

    return agent


def main(question: str) -> int:
    result = build_agent().run(question)
    print(result.output)
    return 0 if result.status < 400 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "What's the weather in Paris?"))
