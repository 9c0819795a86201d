"""Unit tests: MCP input schemas made strict where that is safe (and kept as given where it is
not), MCP results as tool values, exception groups as one line."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hermes_agent.tools.mcp.schemas import is_strict, normalise
from hermes_agent.tools.registry import Tool


async def _nothing(**arguments: Any) -> Any:
    return arguments


def errors_for(schema: dict[str, Any], arguments: dict[str, Any]) -> list[str]:
    tool = Tool(name="t", description="", parameters=schema, function=_nothing)
    return tool.validate(arguments)[1]


def test_a_framework_schema_is_made_strict() -> None:
    given = {
        "type": "object",
        "title": "addArguments",
        "properties": {"a": {"title": "A", "type": "integer"}, "title": {"type": "string"}},
        "required": ["a"],
    }
    schema, notes = normalise(given)
    assert schema == {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "title": {"type": "string"}},
        "required": ["a"],
        "additionalProperties": False,
    }
    assert notes == ["added additionalProperties: false"]
    assert is_strict(schema) and not is_strict(given)
    assert given["title"] == "addArguments"  # the server's schema is not changed in place
    assert errors_for(schema, {"a": 1, "b": 2}) == ["unknown argument 'b' (allowed: a, title)"]
    assert errors_for(given, {"a": 1, "b": 2}) == []  # what the server itself would have said


def test_draft_07_spellings_and_references_become_one_2020_12_schema() -> None:
    given = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {
            "point": {"$ref": "#/definitions/Point"},
            "pair": {"type": "array", "items": [{"type": "string"}], "additionalItems": False},
            "ratio": {"type": "number", "minimum": 0, "exclusiveMinimum": True},
        },
        "definitions": {"Point": {"type": "object", "properties": {"x": {"type": "integer"}}}},
    }
    schema, notes = normalise(given)
    assert "$schema" not in schema and "definitions" not in schema
    assert schema["properties"]["point"] == {
        "type": "object",
        "properties": {"x": {"type": "integer"}},
    }
    assert schema["properties"]["pair"] == {
        "type": "array",
        "prefixItems": [{"type": "string"}],
        "items": False,
    }
    assert schema["properties"]["ratio"] == {"type": "number", "exclusiveMinimum": 0}
    assert notes == [
        "rewrote draft-07 keywords in their 2020-12 form",
        "inlined $ref definitions",
        "added additionalProperties: false",
    ]
    assert errors_for(schema, {"ratio": 0}) and not errors_for(schema, {"ratio": 0.5})
    assert errors_for(schema, {"pair": ["a", "b"]})  # no items beyond the first


@pytest.mark.parametrize(
    "given",
    [
        {"type": "object"},  # any arguments
        {"type": "object", "properties": {"a": {}}, "additionalProperties": True},
        {"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "string"}},
        {"type": "object", "properties": {"a": {}}, "patternProperties": {"^x_": {}}},
        {"type": "object", "properties": {"a": {}}, "anyOf": [{"required": ["a"]}, {}]},
    ],
)
def test_open_ended_schemas_are_validated_as_given(given: dict[str, Any]) -> None:
    schema, notes = normalise(given)
    assert "added additionalProperties: false" not in notes
    assert schema.get("additionalProperties") == given.get("additionalProperties")


def test_recursive_references_are_kept_and_still_validate() -> None:
    given = {
        "type": "object",
        "properties": {"tree": {"$ref": "#/$defs/Node"}},
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
            }
        },
    }
    schema, notes = normalise(given)
    assert schema["$defs"] == given["$defs"] and "inlined $ref definitions" not in notes
    assert errors_for(schema, {"tree": {"children": [{"children": 3}]}})
    assert not errors_for(schema, {"tree": {"children": [{"children": []}]}})


def test_non_strict_mode_and_missing_parts() -> None:
    assert normalise(None) == ({"type": "object"}, ["added type: object"])
    loose = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert normalise(loose, strict=False) == ({**loose, "required": []}, [])
    with pytest.raises(ValueError):
        normalise({"type": "object", "default": object()})


def test_results_become_tool_values() -> None:
    from mcp.types import (
        CallToolResult,
        EmbeddedResource,
        ImageContent,
        ResourceLink,
        TextContent,
        TextResourceContents,
    )

    from hermes_agent.tools.mcp.client import McpError, tool_result

    text = TextContent(type="text", text="hello")
    assert tool_result(CallToolResult(content=[text])) == "hello"
    data = TextContent(type="text", text='{\n  "n": [1, 2]\n}')
    assert tool_result(CallToolResult(content=[data])) == {"n": [1, 2]}
    broken = TextContent(type="text", text="[not json")
    assert tool_result(CallToolResult(content=[broken])) == "[not json"
    structured = CallToolResult(content=[text], structured_content={"n": 1})
    assert tool_result(structured) == {"n": 1}
    image = ImageContent(type="image", data="aGVsbG8h", mime_type="image/png")
    link = ResourceLink(type="resource_link", uri="file:///a.txt", name="a.txt")
    embedded = EmbeddedResource(
        type="resource", resource=TextResourceContents(uri="file:///b.txt", text="bee")
    )
    mixed = tool_result(CallToolResult(content=[text, image, link, embedded]))
    assert mixed == [
        "hello",
        {"type": "image", "mime_type": "image/png", "note": "6 bytes of image data, not shown"},
        {"type": "resource_link", "uri": "file:///a.txt", "name": "a.txt"},
        {"type": "resource", "uri": "file:///b.txt", "text": "bee"},
    ]
    failed = CallToolResult(content=[TextContent(type="text", text="no such city")], is_error=True)
    with pytest.raises(McpError, match="no such city"):
        tool_result(failed)


def test_exception_groups_become_one_line() -> None:
    from mcp import MCPError

    from hermes_agent.tools.mcp.client import describe

    nested = BaseExceptionGroup(
        "unhandled errors in a TaskGroup",
        [
            ExceptionGroup(
                "inner", [MCPError(-32000, "Connection closed"), ConnectionError("reset")]
            ),
            asyncio.CancelledError(),
            MCPError(-32000, "Connection closed"),
        ],
    )
    assert describe(nested) == "MCPError: Connection closed; ConnectionError: reset"
    assert describe(FileNotFoundError(2, "No such file or directory", "srv")) == (
        "FileNotFoundError: No such file or directory: srv"
    )
    assert describe(BaseExceptionGroup("x", [asyncio.CancelledError()])) == (
        "the connection was cancelled"
    )
