"""A server's request for input (an MCP elicitation), put to the agent's approver as an
approval of a call of ``ELICITATION_TOOL``."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hermes_agent.tools.registry import Tool
from hermes_agent.types import ToolCall

if TYPE_CHECKING:
    from mcp.types import ElicitRequestParams, ElicitResult

Approver = Callable[[ToolCall, Tool], object]
"""An agent's approver (``Agent.approver``): a bool, a ``(bool, reason)`` pair, or an awaitable
of one."""

ELICITATION_TOOL = "mcp_elicitation"
"""The name of the tool an elicitation is put to the approver as (with the call
``<server>.elicitation``): ``arguments`` are the server's ``message`` and the ``answer`` that
approving it sends."""


async def answer_elicitation(
    server: str, approver: Approver, params: ElicitRequestParams
) -> ElicitResult:
    """A server's request for input, answered through the agent's approval path: the answer is
    the defaults its form declares (every field the form requires must have one), and the
    approver, asked as for a call of ``ELICITATION_TOOL``, decides whether it is sent (accept)
    or not (decline). A form that requires a field without a default, or a URL to open, is
    declined without asking: nobody here can fill a form in or open a page."""
    from mcp.types import ElicitRequestFormParams, ElicitResult

    if not isinstance(params, ElicitRequestFormParams):
        return ElicitResult(action="decline")
    schema = params.requested_schema
    fields: dict[str, Any] = dict(schema.get("properties") or {})
    answer = {
        name: spec["default"]
        for name, spec in fields.items()
        if isinstance(spec, dict) and "default" in spec
    }
    if any(name not in answer for name in schema.get("required") or []):
        return ElicitResult(action="decline")
    call = ToolCall(
        name=ELICITATION_TOOL,
        arguments={"server": server, "message": params.message, "answer": answer},
    )
    decision: Any = await asyncio.to_thread(approver, call, _elicitation_tool())
    if inspect.isawaitable(decision):
        decision = await decision
    approved = bool(decision[0]) if isinstance(decision, tuple) else bool(decision)
    if not approved:
        return ElicitResult(action="decline")
    return ElicitResult(action="accept", content=answer)


def _elicitation_tool() -> Tool:
    def mcp_elicitation(server: str, message: str, answer: dict[str, Any]) -> None:
        """An MCP server asks for input; approving sends the answer shown."""

    return Tool.from_function(mcp_elicitation, name=ELICITATION_TOOL, requires_approval=True)
