"""The service that docs/service.md's examples talk to, to run them as written.

    python examples/service_docs.py                 # http://127.0.0.1:8000, keys in .hermes/
    KEY=$(hermes-agent keys create --user alice)     # in another terminal, same folder

Its model is scripted, so that the page's answers are exactly what you see: "What is A op B?"
is answered with the demo ``calculator`` tool, "Delete NAME" with a ``delete_file`` tool that
needs approval (it deletes nothing), anything else with "Hello!". The embedded model (``hermes-agent
serve``) runs the arithmetic examples too, in words of its own; it has no tool that asks for
approval, and a 135M model does not reliably call one, so the approval flows need this service.

Sessions, the audit trail and the keys live in ``.hermes/state.db`` as with ``hermes-agent
serve``; ``--port`` picks another port.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from typing import Any

from hermes_agent import Agent, Message, ScriptedModel, Tool
from hermes_agent.demo_tools import demo_tools
from hermes_agent.storage import DEFAULT_URL


def _call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def docs_script(messages: Sequence[Message], _tools: Sequence[dict[str, Any]]) -> str:
    """The page's model: a call for the two requests it knows, then an answer from the result."""
    last = max(i for i, m in enumerate(messages) if m.role == "user")
    user = str(messages[last].content).strip()
    results = [r for m in messages[last:] if m.role == "tool" for r in m.tool_results]
    arithmetic = re.fullmatch(r"What is (.+)\?", user)
    delete = re.fullmatch(r"Delete (\S+)", user)
    if arithmetic and not results:
        return _call("calculator", expression=arithmetic.group(1))
    if arithmetic:
        return f"{arithmetic.group(1)} = {results[0].content['data']}"
    if delete and not results:
        return _call("delete_file", path=delete.group(1))
    if delete and results[0].content.get("error"):
        return f"I did not delete {delete.group(1)}: {results[0].content['error']}"
    if delete:
        return f"Deleted {delete.group(1)}."
    return "Hello!"


def delete_file(path: str) -> str:
    """Delete a file (this one only says it did)."""
    return f"deleted {path}"


def docs_agent(storage: str = DEFAULT_URL) -> Agent:
    agent = Agent(model=ScriptedModel(docs_script, chunk_size=6), storage=storage)
    for tool in demo_tools():
        agent.add_tool(tool)
    agent.add_tool(Tool.from_function(delete_file, requires_approval=True))
    return agent


def main() -> None:
    import uvicorn

    from hermes_agent.server import ServiceSettings, create_app, open_key_store

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8000)
    port = parser.parse_args().port
    settings = ServiceSettings(port=port, keys_url=DEFAULT_URL)
    app = create_app(agent=docs_agent(), settings=settings, keys=open_key_store(settings.keys_url))
    print(f"docs/service.md's service on http://127.0.0.1:{port}", flush=True)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
