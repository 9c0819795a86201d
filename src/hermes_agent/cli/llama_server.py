"""``hermes-agent llama-server``: llama-cpp-python's own OpenAI-compatible server
(``llama_cpp.server``) with the bundled model, loaded the project's way.

    hermes-agent llama-server                                  # native mode, 127.0.0.1:8080
    hermes-agent llama-server --chat-format chatml --port 8081 # hermes mode (grammar: true)
    hermes-agent llama-server --model my.gguf -- --n_gpu_layers 20

It is a thin wrapper: the server, its routes and its options are llama-cpp-python's (anything
after ``--`` goes to its own command line, e.g. ``--n_batch``); what this adds is

- the model is loaded with llama.cpp's weight repacking off (``models.llamacpp.
  llama_server_loading``): on CPUs that advertise AMX and trap on it, the server started with
  ``python -m llama_cpp.server`` dies with "Illegal instruction" at its first completion;
- the bundled SmolLM2 GGUF when no ``--model`` is given, and defaults that fit this runtime
  (loopback, ``n_ctx`` 4096 as ``LlamaCpp`` has, the tool-calling chat format);
- a request that sends ``tools`` to a chat format that ignores them is refused with a 400 that
  says which format to start instead. llama-cpp-python would answer it in prose, and the
  client could not tell a model that chose not to call from a server that never showed it the
  tools;
- OpenAI's ``response_format`` ``{"type": "json_schema", "json_schema": {"schema": ...}}`` is
  handed on in llama-cpp-python's own spelling (``{"type": "json_object", "schema": ...}``),
  which its server turns into a grammar. Its request model knows only ``text`` and
  ``json_object`` and answers the OpenAI spelling with an HTTP 500.

Needs ``llama-cpp-python[server]`` (in the ``dev`` extra).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Annotated, Any

import typer

from hermes_agent.cli._common import err, fail, styled
from hermes_agent.errors import HermesAgentError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

TOOL_CHAT_FORMATS = frozenset(
    {"chatml-function-calling", "functionary", "functionary-v1", "functionary-v2"}
)
"""llama-cpp-python's chat formats that render ``tools`` and return ``tool_calls``; every other
format drops the tools and answers in text."""
DEFAULT_PORT = 8080
"""llama.cpp's own server's port (``hermes-agent serve`` takes 8000)."""
_MAX_BODY_BYTES = 16 * 1024 * 1024
_CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")


def llama_server(
    model: Annotated[
        Path | None,
        typer.Option("--model", "-m", help="GGUF file (default: the bundled SmolLM2-135M)."),
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", "-p", min=0, max=65535, help="Port to listen on.")
    ] = DEFAULT_PORT,
    chat_format: Annotated[
        str,
        typer.Option(
            "--chat-format",
            help="chatml-function-calling: for mode: native (tools are sent); chatml: for "
            "mode: hermes (with grammar: true in the config).",
        ),
    ] = "chatml-function-calling",
    n_ctx: Annotated[int, typer.Option("--n-ctx", min=1, help="Context size in tokens.")] = 4096,
    n_threads: Annotated[
        int | None, typer.Option("--n-threads", min=1, help="CPU threads (default: half).")
    ] = None,
    alias: Annotated[
        str | None,
        typer.Option("--alias", help="The model id clients send (default: the file's path)."),
    ] = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", help="llama.cpp's own load and timing logs.")
    ] = False,
    server_args: Annotated[
        list[str] | None,
        typer.Argument(help="After --: more llama_cpp.server options, passed on unchanged."),
    ] = None,
) -> None:
    """Serve a GGUF model with llama-cpp-python's OpenAI-compatible server, weight repacking
    off (docs/guide.md, "Against llama.cpp's server")."""
    if importlib.util.find_spec("llama_cpp") is None or _server_missing():
        fail(
            "`hermes-agent llama-server` needs llama-cpp-python's server: "
            'pip install "llama-cpp-python[server]" (it comes with the dev extra)'
        )
    import uvicorn

    from hermes_agent.models.llamacpp import bundled_model_path, llama_server_loading

    try:
        path = str(model) if model is not None else str(bundled_model_path())
    except HermesAgentError as exc:
        fail(str(exc))
    if model is not None and not model.is_file():
        fail(f"--model {model}: no such file")
    argv = [
        "--model", path, "--host", host, "--port", str(port), "--chat_format", chat_format,
        "--n_ctx", str(n_ctx), "--verbose", str(verbose),
    ]  # fmt: skip
    if n_threads is not None:
        argv += ["--n_threads", str(n_threads), "--n_threads_batch", str(n_threads)]
    if alias is not None:
        argv += ["--model_alias", alias]
    server_settings, model_settings = _settings([*argv, *(server_args or [])])
    try:
        with llama_server_loading():
            from llama_cpp.server.app import create_app

            app = create_app(server_settings=server_settings, model_settings=[model_settings])
            guarded = adapt_chat_requests(app, model_settings.chat_format)
            err().print(
                styled(
                    ("llama.cpp server", "bold"),
                    f" on http://{server_settings.host}:{server_settings.port}/v1 — model "
                    f"{model_settings.model_alias or path}, chat format "
                    f"{model_settings.chat_format} (weight repacking off)",
                )
            )
            uvicorn.run(
                guarded,
                host=server_settings.host,
                port=server_settings.port,
                log_level="warning",
            )
    except HermesAgentError as exc:
        fail(str(exc))


def _server_missing() -> bool:
    try:
        return importlib.util.find_spec("llama_cpp.server.app") is None
    except ImportError:
        return True


def _settings(argv: list[str]) -> tuple[Any, Any]:
    """llama-cpp-python's server and model settings from its own command line (its parser, so
    every option it has works, spelled as it spells them)."""
    import argparse

    from llama_cpp.server.cli import add_args_from_model, parse_model_from_args
    from llama_cpp.server.settings import ModelSettings, ServerSettings, Settings

    parser = argparse.ArgumentParser(prog="hermes-agent llama-server --", add_help=False)
    add_args_from_model(parser, Settings)
    try:
        args, unknown = parser.parse_known_args(argv)
    except SystemExit:
        fail("the llama_cpp.server options after -- are not valid (see its --help)")
    if unknown:
        fail(f"unknown llama_cpp.server option(s): {' '.join(unknown)}")
    try:
        return parse_model_from_args(ServerSettings, args), parse_model_from_args(
            ModelSettings, args
        )
    except Exception as exc:  # pydantic's ValidationError, worded by llama-cpp-python
        fail(f"invalid llama_cpp.server settings: {exc}")


def ignored_tools_error(chat_format: str | None) -> str:
    """What the server answers when ``tools`` are sent to a format that drops them."""
    return (
        f"this llama.cpp server runs chat format {chat_format or '(from the model file)'}, "
        "which ignores `tools`: the model would answer in text without seeing them. Start it "
        "with --chat-format chatml-function-calling for mode: native, or use mode: hermes "
        "(with grammar: true) against --chat-format chatml"
    )


def adapt_chat_requests(app: App, chat_format: str | None) -> App:
    """``app`` with chat completions adapted to llama-cpp-python's server: ``tools`` (or
    ``functions``) refused with an OpenAI-shaped 400 when ``chat_format`` would ignore them,
    and a ``json_schema`` response format spelled as that server reads it
    (``_server_response_format``). Everything else passes through untouched: the body is read
    once and handed on as it came unless its response format was respelled."""
    refuse = chat_format not in TOOL_CHAT_FORMATS
    message = ignored_tools_error(chat_format)

    async def adapted(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await app(scope, receive, send)
            return
        if str(scope.get("path", "")).rstrip("/") not in _CHAT_PATHS:
            await app(scope, receive, send)
            return
        chunks: list[Message] = []
        size = 0
        while True:
            event = await receive()
            chunks.append(event)
            size += len(event.get("body", b""))
            if (
                event["type"] != "http.request"
                or not event.get("more_body")
                or size > _MAX_BODY_BYTES
            ):
                break
        request = (
            _request(b"".join(c.get("body", b"") for c in chunks))
            if size <= _MAX_BODY_BYTES
            else None
        )
        if refuse and request is not None and (request.get("tools") or request.get("functions")):
            await _error(send, 400, message)
            return
        respelled = _server_response_format(request)
        if respelled is not None:
            body = json.dumps({**(request or {}), "response_format": respelled}).encode()
            chunks = [{"type": "http.request", "body": body, "more_body": False}]
        pending = list(chunks)

        async def replay() -> Message:
            return pending.pop(0) if pending else await receive()

        await app(scope, replay, send)

    return adapted


def _request(body: bytes) -> dict[str, Any] | None:
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None  # the server's own validation answers it
    return request if isinstance(request, dict) else None


def _server_response_format(request: dict[str, Any] | None) -> dict[str, Any] | None:
    """OpenAI's ``json_schema`` response format as llama-cpp-python's server reads it
    (``json_object`` with the ``schema``); ``None`` when there is nothing to respell."""
    wanted = (request or {}).get("response_format")
    if not isinstance(wanted, dict) or wanted.get("type") != "json_schema":
        return None
    spec = wanted.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    return {"type": "json_object", **({"schema": schema} if isinstance(schema, dict) else {})}


async def _error(send: Send, status: int, message: str) -> None:
    body = json.dumps(
        {"error": {"message": message, "type": "invalid_request_error", "code": "tools_ignored"}}
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
