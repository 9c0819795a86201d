"""The ``hermes-agent`` command (typer). Nothing in the library imports this package.

    hermes-agent run "What is 17 * 23?"          # embedded model + demo tools, offline
    hermes-agent run --json --tool-choice required "What is 17 * 23?"
    hermes-agent run --config config.yaml --tools my_tools.py "..."
    hermes-agent chat                            # interactive, streaming
    hermes-agent tools                           # the tools and their schemas
    hermes-agent sessions list | trace show REQUEST_ID | replay REQUEST_ID
    hermes-agent eval examples/eval_cases.yaml
    hermes-agent llama-server                    # llama.cpp's server, repacking off, :8080
    hermes-agent --version | -h

Exit codes: 0 when the run produced an answer (status 200 or 206), 1 when it failed (4xx/5xx),
2 for a usage or configuration error. Errors are one line on stderr, never a traceback.

The command is the interface; this package is implementation, not public API.
"""

from hermes_agent.cli.app import app, main

__all__ = ["app", "main"]
