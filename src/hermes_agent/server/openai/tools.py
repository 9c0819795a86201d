"""The facade as a protocol adapter: OpenAI's client tools, tool calls, tool results and response
formats, mapped onto the runtime's own client tools (``pipeline.client_tools``) and structured
output (``pipeline.structured``), for ``/v1/chat/completions`` and ``/v1/responses`` alike.

- A client's ``tools`` become client tools of the run: the model sees them in its prompt (the
  Hermes ``<tools>`` block, or the endpoint's native tools), its calls are parsed by the
  project's parser and checked against the client's schema (an invalid call goes back to the
  model with the errors, within ``max_retries``), and a turn of valid calls ends the run with
  them: the client gets them as ``tool_calls`` (or ``function_call`` items) and runs them.
- The client's conversation (user turns, assistant turns with their calls, tool results) is
  read by one ``Conversation`` builder, whichever API it came through; a conversation that
  ends with tool results continues the run that asked for them.
- ``response_format`` (or the Responses API's ``text.format``) becomes the run's output schema:
  ``json_object`` any JSON object, ``json_schema`` the client's schema.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hermes_agent.errors import HermesAgentError, ToolDefinitionError
from hermes_agent.pipeline.client_tools import CLIENT_TOOLSET
from hermes_agent.server.openai.wire import OpenAIError, refuse
from hermes_agent.server.sse import to_json
from hermes_agent.tools.registry import Tool
from hermes_agent.types import Message, ToolCall, ToolResult

JSON_OBJECT = {"type": "object"}
"""The output schema of ``{"type": "json_object"}``: any JSON object."""


def client_tools(
    declared: Iterable[tuple[str, str | None, dict[str, Any] | None]], param: str
) -> list[Tool]:
    """The run's client tools from ``(name, description, parameters)`` declarations, read for
    their shape only: a 400 naming the entry for a bad name or a name given twice.

    The schema is carried as it came. Judging it (budgets, references, patterns, the
    metaschema) is the gate's, once for every door (a 422 saying why), in a worker thread: a
    schema as costly as the budgets allow takes a few hundred milliseconds to compile, which
    here, on the event loop, every other request would wait out."""
    tools: list[Tool] = []
    seen: set[str] = set()
    for index, (name, description, parameters) in enumerate(declared):
        where = f"{param}[{index}]"
        if name in seen:
            raise refuse(f"{where}: the tool {name!r} is declared twice", where, "invalid_value")
        seen.add(name)
        try:
            tools.append(
                Tool(
                    name=name,
                    description=description or "",
                    parameters=(
                        dict(parameters)
                        if parameters is not None
                        else {"type": "object", "properties": {}}  # as client_tool has it
                    ),
                    function=_declared_only,
                    toolset=CLIENT_TOOLSET,
                    outside_schema=True,  # nothing compiled here
                )
            )
        except ToolDefinitionError as exc:  # the name
            raise refuse(f"{where}: {exc}", where, "invalid_value") from None
    return tools


def _declared_only(**_: Any) -> Any:
    raise HermesAgentError("a declaration the facade carries to the gate; never called")


def output_schema(response_format: Mapping[str, Any] | None, param: str) -> dict[str, Any] | None:
    """The run's output schema for an OpenAI response format (``None``: plain text)."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return dict(JSON_OBJECT)
    if kind == "json_schema":
        # Chat nests it ({"json_schema": {"name", "schema"}}); Responses does not.
        spec = response_format.get("json_schema", response_format)
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if not isinstance(schema, Mapping):
            raise refuse(
                "a json_schema response format needs its 'schema' (a JSON Schema object)",
                param,
                "invalid_value",
            )
        return dict(schema)
    raise refuse(
        f"response format {kind!r} is not served; use text, json_object or json_schema",
        param,
        "invalid_value",
    )


def tool_choice_name(choice: str | dict[str, Any] | None, *, nested: bool = True) -> str | None:
    """``tool_choice`` as the run takes it: a mode, or the name of the tool it forces. Chat
    nests the name (``{"type": "function", "function": {"name": ...}}``); Responses does not
    (``nested=False``: ``{"type": "function", "name": ...}``)."""
    if choice is None or isinstance(choice, str):
        if choice not in (None, "auto", "none", "required"):
            raise refuse(
                "tool_choice must be 'auto', 'none', 'required' or an object naming one tool",
                "tool_choice",
                "invalid_value",
            )
        return choice
    function = choice.get("function") if nested else choice
    name = function.get("name") if isinstance(function, dict) else None
    if choice.get("type") != "function" or not isinstance(name, str) or not name:
        shape = "{'function': {'name': ...}}" if nested else "'name': ..."
        raise refuse(
            f"tool_choice as an object must be {{'type': 'function', {shape}}}",
            "tool_choice",
            "invalid_value",
        )
    return name


def arguments_of(text: str, param: str) -> dict[str, Any]:
    """A call's arguments from the JSON text a client sends back (what the facade gave it)."""
    try:
        value = json.loads(text) if text.strip() else {}
    except (json.JSONDecodeError, RecursionError):
        raise refuse(f"{param} is not valid JSON", param, "invalid_value") from None
    if not isinstance(value, dict):
        raise refuse(f"{param} must be a JSON object", param, "invalid_value")
    return value


@dataclass(slots=True)
class Conversation:
    """A client's conversation, read: what comes before this run, and the run's input — the
    user's message, or the results of the calls the previous run handed out."""

    history: list[Message]
    message: str = ""
    results: list[ToolResult] = field(default_factory=list)

    @property
    def continues(self) -> bool:
        """The input is tool results: the run goes on from the calls it handed out."""
        return bool(self.results)

    def input_text(self) -> str:
        """The run's message as the gate measures it and the trail records it: the user's
        text, or the results as JSON."""
        if not self.results:
            return self.message
        return to_json(
            [
                {"call_id": r.call_id, "name": r.name, "output": r.content["data"]}
                for r in self.results
            ]
        )


class ConversationBuilder:
    """Reads a client's conversation in order. Turns of one role are joined (as the facade
    always did: many chat templates refuse two user turns in a row); an assistant's calls join
    its turn; results join one ``tool`` turn and must answer calls made before them."""

    def __init__(self, prior: Sequence[Message] = ()) -> None:
        """``prior``: turns the conversation continues (a stored session), which the results
        in it may answer."""
        self.messages: list[Message] = list(prior)
        self._calls: dict[str, str] = {}  # call id → tool name, for the results
        for message in self.messages:
            for call in message.tool_calls:
                self._calls[call.id] = call.name

    def user(self, text: str) -> None:
        self._text("user", text)

    def assistant(self, text: str) -> None:
        if text:
            self._text("assistant", text)

    def call(self, call_id: str, name: str, arguments: dict[str, Any], param: str) -> None:
        if not call_id:
            raise refuse(f"{param} has no call id", param, "invalid_value")
        last = self.messages[-1] if self.messages else None
        if last is None or last.role != "assistant":
            last = Message("assistant", "")
            self.messages.append(last)
        last.tool_calls.append(ToolCall(name, arguments, call_id))
        self._calls[call_id] = name

    def result(self, call_id: str | None, output: str, param: str) -> None:
        name = self._calls.get(call_id or "")
        if name is None:
            raise refuse(
                f"{param} answers the call {call_id!r}, which no earlier assistant turn made",
                param,
                "invalid_value",
            )
        result = ToolResult(
            call_id or "", name, {"status": "success", "data": output, "error": None}
        )
        last = self.messages[-1] if self.messages else None
        if last is not None and last.role == "tool":
            last.tool_results.append(result)
        else:
            self.messages.append(Message("tool", tool_results=[result]))

    def _text(self, role: str, text: str) -> None:
        last = self.messages[-1] if self.messages else None
        if last is not None and last.role == role and not last.tool_calls:
            last.content += "\n\n" + text
        else:
            self.messages.append(Message(role, text))  # type: ignore[arg-type]

    def finish(self, param: str) -> Conversation:
        """The conversation, ending with the run's input (a 400 when it ends otherwise)."""
        last = self.messages[-1] if self.messages else None
        if last is not None and last.role == "user" and last.content.strip():
            return Conversation(self.messages[:-1], message=last.content)
        if last is not None and last.role == "tool":
            asked = self.messages[-2] if len(self.messages) > 1 else None
            wanted = {call.id for call in asked.tool_calls} if asked is not None else set()
            given = {result.call_id for result in last.tool_results}
            if wanted != given:
                missing = ", ".join(sorted(wanted - given)) or "(none)"
                raise refuse(
                    "the tool results must answer every call of the assistant turn before "
                    f"them, and only those; missing: {missing}",
                    param,
                    "invalid_value",
                )
            return Conversation(self.messages[:-1], results=list(last.tool_results))
        raise OpenAIError(
            400,
            "the conversation must end with the user's message (with text) or with the results "
            "of the tool calls the agent asked for: that is what the agent answers",
            param=param,
            code="invalid_value",
        )


def handed_out(result: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The client calls a run ended with (``id``, ``name``, ``arguments``)."""
    return [
        {"id": call.get("id", ""), "name": call["name"], "arguments": call["arguments"]}
        for call in (result or {}).get("tool_calls", [])
        if (call.get("metadata") or {}).get("client")
    ]


def ran_here(result: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    """The calls the agent ran itself (the ``hermes`` extension lists them)."""
    return [
        call
        for call in (result or {}).get("tool_calls", [])
        if not (call.get("metadata") or {}).get("client")
    ]


def chat_tool_calls(calls: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Handed-out calls as a chat message's ``tool_calls``."""
    return [
        {
            "id": call["id"],
            "type": "function",
            "function": {"name": call["name"], "arguments": to_json(call["arguments"])},
        }
        for call in calls
    ]
