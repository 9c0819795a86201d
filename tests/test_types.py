"""``RunResult`` is generic in ``data``'s type: a type checker reads ``result.data`` as the
``output_type`` the run named (``None`` when the run ended without an answer), and as ``Any``
for a JSON Schema or no ``output_type`` at all. Checked by running mypy, with the project's
config, over a small user program."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from mypy import api

from hermes_agent import RunResult

ROOT = Path(__file__).resolve().parents[1]

PROGRAM = textwrap.dedent(
    """
    from typing import Any

    from pydantic import BaseModel

    from hermes_agent import Agent, RunResult


    class City(BaseModel):
        name: str


    async def main(agent: Agent, schema: dict[str, Any]) -> None:
        reveal_type(agent.run("Oslo?", output_type=City))
        reveal_type(agent.run("Oslo?", output_type=City).data)
        reveal_type((await agent.arun("Oslo?", output_type=City)).data)
        reveal_type(agent.run("Cities?", output_type=list[City]).data)
        reveal_type(agent.run("Oslo?", output_type=schema).data)
        reveal_type(agent.run("Oslo?").data)
        typed: RunResult[City] = agent.run("Oslo?", output_type=City)
        wider: RunResult[BaseModel] = typed
        plain: RunResult = typed
        wrong: RunResult[int] = agent.run("Oslo?", output_type=City)
        typed.data.name
    """
)


def test_mypy_reads_data_as_the_output_type(tmp_path: Path) -> None:
    program = tmp_path / "program.py"
    program.write_text(PROGRAM, encoding="utf-8")
    stdout, stderr, _ = api.run(
        [
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--follow-imports",
            "silent",
            "--no-error-summary",
            "--hide-error-context",
            str(program),
        ]
    )
    assert not stderr
    lines = [_plain(line) for line in stdout.splitlines()]
    assert lines == [
        'note: Revealed type is "hermes_agent.types.RunResult[program.City]"',
        'note: Revealed type is "program.City | None"',
        'note: Revealed type is "program.City | None"',
        'note: Revealed type is "list[program.City] | None"',
        'note: Revealed type is "Any | None"',
        'note: Revealed type is "Any | None"',
        'error: Argument "output_type" to "run" of "Agent" has incompatible type "type[City]"; '
        'expected "type[int] | Mapping[str, Any] | None"  [arg-type]',
        'error: Item "None" of "City | None" has no attribute "name"  [union-attr]',
    ]


def _plain(line: str) -> str:
    """A line of mypy's output without its place, in the newer mypys' words (``builtins.``
    dropped, ``Union[X, None]`` written ``X | None``)."""
    line = re.sub(r"^.*?program\.py:\d+: ", "", line).replace("builtins.", "")
    return re.sub(r"Union\[(.*), None\]", r"\1 | None", line)


def test_the_type_parameter_changes_nothing_at_run_time() -> None:
    result = RunResult[int](output="3", status=200, request_id="r", session_id="s", data=3)
    assert type(result) is RunResult
    assert result.data == 3 and str(result) == "3"
    assert RunResult(output="", status=200, request_id="r", session_id="s").data is None
