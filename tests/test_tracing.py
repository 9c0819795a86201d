"""OpenTelemetry traces: spans captured with the SDK's in-memory exporter — the tree of a
two-step run, the GenAI attributes, no secret in any attribute (content capture off and on),
error.type on failures, cancelled runs, forks, the config switch, nothing imported when off, and
the caller's traceparent through the real service on uvicorn. The examples of
docs/observability.md run here too."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from hermes_agent import Agent, ScriptedModel
from hermes_agent.errors import ModelError
from hermes_agent.models.base import ModelBase, ModelProfile, ModelSettings
from hermes_agent.testing import tool_call as call
from hermes_agent.tracing import SCHEMA_URL, instrument, tracer_of
from hermes_agent.types import Message, ModelResponse, StreamChunk

DOCS = Path(__file__).resolve().parents[1] / "docs"

KEY = "sk-live-4f9a8b7c6d5e4f3a2b1c0d9e"  # looks like an API key: masked by the default patterns
PASSWORD = "correct-horse-battery-staple"  # the agent's own secret: masked by Agent(secrets=)


@pytest.fixture
def exporter() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    yield provider, memory
    provider.shutdown()


def lookup(account: str, token: str) -> dict[str, str]:
    """Look an account up with an access token."""
    time.sleep(0.05)  # a tool that takes time: its span lasts a while
    return {"account": account, "owner": "Ada", "echo": token}


def explode(reason: str) -> str:
    """A tool that always fails."""
    raise ValueError(f"cannot use {reason}")


def two_step_agent(*middle: str) -> Agent:
    """Model turn 1 calls ``lookup`` (with the secrets as arguments), the last one answers."""
    first = call("lookup", account="acme", token=f"{KEY} {PASSWORD}")
    model = ScriptedModel([first, *middle, "Ada owns acme."])
    return Agent(model=model, tools=[lookup, explode], secrets=[PASSWORD])


def tree(spans: Sequence[ReadableSpan]) -> list[tuple[int, str]]:
    """(depth, name) of every span, parents before children, siblings by start time."""
    by_id = {s.context.span_id: s for s in spans}
    children: dict[int | None, list[ReadableSpan]] = {}
    for span in spans:
        parent = span.parent.span_id if span.parent and span.parent.span_id in by_id else None
        children.setdefault(parent, []).append(span)
    out: list[tuple[int, str]] = []

    def walk(parent: int | None, depth: int) -> None:
        for span in sorted(children.get(parent, []), key=lambda s: s.start_time or 0):
            out.append((depth, span.name))
            walk(span.context.span_id, depth + 1)

    walk(None, 0)
    return out


def named(spans: Sequence[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    return sorted((s for s in spans if s.name.startswith(prefix)), key=lambda s: s.start_time or 0)


def everything_recorded(spans: Sequence[ReadableSpan]) -> str:
    """Every attribute, event attribute and status text of every span, as one string."""
    parts: list[str] = []
    for span in spans:
        parts.append(span.name)
        parts += [f"{k}={v}" for k, v in (span.attributes or {}).items()]
        for event in span.events:
            parts += [f"{k}={v}" for k, v in (event.attributes or {}).items()]
        parts.append(span.status.description or "")
    return "\n".join(parts)


# -- the tree and the attributes ---------------------------------------------------------------


def test_a_two_step_run_is_one_tree_with_the_genai_attributes(
    exporter: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, memory = exporter
    agent = two_step_agent()
    instrument(agent, tracer_provider=provider, agent_name="accounts")
    result = agent.run("Who owns acme?", session_id="conversation-7")
    assert result.status == 200 and result.output == "Ada owns acme."
    spans = memory.get_finished_spans()

    assert tree(spans) == [
        (0, "invoke_agent accounts"),
        (1, "InputParser"),
        (1, "ThoughtGenerator"),
        (2, "chat scripted"),
        (1, "ToolSelector"),
        (1, "ToolExecutor"),
        (2, "execute_tool lookup"),
        (1, "ThoughtGenerator"),
        (2, "chat scripted"),
        (1, "OutputRenderer"),
    ]
    assert len({s.context.trace_id for s in spans}) == 1
    assert {s.instrumentation_scope.schema_url for s in spans} == {SCHEMA_URL}

    (run,) = named(spans, "invoke_agent")
    assert run.parent is None and run.kind == SpanKind.INTERNAL
    assert dict(run.attributes or {}) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.provider.name": "scripted",
        "gen_ai.request.model": "scripted",
        "gen_ai.conversation.id": "conversation-7",
        "gen_ai.agent.name": "accounts",
        "hermes.request_id": result.request_id,
        "gen_ai.usage.input_tokens": result.usage.prompt_tokens,
        "gen_ai.usage.output_tokens": result.usage.completion_tokens,
        "hermes.status": 200,
        "hermes.tool_calls": 1,
    }
    assert run.status.status_code == StatusCode.UNSET

    chats = named(spans, "chat")
    for chat, step in zip(chats, result.steps, strict=True):
        attributes = dict(chat.attributes or {})
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.provider.name"] == "scripted"
        assert attributes["gen_ai.request.model"] == "scripted"
        assert attributes["gen_ai.conversation.id"] == "conversation-7"
        assert attributes["gen_ai.usage.input_tokens"] == step.usage.prompt_tokens
        assert attributes["gen_ai.usage.output_tokens"] == step.usage.completion_tokens
        assert chat.kind == SpanKind.INTERNAL  # an in-process model
    assert chats[0].attributes["gen_ai.usage.output_tokens"] > 0  # type: ignore[index]

    (tool,) = named(spans, "execute_tool")
    (record,) = result.tool_calls
    assert dict(tool.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "lookup",
        "gen_ai.tool.call.id": record.id,
        "gen_ai.tool.type": "function",
        "gen_ai.tool.description": "Look an account up with an access token.",
        "hermes.status": 200,
        "hermes.cache_hit": False,
    }
    # The call's span lasts what the executor measured, inside its stage's span.
    (stage,) = named(spans, "ToolExecutor")
    assert tool.start_time and tool.end_time and stage.start_time and stage.end_time
    assert stage.start_time <= tool.start_time <= tool.end_time <= stage.end_time
    took_ms = (tool.end_time - tool.start_time) / 1e6
    assert took_ms == pytest.approx(record.metadata["execution_time_ms"], abs=0.01)
    assert took_ms >= 50
    assert [s.attributes["hermes.step"] for s in named(spans, "ThoughtGenerator")] == [0, 1]  # type: ignore[index]


@pytest.mark.parametrize("capture_content", [False, True])
def test_no_secret_reaches_any_attribute(
    exporter: tuple[TracerProvider, InMemorySpanExporter], capture_content: bool
) -> None:
    provider, memory = exporter
    # one more turn: a failing call that quotes the secrets
    agent = two_step_agent(call("explode", reason=f"{KEY} and {PASSWORD}"))
    instrument(agent, tracer_provider=provider, capture_content=capture_content)
    result = agent.run(f"My key is {KEY}, my password {PASSWORD}. Who owns acme?")
    assert [c.status_code for c in result.tool_calls] == [200, 500]
    recorded = everything_recorded(memory.get_finished_spans())
    assert KEY not in recorded and PASSWORD not in recorded
    assert "sk-live" not in recorded and "horse" not in recorded  # not even a piece
    spans = memory.get_finished_spans()
    content = {
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.result",
    }
    keys = {k for s in spans for k in (s.attributes or {})}
    if not capture_content:
        assert not keys & content
        assert "Who owns acme" not in recorded and "Ada" not in recorded
        return
    assert content <= keys
    (run,) = named(spans, "invoke_agent")
    asked = json.loads(str((run.attributes or {})["gen_ai.input.messages"]))
    assert asked == [
        {
            "role": "user",
            "parts": [
                {
                    "type": "text",
                    "content": "My key is [REDACTED], my password [REDACTED]. Who owns acme?",
                }
            ],
        }
    ]
    looked, exploded = named(spans, "execute_tool")
    arguments = json.loads(str((looked.attributes or {})["gen_ai.tool.call.arguments"]))
    assert arguments == {"account": "acme", "token": "[REDACTED] [REDACTED]"}
    answer = json.loads(str((looked.attributes or {})["gen_ai.tool.call.result"]))
    assert answer == {"account": "acme", "owner": "Ada", "echo": "[REDACTED] [REDACTED]"}
    # The failing call's message is content too: kept, masked.
    assert exploded.status.description is not None
    assert "raised ValueError: cannot use [REDACTED] and [REDACTED]" in exploded.status.description
    assert "gen_ai.tool.call.result" not in (exploded.attributes or {})
    last_chat = named(spans, "chat")[-1]
    said = json.loads(str((last_chat.attributes or {})["gen_ai.output.messages"]))
    assert said == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": "Ada owns acme."}],
            "finish_reason": "stop",
        }
    ]


def test_the_services_own_keys_and_stream_tokens_are_masked(
    exporter: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    from hermes_agent.runs.keys import MemoryKeyStore
    from hermes_agent.runs.principal import Principal
    from hermes_agent.server.stream_tokens import MemoryStreamTokens, StreamGrant

    # Real ones, minted as the service mints them: a user pastes them into the chat, a tool
    # echoes them back.
    api_key = MemoryKeyStore().create("alice")
    grant = StreamGrant("run-1", Principal("alice"), None, time.time() + 300)
    stream_token = MemoryStreamTokens().grant(grant)
    assert api_key.startswith("hk_") and stream_token.startswith("hst_")
    provider, memory = exporter
    first = call("lookup", account="acme", token=f"{api_key} {stream_token}")
    agent = Agent(model=ScriptedModel([first, "Ada owns acme."]), tools=[lookup])
    instrument(agent, tracer_provider=provider, capture_content=True)
    result = agent.run(f"My key is {api_key}; my stream token {stream_token}. Who owns acme?")
    assert result.output == "Ada owns acme."
    recorded = everything_recorded(memory.get_finished_spans())
    for secret in (api_key, stream_token):
        assert secret.split(".", 1)[1] not in recorded  # not even the secret part
    assert "My key is [REDACTED]; my stream token [REDACTED]. Who owns acme?" in recorded
    (looked,) = named(memory.get_finished_spans(), "execute_tool")
    arguments = json.loads(str((looked.attributes or {})["gen_ai.tool.call.arguments"]))
    assert arguments == {"account": "acme", "token": "[REDACTED] [REDACTED]"}


# -- errors --------------------------------------------------------------------------------------


def test_failures_carry_error_type(exporter: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, memory = exporter

    async def slow(seconds: float) -> str:
        """Sleep."""
        await asyncio.sleep(seconds)  # slow work on purpose: it runs past its timeout
        return "slept"

    model = ScriptedModel(
        [
            call("explode", reason="a test")
            + call("slow", seconds=5)
            + call("no_such_tool")
            + call("lookup", account="acme"),  # missing a required argument
            "Done.",
        ]
    )
    agent = Agent(model=model, tools=[explode, lookup])
    agent.tool(timeout=0.05)(slow)
    instrument(agent, tracer_provider=provider)
    result = agent.run("Try everything.")
    assert sorted(c.status_code for c in result.tool_calls) == [400, 404, 408, 500]
    spans = memory.get_finished_spans()

    ran = {s.attributes["gen_ai.tool.name"]: s for s in named(spans, "execute_tool")}  # type: ignore[index]
    assert set(ran) == {"explode", "slow"}  # the refused calls never ran
    assert ran["explode"].attributes["error.type"] == "tool_error"  # type: ignore[index]
    assert ran["explode"].status.status_code == StatusCode.ERROR
    assert ran["explode"].status.description is None  # a message is content: off by default
    assert ran["slow"].attributes["error.type"] == "timeout"  # type: ignore[index]
    (stage,) = named(spans, "ToolExecutor")
    refused = {e.attributes["gen_ai.tool.name"]: e.attributes for e in stage.events}  # type: ignore[index]
    assert refused["no_such_tool"]["error.type"] == "unknown_tool"  # type: ignore[index]
    assert refused["lookup"]["error.type"] == "invalid"  # type: ignore[index]
    assert refused["lookup"]["hermes.status"] == 400  # type: ignore[index]
    assert all(e.name == "hermes.tool_call.refused" for e in stage.events)
    (run,) = named(spans, "invoke_agent")
    assert "error.type" not in (run.attributes or {})  # the run itself answered


class BrokenModel(ModelBase):
    name = "broken"

    async def complete(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]], settings: ModelSettings
    ) -> ModelResponse:
        raise ModelError("the endpoint answered 503")

    async def stream(  # type: ignore[override]
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]], settings: ModelSettings
    ) -> Any:
        raise ModelError("the endpoint answered 503")
        yield StreamChunk("")  # pragma: no cover


def test_a_model_that_fails_marks_the_chat_and_the_run(
    exporter: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, memory = exporter
    agent = Agent(model=BrokenModel())
    instrument(agent, tracer_provider=provider)
    assert agent.run("hello").status == 502
    spans = memory.get_finished_spans()
    (chat,) = named(spans, "chat")
    (run,) = named(spans, "invoke_agent")
    assert chat.attributes["error.type"] == "model_error"  # type: ignore[index]
    assert chat.attributes["gen_ai.provider.name"] == "BrokenModel"  # type: ignore[index]
    assert run.attributes["error.type"] == "model_error"  # type: ignore[index]
    assert run.status.status_code == StatusCode.ERROR
    assert [name for _, name in tree(spans)][-1] == "OutputRenderer"


def test_a_cancelled_run_ends_its_spans_as_cancelled(
    exporter: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    from server_harness import await_for

    provider, memory = exporter
    running: list[bool] = []

    async def hang() -> str:
        """Wait for a long time."""
        running.append(True)
        await asyncio.sleep(30)  # a tool that hangs: the run is cancelled meanwhile
        return "never"

    agent = Agent(model=ScriptedModel([call("hang"), "never"]), tools=[hang])
    instrument(agent, tracer_provider=provider)

    async def cancel_midway() -> None:
        task = asyncio.create_task(agent.arun("wait"))
        await await_for(lambda: named(memory.get_finished_spans(), "ToolSelector"))
        await await_for(lambda: running, what="the tool running")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0)  # the task's done callbacks

    asyncio.run(cancel_midway())
    spans = memory.get_finished_spans()
    (run,) = named(spans, "invoke_agent")
    (stage,) = named(spans, "ToolExecutor")
    assert run.attributes["error.type"] == "cancelled"  # type: ignore[index]
    assert stage.attributes["error.type"] == "cancelled"  # type: ignore[index]
    assert stage.parent is not None and stage.parent.span_id == run.context.span_id
    assert not tracer_of(agent)._runs  # type: ignore[union-attr]  # nothing left behind


def test_a_tracer_that_breaks_never_fails_the_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from opentelemetry.sdk.trace import SpanProcessor

    class Broken(SpanProcessor):
        def on_start(self, span: Any, parent_context: Any = None) -> None:
            raise RuntimeError("the collector is on fire")

    provider = TracerProvider()
    provider.add_span_processor(Broken())
    agent = two_step_agent()
    instrument(agent, tracer_provider=provider)
    with caplog.at_level("WARNING", logger="hermes_agent.tracing"):
        result = agent.run("Who owns acme?")
    assert (result.status, result.output) == (200, "Ada owns acme.")
    assert "tracing failed at pre_input" in caplog.text


# -- switching it on -------------------------------------------------------------------------------


def test_a_fork_is_traced_and_instrument_is_idempotent(
    exporter: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, memory = exporter
    agent = Agent(model=ScriptedModel(lambda messages, tools: "hi"))
    tracer = instrument(agent, tracer_provider=provider)
    assert instrument(agent) is tracer and tracer_of(agent) is tracer
    fork = agent.fork(storage=None)
    assert fork.run("hello").output == "hi"
    assert [s.name for s in named(memory.get_finished_spans(), "invoke_agent")] == ["invoke_agent"]
    assert tracer_of(Agent(model=ScriptedModel(["x"]))) is None


def run_python(code: str, cwd: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_with_tracing_off_opentelemetry_is_never_imported(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("model: {provider: scripted, responses: ['ok']}\n")
    out = run_python(
        f"""
        import sys
        from hermes_agent import Agent, ScriptedModel
        import hermes_agent.tracing  # importing the module is not turning it on

        def add(a: int, b: int) -> int:
            '''Add.'''
            return a + b

        call = '<tool_call>{{"name": "add", "arguments": {{"a": 1, "b": 2}}}}</tool_call>'
        agent = Agent(model=ScriptedModel([call, "3"]), tools=[add])
        assert agent.run("1 + 2?").output == "3"
        assert Agent.from_config({str(config)!r}).run("hi").output == "ok"
        print(sorted(name for name in sys.modules if name.startswith("opentelemetry")))
        """,
        tmp_path,
    )
    assert out.strip() == "[]"


def test_the_config_section_of_the_docs_turns_tracing_on(tmp_path: Path) -> None:
    text = (DOCS / "observability.md").read_text(encoding="utf-8")
    (section,) = re.findall(r"```yaml\n(.*?)```", text, re.S)
    config = tmp_path / "config.yaml"
    config.write_text("model: {provider: scripted, responses: ['ok']}\n" + section)
    out = run_python(
        f"""
        import json
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from hermes_agent import build_agent

        memory = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(memory))
        trace.set_tracer_provider(provider)  # the global provider, as an application sets it
        build_agent({str(config)!r}).run("hi there")
        spans = memory.get_finished_spans()
        print(json.dumps([[s.name, sorted(s.attributes)] for s in spans]))
        """,
        tmp_path,
    )
    spans = dict(json.loads(out))
    assert "invoke_agent accounts" in spans and "chat scripted" in spans
    assert "gen_ai.agent.name" in spans["invoke_agent accounts"]
    assert not any("messages" in key for keys in spans.values() for key in keys)


def test_an_unknown_tracing_key_is_a_config_error(tmp_path: Path) -> None:
    from hermes_agent.config import load_config
    from hermes_agent.errors import ConfigError

    config = tmp_path / "config.yaml"
    config.write_text("tracing: {enable: true}\n")
    with pytest.raises(ConfigError, match=r"tracing\.enable"):
        load_config(config)


# -- the service ---------------------------------------------------------------------------------

PARENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"


def test_the_callers_traceparent_is_the_parent_of_the_run_over_uvicorn(
    exporter: tuple[TracerProvider, InMemorySpanExporter], tmp_path: Path
) -> None:
    from hermes_agent.server import ServiceSettings, create_app
    from server_harness import make_agent, serve, sse_events, wait_for

    provider, memory = exporter
    agent = make_agent("memory://")
    instrument(agent, tracer_provider=provider)
    header = {"traceparent": f"00-{PARENT_TRACE}-{PARENT_SPAN}-01"}
    app = create_app(agent=agent, settings=ServiceSettings(auth="none"))
    with serve(app) as url:
        client = httpx.Client(base_url=url, timeout=30)
        # JSON, with and without a traceparent
        joined = client.post("/v1/runs", json={"message": "hello"}, headers=header).json()
        alone = client.post("/v1/runs", json={"message": "hello"}).json()
        # the OpenAI-compatible facade
        chat = {"model": "hermes-agent", "messages": [{"role": "user", "content": "hello"}]}
        facade = client.post("/v1/chat/completions", json=chat, headers=header)
        assert facade.status_code == 200, facade.text
        # a streamed run that calls a tool, cancelled by the client while the tool runs
        with client.stream(
            "POST", "/v1/runs", json={"message": "slow", "stream": True}, headers=header
        ) as r:
            first = next(f for f in sse_events(r.iter_lines()) if "data" in f)
        stopped = first["data"]["request_id"]
        wait_for(lambda: named(memory.get_finished_spans(), "ToolSelector"), what="a tool chosen")
        assert client.post(f"/v1/runs/{stopped}/cancel").json()["cancelled"] is True
        wait_for(
            lambda: len(named(memory.get_finished_spans(), "invoke_agent")) >= 4,
            what="the four runs' spans",
        )

    finished = named(memory.get_finished_spans(), "invoke_agent")
    runs = {s.attributes["hermes.request_id"]: s for s in finished}  # type: ignore[index]
    assert len(runs) == 4
    for request_id, span in runs.items():
        if request_id == alone["request_id"]:
            assert span.parent is None
            assert format(span.context.trace_id, "032x") != PARENT_TRACE
            continue
        assert format(span.context.trace_id, "032x") == PARENT_TRACE
        assert span.parent is not None and span.parent.is_remote
        assert format(span.parent.span_id, "016x") == PARENT_SPAN
    assert runs[joined["request_id"]].attributes["hermes.status"] == 200  # type: ignore[index]
    assert runs[stopped].attributes["error.type"] == "cancelled"  # type: ignore[index]
    # every span of the joined runs is in the caller's trace
    in_trace = [
        s for s in memory.get_finished_spans() if format(s.context.trace_id, "032x") == PARENT_TRACE
    ]
    assert len(in_trace) > 3 * 4


def test_an_untraced_service_ignores_traceparent(
    exporter: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    from opentelemetry import trace

    from hermes_agent.server import ServiceSettings, create_app
    from server_harness import make_agent, serve

    seen: list[bool] = []
    agent = make_agent("memory://")
    agent.add_hook("pre_input", lambda ctx: seen.append(trace.get_current_span().is_recording()))
    agent.add_hook(
        "post_input",
        lambda ctx: seen.append(trace.get_current_span().get_span_context().is_valid),
    )
    header = {"traceparent": f"00-{PARENT_TRACE}-{PARENT_SPAN}-01"}
    with serve(create_app(agent=agent, settings=ServiceSettings(auth="none"))) as url:
        reply = httpx.post(f"{url}/v1/runs", json={"message": "hello"}, headers=header, timeout=30)
        assert reply.status_code == 200
    assert seen == [False, False]  # no context was attached for it
    assert exporter[1].get_finished_spans() == ()


# -- the documentation ---------------------------------------------------------------------------


def test_the_observability_page_examples_run(tmp_path: Path) -> None:
    text = (DOCS / "observability.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 2
    namespace: dict[str, object] = {"__name__": "docs_observability"}
    for number, block in enumerate(blocks, start=1):
        exec(compile(block, f"observability.md (python block {number})", "exec"), namespace)


class DeclaredModel(ScriptedModel):
    """A model served elsewhere, which says who serves it and where (its profile)."""

    @property
    def profile(self) -> ModelProfile:
        return ModelProfile(provider="vllm", server_url="http://10.0.0.5:8000/v1")


def test_the_chat_span_names_the_provider_and_server_the_profile_declares(
    exporter: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, memory = exporter
    agent = Agent(model=DeclaredModel(["hi"]))
    instrument(agent, tracer_provider=provider)
    assert agent.run("hello").output == "hi"
    (chat,) = named(memory.get_finished_spans(), "chat")
    assert chat.attributes["gen_ai.provider.name"] == "vllm"  # type: ignore[index]
    assert chat.attributes["server.address"] == "10.0.0.5"  # type: ignore[index]
    assert chat.attributes["server.port"] == 8000  # type: ignore[index]
    assert chat.kind == SpanKind.CLIENT
