"""A tool asks its caller's model for a completion (``sample_caller``) and its caller's roots
(``list_caller_roots``), at each revision: on a 2025-11-25 session by a request of the server's
own, at 2026-07-28 by an input-required result the retry answers. A caller whose client
declared no sampling cannot answer (``CallerCannotAnswer``; at 2026-07-28 the protocol's
``-32021``). A real ``hermes-agent mcp serve --transport http`` on loopback, driven by the
SDK's client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from mcp import Client, MCPError
from mcp.types import CreateMessageRequestParams, CreateMessageResult, ListRootsResult, Root

from mcp_project import make_project
from test_mcp_server import HttpServer, api_key

SAMPLING_TOOLS = '''

from hermes_agent.mcp import CallerCannotAnswer, list_caller_roots, sample_caller


@tool
async def capital() -> str:
    """Ask the caller's model for a capital."""
    try:
        reply = await sample_caller(
            "What is the capital of France?", max_tokens=30, system="Be brief.", key="capital"
        )
    except CallerCannotAnswer as exc:
        return f"nobody to ask: {exc.capability}"
    return f"the caller's model says: {reply}"


@tool
async def needs_a_model() -> str:
    """Ask the caller's model, and fail without one."""
    return str(await sample_caller("Hello?", max_tokens=10))


@tool
async def roots() -> str:
    """List the caller's roots."""
    return " ".join(root["uri"] for root in await list_caller_roots())


@tool(cache_ttl=600)
async def cached_roots() -> str:
    """List the caller's roots (a cached tool: never for another caller)."""
    return " ".join(root["uri"] for root in await list_caller_roots())


@tool
async def model_or_bust() -> str:
    """Ask the caller's model; without one, fail for another reason."""
    try:
        return str(await sample_caller("Hello?", max_tokens=10))
    except CallerCannotAnswer:
        raise RuntimeError("no model to ask, and no other way") from None


@tool
async def malformed() -> str:
    """Ask the caller's model with a message MCP cannot carry."""
    try:
        await sample_caller([{"role": "user", "content": {"type": "text"}}], max_tokens=5)
    except ValueError as exc:
        return "refused before asking: " + str(exc).split(":")[0]
    return "asked"
'''


def sampling_project(tmp_path: Path, scripted: str | None = None) -> Path:
    """``make_project`` with the tools above; ``scripted``: the model's turns (YAML)."""
    project = make_project(tmp_path)
    with (project / "tools.py").open("a", encoding="utf-8") as tools:
        tools.write(SAMPLING_TOOLS)
    if scripted is not None:
        config = (project / "config.yaml").read_text(encoding="utf-8")
        config = config.replace('["The answer is 42.", "Still 42."]', scripted)
        (project / "config.yaml").write_text(config, encoding="utf-8")
    return project


@pytest.fixture
def server(tmp_path: Path) -> Iterator[HttpServer]:
    with HttpServer(sampling_project(tmp_path)) as served:
        yield served


def client(url: str, key: str, *, answering: bool, mode: str, root: str = "file:///work") -> Client:
    """The SDK's client for the key's user: with ``answering`` its model says "Paris" to every
    sampling request (the prompts it saw kept in ``sampled``) and its roots are one folder,
    ``root``; without, it declares neither sampling nor roots."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    sampled: list[tuple[str | None, str]] = []

    async def sample(_context: Any, params: CreateMessageRequestParams) -> CreateMessageResult:
        content = params.messages[0].content
        sampled.append((params.system_prompt, getattr(content, "text", "")))
        reply = {"type": "text", "text": "Paris"}
        return CreateMessageResult(role="assistant", content=reply, model="m")  # type: ignore[arg-type]

    async def list_roots(_context: Any) -> ListRootsResult:
        return ListRootsResult(roots=[Root(uri=root, name="work")])  # type: ignore[arg-type]

    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=30)
    made = Client(
        streamable_http_client(url, http_client=http),
        read_timeout_seconds=30,
        sampling_callback=sample if answering else None,
        list_roots_callback=list_roots if answering else None,
        mode=mode,  # type: ignore[arg-type]
    )
    made.sampled = sampled  # type: ignore[attr-defined]
    return made


def run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, 120))


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_a_tool_asks_its_callers_model_and_roots(server: HttpServer, mode: str) -> None:
    key = api_key(server.project, "ada")

    async def main() -> tuple[Any, Any, list[tuple[str | None, str]]]:
        async with client(server.url, key, answering=True, mode=mode) as caller:
            said = await caller.call_tool("capital", {})
            listed = await caller.call_tool("roots", {})
        return said, listed, caller.sampled  # type: ignore[attr-defined]

    said, listed, sampled = run(main())
    assert not said.is_error and said.content[0].text == "the caller's model says: Paris"
    assert sampled == [("Be brief.", "What is the capital of France?")]
    assert not listed.is_error and listed.content[0].text == "file:///work"


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_a_caller_without_sampling_cannot_answer(server: HttpServer, mode: str) -> None:
    key = api_key(server.project, "ada")

    async def main() -> tuple[Any, Any]:
        async with client(server.url, key, answering=False, mode=mode) as caller:
            caught = await caller.call_tool("capital", {})  # the tool catches the refusal
            try:
                failed: Any = await caller.call_tool("needs_a_model", {})
            except MCPError as exc:
                failed = exc
        return caught, failed

    caught, failed = run(main())
    assert not caught.is_error and caught.content[0].text == "nobody to ask: sampling"
    if mode == "legacy":  # an error result the caller's model reads
        assert failed.is_error and "CallerCannotAnswer" in failed.content[0].text
    else:  # at 2026-07-28: the protocol's missing-capability error, naming sampling
        assert isinstance(failed, MCPError) and failed.error.code == -32021
        assert failed.error.data == {"requiredCapabilities": {"sampling": {}}}


def test_questions_asked_together_go_out_in_one_input_required_result() -> None:
    from mcp.types import CallToolResult, InputRequiredResult, TextContent

    from hermes_agent.mcp.asking import Question, Roots, Sampling
    from hermes_agent.mcp.input_required import Exchange, Exchanges

    async def main() -> None:
        exchanges = Exchanges()

        async def call(exchange: Exchange) -> CallToolResult:
            text = {"role": "user", "content": {"type": "text", "text": "Hi"}}
            name, reply, roots = await asyncio.gather(
                exchange.ask(Question("Name?", {"type": "object"}, "name")),
                exchange.ask(Sampling((text,), 5, key="reply")),
                exchange.ask(Roots("roots")),
            )
            said = f"{name.content['name']} {reply.content['content']['text']} {roots.content}"
            return CallToolResult(content=[TextContent(type="text", text=said)])

        first = await exchanges.start("ada", call)
        assert isinstance(first, InputRequiredResult)
        requests = first.model_dump(by_alias=True, exclude_none=True)["inputRequests"]
        assert {key: r["method"] for key, r in requests.items()} == {
            "name": "elicitation/create",
            "reply": "sampling/createMessage",
            "roots": "roots/list",
        }
        assert requests["reply"]["params"]["maxTokens"] == 5
        responses = {
            "name": {"action": "accept", "content": {"name": "Ada"}},
            "reply": {"role": "assistant", "content": {"type": "text", "text": "hi"}, "model": "m"},
            "roots": {"roots": [{"uri": "file:///w"}]},
        }
        done = await exchanges.resume("ada", str(first.request_state), responses)
        assert isinstance(done, CallToolResult)
        assert done.content[0].text == "Ada hi {'roots': [{'uri': 'file:///w'}]}"  # type: ignore[union-attr]

    asyncio.run(main())


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_a_cached_tool_never_hands_one_callers_roots_to_another(
    server: HttpServer, mode: str
) -> None:
    keys = [api_key(server.project, user) for user in ("ada", "bob")]

    async def main() -> list[str]:
        seen = []
        for key, root in zip(keys, ("file:///ada", "file:///bob"), strict=True):
            async with client(server.url, key, answering=True, mode=mode, root=root) as caller:
                seen.append((await caller.call_tool("cached_roots", {})).content[0].text)
        return seen

    assert run(main()) == ["file:///ada", "file:///bob"]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_a_refusal_the_tool_caught_is_not_a_missing_capability(
    server: HttpServer, mode: str
) -> None:
    """The tool caught ``CallerCannotAnswer`` and failed for a reason of its own: an error
    result the caller's model reads, at every revision, never ``-32021``. A request MCP
    cannot carry is refused in the tool before anyone is asked."""
    key = api_key(server.project, "ada")

    async def main() -> tuple[Any, Any]:
        async with client(server.url, key, answering=False, mode=mode) as unable:
            failed = await unable.call_tool("model_or_bust", {})
        async with client(server.url, key, answering=True, mode=mode) as able:
            refused = await able.call_tool("malformed", {})
        return failed, refused

    failed, refused = run(main())
    assert failed.is_error and "RuntimeError: no model to ask" in failed.content[0].text
    assert refused.content[0].text == "refused before asking: sampling/createMessage"


def test_a_state_answered_already_is_refused_while_the_call_goes_on() -> None:
    from mcp.types import CallToolResult, InputRequiredResult, TextContent

    from hermes_agent.mcp.asking import Roots
    from hermes_agent.mcp.input_required import Exchange, Exchanges, StateRefused

    async def main() -> None:
        exchanges, going_on = Exchanges(), asyncio.Event()

        async def call(exchange: Exchange) -> CallToolResult:
            await exchange.ask(Roots("roots"))
            await going_on.wait()  # answered: the call works on
            return CallToolResult(content=[TextContent(type="text", text="done")])

        first = await exchanges.start("ada", call)
        assert isinstance(first, InputRequiredResult)
        state, responses = str(first.request_state), {"roots": {"roots": []}}
        retry = asyncio.ensure_future(exchanges.resume("ada", state, responses))
        await asyncio.sleep(0)  # the retry's answer is in; its call has not ended
        with pytest.raises(StateRefused, match="answered already"):
            await exchanges.resume("ada", state, responses)
        going_on.set()
        done = await retry
        assert isinstance(done, CallToolResult) and done.content[0].text == "done"  # type: ignore[union-attr]

    asyncio.run(main())


def test_an_ask_runs_own_tools_cannot_ask_the_caller(tmp_path: Path) -> None:
    """A run of the agent's own model (``ask``) is another door: its tools' requests never
    reach the MCP caller who started it, as on the queue (where no context crosses)."""
    called = json.dumps({"name": "capital", "arguments": {}})
    project = sampling_project(tmp_path, f"['<tool_call>{called}</tool_call>', 'done']")
    key = api_key(project, "ada")

    async def main(served: HttpServer) -> tuple[Any, list[Any]]:
        async with client(served.url, key, answering=True, mode="legacy") as caller:
            answered = await caller.call_tool("ask", {"message": "go"})
        return answered, caller.sampled  # type: ignore[attr-defined]

    with HttpServer(project, "--ask") as served:
        answered, sampled = run(main(served))
    assert not answered.is_error and answered.content[0].text == "done"
    assert sampled == []  # the tool was told nobody can answer, and the caller never asked
