"""The ``hermes-agent`` typer application: every command, registered in one place."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from hermes_agent.cli import channels, evals, keys, llama_server, run, serve, storage, worker
from hermes_agent.cli._common import is_terminal, out
from hermes_agent.cli.mcp import mcp_app

app = typer.Typer(
    name="hermes-agent",
    help="Hermes Agent: run function-calling models that speak the Hermes protocol.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Boxed help and usage errors on a terminal; off one, click's plain lines, so that a usage
    # error is one line a script or a log can read (typer's box is drawn 80 columns wide).
    rich_markup_mode="rich" if is_terminal(sys.stderr) and is_terminal(sys.stdout) else None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _show_version(value: bool) -> None:
    if value:
        from hermes_agent import __version__

        out().print(f"hermes-agent {__version__}")
        raise typer.Exit(0)


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", "-V", callback=_show_version, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    """Hermes Agent: run function-calling models that speak the Hermes protocol."""


app.command("run")(run.run)
app.command("chat")(run.chat)
app.command("tools")(run.list_tools)
app.command("eval")(evals.eval_command)
app.add_typer(storage.sessions_app)
app.add_typer(storage.trace_app)
app.add_typer(storage.db_app)
app.command("replay")(storage.replay_command)
app.command("serve")(serve.serve)
app.add_typer(keys.keys_app)
app.add_typer(mcp_app)
app.add_typer(channels.channels_app)
app.command("worker")(worker.worker)
app.command("llama-server")(llama_server.llama_server)
app.add_typer(worker.runs_app)


def main() -> None:
    """Console-script entry point."""
    app()
