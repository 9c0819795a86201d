"""Where Hermes Agent's own log lines go: the one place that reads ``DEBUG`` and ``HERMES_DEBUG``.

By default the library adds no handler: Python prints warnings and errors of the
``hermes_agent`` loggers to stderr and nothing else, and an application's own logging
configuration wins. With ``HERMES_DEBUG=1`` (or ``DEBUG=1``) in the environment, or after
``enable_debug_logging()``, every ``hermes_agent`` logger writes its debug and info lines too —
one ``[LEVEL] message`` line each on stderr (one line per pipeline stage, one per tool call...).
The library (when an ``Agent`` is built) and the CLI (``--debug``) both come here.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import TextIO

__all__ = [
    "DEBUG_VARIABLES",
    "configure_from_environment",
    "debug_from_environment",
    "enable_debug_logging",
]

DEBUG_VARIABLES = ("HERMES_DEBUG", "DEBUG")
"""The environment variables that turn debug logging on; either one is enough."""

_OFF = frozenset({"", "0", "false", "no", "off"})


def debug_from_environment(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``HERMES_DEBUG`` or ``DEBUG`` asks for debug output (any value but empty, ``0``,
    ``false``, ``no`` or ``off``)."""
    values = os.environ if environ is None else environ
    return any(values.get(name, "").strip().lower() not in _OFF for name in DEBUG_VARIABLES)


class DebugHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a line is logged (a test runner, a CLI runner
    or a notebook may replace it after the handler was installed)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("[%(levelname)s] %(message)s"))

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        """``StreamHandler`` sets a stream when built; the current stderr is used instead."""


def enable_debug_logging() -> None:
    """Send the debug and info lines of every ``hermes_agent`` logger to stderr. Idempotent:
    calling it again installs no second handler."""
    logger = logging.getLogger("hermes_agent")
    if not any(isinstance(handler, DebugHandler) for handler in logger.handlers):
        logger.addHandler(DebugHandler())
    logger.setLevel(logging.DEBUG)
    # Lines are written here once; an application's root handler would print them again.
    logger.propagate = False


def configure_from_environment() -> bool:
    """Turn debug logging on when the environment asks (``debug_from_environment``); returns
    whether it is on. Leaves the logging configuration alone otherwise."""
    if debug_from_environment():
        enable_debug_logging()
        return True
    return False
