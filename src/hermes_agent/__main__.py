"""``python -m hermes_agent`` runs the CLI."""

from hermes_agent.cli import main

main()
