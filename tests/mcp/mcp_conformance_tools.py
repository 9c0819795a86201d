"""The tools the MCP conformance suite's server scenarios call, written as a tool author writes
tools (``hermes-agent mcp serve --tools mcp_conformance_tools.py``): test_mcp_conformance.py.

Each does what its scenario asks of a server's tool and nothing more: a tool that asks its
caller for input asks with ``ask_caller`` (or ``asking.ask``, for the whole answer), its
caller's model with ``sample_caller``, its roots with ``list_caller_roots``, and one that logs
uses Python's ``logging``. The suite's other fixtures (resources, prompts, completions) have
no counterpart here: the agent's MCP server serves tools only (the baseline says so, scenario
by scenario).
"""

from __future__ import annotations

import asyncio
import base64
import logging
from typing import Any

from hermes_agent import tool
from hermes_agent.mcp import CallerCannotAnswer, ask_caller, list_caller_roots, sample_caller
from hermes_agent.mcp.asking import Question, ask
from hermes_agent.tools.mcp import Audio, Content, Image, Resource, report_progress

log = logging.getLogger("conformance.tools")
log.setLevel(logging.DEBUG)  # its info lines are meant for its callers

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)
"""A 1x1 PNG."""
WAV = (
    b"RIFF$\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00"
    b"@\x1f\x00\x00@\x1f\x00\x00\x01\x00\x08\x00data\x00\x00\x00\x00"
)
"""An empty 8 kHz mono WAV."""
RESOURCE_URI = "test://embedded-resource"


@tool
def test_simple_text() -> str:
    """Answer with a short text."""
    return "This is a simple text response for testing."


@tool
def test_error_handling() -> str:
    """Fail, always."""
    raise RuntimeError("This tool intentionally returns an error for testing")


@tool
def test_image_content() -> Content:
    """Answer with an image."""
    return Content(Image(PNG, "image/png"))


@tool
def test_audio_content() -> Content:
    """Answer with a sound."""
    return Content(Audio(WAV, "audio/wav"))


@tool
def test_embedded_resource() -> Content:
    """Answer with an embedded resource."""
    return Content(Resource(RESOURCE_URI, "text/plain", text="This is an embedded resource."))


@tool
def test_multiple_content_types() -> Content:
    """Answer with a text, an image and a resource."""
    resource = Resource(RESOURCE_URI, "application/json", text='{"test": "data", "value": 123}')
    return Content("Multiple content types test:", Image(PNG, "image/png"), resource)


@tool
async def test_tool_with_progress() -> str:
    """Report progress three times, then answer."""
    for done in (0, 50, 100):
        report_progress(done, 100, f"{done}% done")
    return "progress reported"


@tool
async def test_tool_with_logging() -> str:
    """Log three lines while running, then answer."""
    log.info("Tool execution started")
    log.info("Tool processing data")
    log.info("Tool execution completed")
    return "logged three lines"


@tool
async def test_logging_tool() -> str:
    """Log a line, then answer."""
    log.info("a line for callers that asked for log messages")
    return "logged a line"


def _form(required: list[str], **fields: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": fields, "required": required}


async def _completed(message: str, schema: dict[str, Any]) -> str:
    answer = await ask(Question(message, schema))
    return f"Elicitation completed: action={answer.action}, content={answer.content}"


@tool
async def test_elicitation(message: str) -> str:
    """Ask the caller for a name and an email address.

    Args:
        message: What to show the caller.
    """
    schema = _form(
        ["username", "email"],
        username={"type": "string", "description": "User's response"},
        email={"type": "string", "description": "User's email address"},
    )
    answer = await ask(Question(message, schema))
    return f"User response: action={answer.action}, content={answer.content}"


@tool
async def test_elicitation_sep1034_defaults() -> str:
    """Ask the caller with a form whose every field has a default."""
    schema = _form(
        [],
        name={"type": "string", "default": "John Doe"},
        age={"type": "integer", "default": 30},
        score={"type": "number", "default": 95.5},
        status={"type": "string", "enum": ["active", "inactive", "pending"], "default": "active"},
        verified={"type": "boolean", "default": True},
    )
    return await _completed("Please review your details", schema)


@tool
async def test_elicitation_sep1330_enums() -> str:
    """Ask the caller with a form of every kind of choice."""
    options = ["option1", "option2", "option3"]
    schema = _form(
        [],
        untitledSingle={"type": "string", "enum": options},
        titledSingle={
            "type": "string",
            "oneOf": [
                {"const": "value1", "title": "First Option"},
                {"const": "value2", "title": "Second Option"},
            ],
        },
        legacyEnum={
            "type": "string",
            "enum": ["opt1", "opt2", "opt3"],
            "enumNames": ["Option One", "Option Two", "Option Three"],
        },
        untitledMulti={"type": "array", "items": {"type": "string", "enum": options}},
        titledMulti={
            "type": "array",
            "items": {
                "anyOf": [
                    {"const": "value1", "title": "First Choice"},
                    {"const": "value2", "title": "Second Choice"},
                ]
            },
        },
    )
    return await _completed("Please choose", schema)


NAME = _form(["name"], name={"type": "string"})
OK = _form(["ok"], ok={"type": "boolean"})


@tool
async def test_input_required_result_elicitation() -> str:
    """Ask the caller's name and greet it."""
    answer = await ask_caller("What is your name?", NAME, key="user_name")
    return f"Hello, {answer['name']}!" if answer else "No name given."


@tool
async def test_input_required_result_request_state() -> str:
    """Ask the caller to confirm."""
    answer = await ask_caller("Please confirm", OK, key="confirm")
    return "state-ok: confirmed" if answer and answer.get("ok") else "state-ok: not confirmed"


@tool
async def test_input_required_result_tampered_state() -> str:
    """Ask the caller to confirm (what a tampered answer must never reach)."""
    answer = await ask_caller("Please confirm", OK, key="confirm")
    return "confirmed" if answer and answer.get("ok") else "not confirmed"


@tool
async def test_input_required_result_multi_round() -> str:
    """Ask the caller two things, one after the other."""
    name = await ask_caller("Step 1: What is your name?", NAME, key="step1")
    color_form = _form(["color"], color={"type": "string"})
    color = await ask_caller("Step 2: What is your favorite color?", color_form, key="step2")
    return f"{(name or {}).get('name')} likes {(color or {}).get('color')}"


@tool
async def test_streaming_elicitation() -> str:
    """Ask the caller for a name (never by a request of the server's own at 2026-07-28)."""
    answer = await ask_caller("What is your name?", NAME, key="user_name")
    return f"Hello, {answer['name']}!" if answer else "No name given."


@tool
async def test_sampling(prompt: str) -> str:
    """Ask the caller's model to answer a prompt.

    Args:
        prompt: What to ask the caller's model.
    """
    reply = await sample_caller(prompt, max_tokens=100)
    return f"LLM response: {reply}" if reply is not None else "The caller's model declined."


@tool
async def test_missing_capability() -> str:
    """Ask the caller's model (a caller that declared no sampling cannot be served)."""
    reply = await sample_caller("Say hello.", max_tokens=20)
    return f"LLM response: {reply}"


@tool
async def test_input_required_result_sampling() -> str:
    """Ask the caller's model a question."""
    reply = await sample_caller(
        "What is the capital of France?", max_tokens=100, key="capital_question"
    )
    return f"The caller's model says: {reply}"


@tool
async def test_input_required_result_list_roots() -> str:
    """List the caller's roots."""
    roots = await list_caller_roots(key="client_roots")
    return "Roots: " + ", ".join(root["uri"] for root in roots)


@tool
async def test_input_required_result_multiple_inputs() -> str:
    """Ask the caller a name, its model a greeting and its roots, all at once."""
    name, greeting, roots = await asyncio.gather(
        ask_caller("What is your name?", NAME, key="user_name"),
        sample_caller("Generate a greeting", max_tokens=50, key="greeting"),
        list_caller_roots(key="client_roots"),
    )
    return f"{greeting} {(name or {}).get('name')} ({len(roots)} roots)"


@tool
async def test_input_required_result_capabilities() -> str:
    """Ask the caller's name, else its model for one: whichever its client can answer."""
    try:
        answer = await ask_caller("What is your name?", NAME, key="user_name")
        return f"Hello, {(answer or {}).get('name')}!"
    except CallerCannotAnswer:
        reply = await sample_caller("Suggest a name.", max_tokens=20, key="suggested_name")
        return f"Hello, {reply}!"
