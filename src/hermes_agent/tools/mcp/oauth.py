"""OAuth for MCP servers over HTTP (``mcp_servers.<name>.oauth``), with the SDK's own client.

    mcp_servers:
      notes:
        url: https://notes.example.com/mcp
        oauth: {}                               # discover, register, sign in: all defaults

On a 401 the SDK's ``OAuthClientProvider`` discovers the server's authorization server,
registers the client (or uses a pre-registered ``client_id``, or a client ID metadata
document), sends the user to sign in (PKCE, ``state`` and ``iss`` checked), exchanges the code
and refreshes the token when it expires; a 403 ``insufficient_scope`` asks again for more
(``_oauth_flow`` wires it in). Here: what an embedding application chooses, ``OAuthSignIn``:
where tokens are kept (``default_oauth_folder``: ``.hermes/mcp_oauth/`` beside the config
file, one file per server, mode 0600) and how the user is sent to the authorization page
(``open_in_browser``: print the URL and open the browser; the answer comes back to a listener
of the agent's own on the loopback ``redirect_uri``).

Importing this module imports nothing of the SDK.
"""

from __future__ import annotations

import logging
import sys
import webbrowser
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger("hermes_agent.mcp")

OAUTH_FOLDER = "mcp_oauth"


def open_in_browser(url: str) -> None:
    """Print ``url`` (for a terminal without a browser) and open it in the user's browser."""
    print(f"Sign in to continue: {url}", file=sys.stderr, flush=True)
    try:
        webbrowser.open(url)
    except webbrowser.Error as exc:  # no browser: the printed URL is the way
        logger.info("could not open a browser (%s); open the URL above", exc)


@dataclass(frozen=True, slots=True)
class OAuthSignIn:
    """Where the tokens of OAuth servers are kept, and how the user is sent to sign in.

    ``folder``: the state folder for ``<server>.json`` files (``None``: in memory, for the
    life of the process). ``open_url``: called, in a worker thread, with the authorization
    URL (default: print it and open the browser; a coroutine function is awaited); the answer
    arrives on the loopback listener.
    """

    folder: Path | None = None
    open_url: Callable[[str], Any] = open_in_browser
    memory: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False, compare=False)
    """Per server, what is kept while ``folder`` is ``None``."""


def default_oauth_folder(source: str) -> Path | None:
    """Where a config's OAuth state lives: ``.hermes/mcp_oauth/`` beside the config file;
    ``None`` (in memory) for a config that came from no file."""
    config = Path(source)
    if source.startswith("<") or not config.is_file():
        return None
    return config.resolve().parent / ".hermes" / OAUTH_FOLDER
