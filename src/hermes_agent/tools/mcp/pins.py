"""Pinned MCP tool definitions: a server may not change a tool under the agent (a "rug pull").

The first time the agent sees a server's tool, it pins a hash of the tool's definition (its
name, description and input schema, as the server lists them). From then on, a listing whose
definition differs from the pin refuses that tool: it is left out when the agent is built, and
its calls fail with a message that names the command that approves it again
(``hermes-agent mcp approve-tools SERVER``) until the operator has looked and approved it.

The pins are a small JSON file (``{"server": {"tool": "sha256:..."}}``), read on every check so
that an approval given from another process takes effect on the next call, and written
atomically (a temporary file renamed over it).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PINS_FILE = "mcp_pins.json"


def definition_hash(name: str, description: str | None, input_schema: Any) -> str:
    """The pin of one tool definition: a SHA-256 of its canonical JSON."""
    canonical = json.dumps(
        {"name": name, "description": description or "", "input_schema": input_schema or {}},
        sort_keys=True,
        ensure_ascii=False,
        separators=(",", ":"),
        default=str,
    )
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def default_pins_path(source: str) -> Path | None:
    """Where a config's pins live: ``.hermes/mcp_pins.json`` beside the config file; ``None``
    (pins kept in memory, for the life of the process) for a config that came from no file."""
    config = Path(source)
    if source.startswith("<") or not config.is_file():
        return None
    return config.resolve().parent / ".hermes" / PINS_FILE


class PinStore:
    """The approved definitions of every server's tools, in one JSON file (in memory only
    when ``path`` is ``None``)."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = Path(path) if path is not None else None
        self._memory: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()

    def pins(self) -> dict[str, dict[str, str]]:
        """Every pin, by server and tool (empty when the file does not exist yet)."""
        if self.path is None:
            return {server: dict(tools) for server, tools in self._memory.items()}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        if not isinstance(data, dict):
            return {}
        return {
            str(server): {str(k): str(v) for k, v in tools.items()}
            for server, tools in data.items()
            if isinstance(tools, dict)
        }

    def changed(self, server: str, definitions: Mapping[str, str]) -> list[str]:
        """The tools of ``definitions`` (tool → hash) whose pin differs; tools seen for the
        first time are pinned now (trust on first use)."""
        with self._lock:
            pins = self.pins()
            known = pins.setdefault(server, {})
            new = {tool: digest for tool, digest in definitions.items() if tool not in known}
            if new:
                known.update(new)
                self._write(pins)
            return sorted(tool for tool, digest in definitions.items() if known[tool] != digest)

    def approve(self, server: str, definitions: Mapping[str, str]) -> None:
        """Pin ``definitions`` (tool → hash) of ``server`` as they are now."""
        with self._lock:
            pins = self.pins()
            pins.setdefault(server, {}).update(definitions)
            self._write(pins)

    def _write(self, pins: dict[str, dict[str, str]]) -> None:
        if self.path is None:
            self._memory = pins
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".pins-")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as file:
                json.dump(pins, file, indent=1, sort_keys=True)
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise


def refusal(server: str, tool: str) -> str:
    """What a refused call of a changed tool says (to the model and in the trail)."""
    return (
        f"refused: MCP server {server!r} changed the definition of tool {tool!r} since it was "
        f"approved; the operator must review it and run `hermes-agent mcp approve-tools "
        f"{server}` before it can be called"
    )
