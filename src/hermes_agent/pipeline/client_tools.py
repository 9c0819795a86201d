"""Client tools: tools the caller declares and runs itself.

A front door that speaks a tool-calling protocol (the OpenAI-compatible facade) lets its
client bring its own tools. The runtime treats them as tools in every way but one: they are
shown to the model in the prompt, their calls are parsed and checked against the client's own
schema (a malformed or invalid call goes back to the model with the errors, as for any tool,
within ``max_retries``), and then — instead of running — a turn whose calls are all valid client
calls ends the run with them (``loop_status == "client_tool_calls"``; the records carry
``metadata["client"] = True`` and no result). The caller runs them and starts the next run with
their results as its input, in place of a user message (``ClientTurn.results``).

How a turn with client calls ends:

- every call valid and every call a client call: the run ends with them;
- some call refused (unknown tool, bad arguments, too many), or the agent's own tools called in
  the same turn: the client calls are not handed out (each gets a result saying why and to call
  it again), the agent's own valid calls run, and the model takes another turn — so a client
  never receives half of a turn that the model has to redo.

The declaration is part of the run's request (``runs.request.RunRequest.client``, plain
data, so it reaches the queue's workers too); the engine running the run passes it to
``agent.arun`` as ``client`` and the InputParser takes it up. In a program of your own::

    turn = ClientTurn(tools=[client_tool("lookup", "Find a word", schema)])
    result = await agent.arun("What does 'ubiquitous' mean?", client=turn)
    result.loop_status   # "client_tool_calls": result.tool_calls holds the calls to run
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hermes_agent.errors import HermesAgentError, ToolDefinitionError
from hermes_agent.pipeline.context import ClientTurn, RunContext, error_result
from hermes_agent.pipeline.status import Status
from hermes_agent.pipeline.structured import schema_budget_problem
from hermes_agent.tools.registry import Tool
from hermes_agent.types import ToolCallRecord, ToolResult

CLIENT_TOOLSET = "client"
"""The toolset client tools are put in (they are never in the agent's registry)."""
MAX_CLIENT_TOOLS = 128
"""How many tools one request may declare (as many as OpenAI accepts)."""
MAX_DESCRIPTION_CHARS = 4_000


def _not_run_here(**_: Any) -> Any:
    raise HermesAgentError("a client tool runs on the client's side, never in the agent")


def client_tool(name: str, description: str, parameters: Mapping[str, Any] | None) -> Tool:
    """A client tool from its OpenAI function declaration. The schema is the client's, so it is
    held to the same budgets as an output schema before anything compiles it; a schema that
    is too big is a ``ToolDefinitionError`` saying which. Its arguments are checked as against
    a caller's schema (``Tool.outside_schema``), which the gate compiles, and refuses, first."""
    schema = dict(parameters) if parameters is not None else {"type": "object", "properties": {}}
    problem = schema_budget_problem(schema)
    if problem is not None:
        raise ToolDefinitionError(
            f"tool {name!r}: " + problem.replace("output_schema", "its schema")
        )
    if len(description) > MAX_DESCRIPTION_CHARS:
        raise ToolDefinitionError(
            f"tool {name!r}: its description is {len(description)} characters long; "
            f"at most {MAX_DESCRIPTION_CHARS} are accepted"
        )
    return Tool(
        name=name,
        description=description,
        parameters=schema,
        function=_not_run_here,
        toolset=CLIENT_TOOLSET,
        outside_schema=True,  # compiled as a caller's schema, by the gate, off the event loop
    )


def take_up(ctx: RunContext, turn: ClientTurn) -> str | None:
    """Add the turn's tools to the run (what the InputParser does); the problem, if a client
    tool's name is one of the run's own tools."""
    clash = sorted(tool.name for tool in turn.tools if tool.name in ctx.tools)
    if clash:
        return (
            f"client tools {', '.join(map(repr, clash))} have the names of the agent's own "
            "tools; rename them"
        )
    for tool in turn.tools:
        ctx.tools[tool.name] = tool
    ctx.client_tools = frozenset(tool.name for tool in turn.tools)
    if turn.tool_choice is not None:
        ctx.settings.tool_choice = turn.tool_choice
    return None


def hand_over(ctx: RunContext) -> bool:
    """After the ToolSelector: end the run with this turn's client calls, when they are all
    there is and all valid (``True``); otherwise refuse them for this turn (see the module
    docstring) and let the loop go on (``False``)."""
    if not ctx.client_tools:
        return False
    client = [plan for plan in ctx.planned if plan.tool.name in ctx.client_tools]
    if not client:
        return False
    own = [plan for plan in ctx.planned if plan.tool.name not in ctx.client_tools]
    if not own and not ctx.rejected:
        records = [
            ToolCallRecord(
                plan.tool.name, plan.arguments, None, 200, None, plan.call.id, {"client": True}
            )
            for plan in client
        ]
        ctx.tool_calls.extend(records)
        ctx.steps[-1].tool_calls = list(records)
        ctx.loop_status = "client_tool_calls"
        ctx.finished = True
        return True
    why = (
        "other calls of this turn were refused"
        if ctx.rejected
        else "the agent's own tools were called in the same turn"
    )
    message = (
        f"this call was not sent, because {why}; once those are settled, call it again "
        "in a turn of its own"
    )
    for plan in client:
        refused: ToolResult = error_result(plan.call.id, plan.tool.name, Status.INVALID, message)
        ctx.rejected.append((plan.position, refused))
    ctx.planned = own
    return False
