"""Every ``python`` block of the user guide runs, in order, in one namespace."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.parametrize(
    "page", ["guide.md", "protocol.md", "pipeline.md", "sessions-and-audit.md"]
)
def test_guide_examples_run(page: str) -> None:
    text = (DOCS / page).read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, f"{page} has no python examples"
    namespace: dict[str, object] = {"__name__": f"docs_{page}"}
    for number, block in enumerate(blocks, start=1):
        code = compile(block, f"{page} (python block {number})", "exec")
        exec(code, namespace)


def test_opentelemetry_instrument_is_given_the_command_after_a_double_dash() -> None:
    """``opentelemetry-instrument`` reads options until ``--``: its own ``--config_file`` and
    ``--configurator`` make ``--config`` ambiguous (argparse refuses it, exit 2), so every
    command the docs show passes the hermes-agent command after ``--``."""
    pages = [DOCS.parent / "README.md", *sorted(DOCS.glob("*.md"))]
    commands = [
        line.strip()
        for page in pages
        if page.name != "decisions.md"
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(encoding="utf-8"), re.S)
        for line in block.splitlines()
        if "opentelemetry-instrument" in line
    ]
    assert commands, "the observability page shows how to run under opentelemetry-instrument"
    for command in commands:
        after = command.split("opentelemetry-instrument", 1)[1].split()
        assert after[0] == "--" and after[1] == "hermes-agent", command
