"""One exception tree for everything Hermes Agent raises on purpose.

    HermesAgentError
    ├── ConfigError              a config file or argument is wrong (names the file, key and fix)
    │   └── ToolsFileError       a tools file cannot be loaded (``loading``)
    ├── ToolDefinitionError      a tool cannot be registered (bad schema, duplicate name, ...)
    ├── MissingDependencyError   an optional extra is not installed (names the pip command)
    ├── ModelError               the model endpoint failed after the SDK's retries (status 502)
    ├── OutputValidationError    the answer never matched the requested ``output_type`` (422)
    ├── AnswerProblems           what is wrong with one answer (``pipeline.structured``; also
    │                            a ``ValueError``, which output validators may raise instead)
    ├── HookError                a hook asked for what its hook point does not allow
    │                            (``pipeline.hooks``)
    ├── VariablesTooLarge        a run's variables are over their size bound
    │                            (``pipeline.variables``; also a ``ValueError``)
    ├── StorageError             the store cannot be opened, migrated, read or written
    │   ├── SessionIdError       a session id no store can hold; raised before a run starts
    │   └── LeaseLost            a worker's hold on a queued run passed to another
    │                            (``worker.store``): it stops and writes nothing more
    ├── StoreUnavailable         a durable run's store stayed away past its retries: the
    │                            attempt ends without an ending and the run resumes later
    ├── StoreRefused             the store refused a durable run's write for good (out of
    │                            memory or disk, bad data): the run ends failed (``worker.attempt``)
    ├── FencedOut                a tool's effect written by an attempt that no longer holds
    │                            its run (``worker.fence``)
    ├── RunRejected              the run gate refuses a run: 413, 422, 429 or 503 and what to
    │                            do (``runs.gate``)
    ├── RunNotFound              no run or approval the caller may see: 404 (``runs.backend``;
    │                            also a ``LookupError``)
    ├── ApprovalConflict         the approval has its answer already: 409 (``runs.backend``)
    │   └── ApprovalAnswered     the same, from the in-process approval registry
    │                            (``server.approvals``)
    ├── NonFiniteNumber          NaN or Infinity in a call's arguments (``protocol.decoding``;
    │                            also a ``ValueError``)
    ├── SchemaRefused            a caller's JSON Schema that cannot be compiled
    │                            (``tools.validation``; also a ``ValueError``)
    ├── CheckTooCostly           a check against a caller's schema went over its step budget
    │                            (``tools.validation``; also a ``ValueError``)
    ├── UnknownEvent             a wire dict that is no event of this version (``runs.events``;
    │                            also a ``ValueError``)
    ├── ToolProcessError         a tool failed inside its worker process (``tools.sandbox``)
    ├── CallAborted              a tool call was aborted by its caller (``tools.sandbox``)
    ├── ClosedError              the tool threads closed before a call could start
    │                            (``tools.runtime``; also a ``RuntimeError``)
    ├── McpError                 a call to an MCP server failed (``tools.mcp.client``)
    ├── CallerCannotAnswer       a tool asked its caller for input and no caller can answer
    │                            (``mcp.asking``)
    ├── StateRefused             an MCP caller's ``requestState`` the door will not resume
    │                            from: tampered, foreign, spent or expired (``mcp.input_required``)
    ├── DeliveryError            a channel part was not delivered; ``transient`` when a retry
    │                            may succeed (``channels.senders``)
    ├── InboundRefused           a channel payload the channel cannot take: 400 or 422
    │                            (``channels.inbound``)
    └── OpenAIError              the OpenAI-compatible facade's error answer
                                 (``server.openai.wire``)

Each class lives beside the code that raises it (the module in brackets). ``hermes_agent``
exports the ones a caller of the library handles: ``HermesAgentError``, ``ConfigError``,
``ToolsFileError``, ``ToolDefinitionError``, ``MissingDependencyError``, ``ModelError``,
``OutputValidationError``, ``HookError``, ``StorageError`` and ``SessionIdError``.
``except HermesAgentError`` catches every one of them; the ones that are also a built-in
exception keep what older callers caught. A test (``tests/test_exception_tree.py``) finds every
exception class the package defines and checks that it is in this tree, drawn here, or private.

Problems *inside* a run (unknown tool, invalid arguments, a tool that raises or times out) are
not exceptions: they become results with a status code that the model sees and the caller reads
in ``RunResult``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hermes_agent.types import RunResult


class HermesAgentError(Exception):
    """Base class of every error Hermes Agent raises on purpose."""


class ConfigError(HermesAgentError):
    """A configuration file or value is invalid."""


class ToolDefinitionError(HermesAgentError):
    """A tool cannot be registered as given."""


class MissingDependencyError(HermesAgentError):
    """An optional dependency is missing; the message names the install command."""


class ModelError(HermesAgentError):
    """The model could not produce a completion (endpoint down, bad response, ...)."""


class OutputValidationError(HermesAgentError):
    """The model's answer never matched the ``output_type`` of the run, retries included.

    ``result`` is the whole ``RunResult`` (status 422; its steps hold every answer the model
    gave), ``problems`` what was wrong with the last one. A service answers 422.
    """

    def __init__(self, message: str, *, result: RunResult, problems: list[str]) -> None:
        super().__init__(message)
        self.result = result
        self.problems = problems


class StoreUnavailable(HermesAgentError):
    """The durable store of a queued run could not be reached or written, retries included
    (a database restarted, its connections reset or stalled), or this attempt can no longer
    show that it holds the run's lease (a missed heartbeat).

    Never a run's answer: the pipeline lets it through every stage, the worker ends the
    attempt without writing an ending, gives the delivery back to the broker, and the run
    resumes from its journal once the store is back (docs/scale-out.md, "Store outages").
    """


def is_store_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the store failing (a lost, refused, reset or timed-out database
    connection, a database error raised through SQLAlchemy, a broker or Redis connection
    error) rather than a defect of the code that called it — itself, or what it was raised
    from (a store's own error wrapping the database's: ``raise StorageError(...) from exc``)."""
    seen: BaseException | None = exc
    for _ in range(8):  # a few links of the chain; a cycle or a long one ends the search
        if seen is None:
            return False
        if _is_store_failure(seen):
            return True
        seen = seen.__cause__
    return False


def _is_store_failure(exc: BaseException) -> bool:
    if isinstance(exc, StoreUnavailable):
        return True
    import sqlalchemy.exc  # the store's layer; a core dependency

    if isinstance(exc, sqlalchemy.exc.DBAPIError | sqlalchemy.exc.TimeoutError):
        return True
    try:
        import redis.exceptions
    except ImportError:  # pragma: no cover - the worker extra is not installed
        return False
    return isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError)
