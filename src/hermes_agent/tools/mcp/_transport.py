"""Transports that read an MCP server's messages with a bound: past ``limit`` bytes in one
message, reading stops and the connection fails, naming the limit.

The SDK reads one message whole before anything can measure it — a stdio line of any length
(gathered by string concatenation), a JSON response body of any length — and then parses it
on the session's loop. Parsing holds the GIL, so it stalls every thread of the process, not
only that loop: a listing of 44 MB took 3–4 s. So the bound is applied while the bytes
arrive, where nothing has been parsed yet:

- stdio: lines are read with anyio's ``receive_until``, which stops at ``limit`` bytes
  without a newline; the server's process is started and stopped by the SDK's own helpers;
- streamable HTTP: a JSON body is cut off past ``limit`` (``_BoundedBodies``, a transport
  around httpx's); an event stream is bounded per event by the SDK's ``max_sse_event_size``.

What was wrong is noted in a ``ReadProblem`` the connection reads when its request fails.
This module imports the SDK: import it where a connection is opened.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TextIO

import anyio
import httpx2
from anyio.streams.buffered import BufferedByteReceiveStream
from mcp.client import stdio
from mcp.shared.message import SessionMessage
from mcp_types import jsonrpc_message_adapter

logger = logging.getLogger("hermes_agent.mcp")

MIN_MESSAGE_BYTES = 1 << 20
"""The smallest bound on one message (1 MiB), whatever ``max_result_bytes`` says."""
OFF_LOOP_BYTES = 256 << 10
"""Messages larger than this are parsed in a worker thread, so that the session's loop can
switch to other work between them (a parse itself holds the GIL: the bound is what keeps it
short)."""


@dataclass(slots=True)
class ReadProblem:
    """The bound on one message from a server, and why its transport stopped reading
    (``problem``, ``None`` while it has not)."""

    max_result_bytes: int
    problem: str | None = None

    @property
    def limit(self) -> int:
        """Twice ``max_result_bytes`` (a result's text and its structured copy, with JSON's
        escaping), at least 1 MiB."""
        return max(2 * self.max_result_bytes, MIN_MESSAGE_BYTES)

    def too_large(self, what: str) -> None:
        self.problem = (
            f"it sent {what} of more than {self.limit} bytes, so reading stopped there (one "
            f"message may have twice max_result_bytes ({self.max_result_bytes}), at least "
            "1 MiB)"
        )


@asynccontextmanager
async def bounded_stdio_client(
    parameters: Any, errlog: TextIO, noted: ReadProblem
) -> AsyncGenerator[Any, None]:
    """The SDK's stdio transport, with each line read to at most ``noted.limit`` bytes."""
    # The SDK's own helpers start the server in a process group of its own and stop it
    # (stdin closed, then SIGTERM, then SIGKILL to the group): only the reading is ours.
    command = await stdio._get_executable_command(parameters.command)
    process = await stdio._create_platform_compatible_process(
        command=command,
        args=parameters.args,
        env=stdio.get_default_environment() | (parameters.env or {}),
        errlog=errlog,
        cwd=parameters.cwd,
    )
    reader_end, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, writer_end = anyio.create_memory_object_stream[SessionMessage](0)

    async def read_lines() -> None:
        assert process.stdout is not None
        lines = BufferedByteReceiveStream(process.stdout)
        async with reader_end:
            while True:
                try:
                    line = await lines.receive_until(b"\n", noted.limit)
                except anyio.DelimiterNotFound:
                    noted.too_large("a line")
                    return  # the end of the stream: the session's requests fail
                except (anyio.IncompleteRead, anyio.ClosedResourceError, anyio.BrokenResourceError):
                    return
                except OSError:
                    return
                if len(line) > noted.limit:  # the newline came in the chunk that went past it
                    noted.too_large("a line")
                    return
                if not line.strip():
                    continue
                try:
                    await reader_end.send(await _parse(line))
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    return

    async def write_lines() -> None:
        assert process.stdin is not None
        try:
            async with writer_end:
                async for message in writer_end:
                    text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send((text + "\n").encode(parameters.encoding))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await reader_end.aclose()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(read_lines)
        tasks.start_soon(write_lines)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):
                read_stream.close()
                write_stream.close()
                await stdio._stop_server_process(process)
            tasks.cancel_scope.cancel()


async def _parse(line: bytes) -> SessionMessage | Exception:
    """One line as the session's item: the message, or the error parsing it was."""

    def parse() -> SessionMessage | Exception:
        try:
            return SessionMessage(jsonrpc_message_adapter.validate_json(line, by_name=False))
        except ValueError as exc:
            logger.warning("an MCP server sent a line that is not a JSON-RPC message: %s", exc)
            return exc

    if len(line) > OFF_LOOP_BYTES:
        return await anyio.to_thread.run_sync(parse)
    return parse()


def bounded_http_client(
    headers: dict[str, str], timeout: float, noted: ReadProblem, auth: httpx2.Auth | None = None
) -> httpx2.AsyncClient:
    """An ``httpx2.AsyncClient`` for the SDK's streamable HTTP transport whose JSON bodies
    stop at ``noted.limit`` bytes (give the transport ``max_sse_event_size=noted.limit``
    too); ``auth`` signs its requests (the SDK's OAuth client, ``oauth``)."""
    transport = _BoundedBodies(httpx2.AsyncHTTPTransport(), noted)
    return httpx2.AsyncClient(
        headers=headers,
        timeout=httpx2.Timeout(timeout, read=None),
        transport=transport,
        auth=auth,
    )


class _BoundedBodies(httpx2.AsyncBaseTransport):
    """An httpx transport whose responses, event streams aside, end with an error past the
    limit (event streams are bounded per event by the SDK)."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, noted: ReadProblem) -> None:
        self._inner = inner
        self._noted = noted

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "text/event-stream":
            response.stream = _BoundedStream(response.stream, self._noted)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


class _BoundedStream(httpx2.AsyncByteStream):
    """A response body that raises once more than the limit has arrived."""

    def __init__(self, stream: Any, noted: ReadProblem) -> None:
        self._stream = stream
        self._noted = noted

    async def __aiter__(self) -> AsyncIterator[bytes]:
        size = 0
        async for chunk in self._stream:
            size += len(chunk)
            if size > self._noted.limit:
                self._noted.too_large("a response")
                raise httpx2.StreamError(self._noted.problem or "too large")
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()
