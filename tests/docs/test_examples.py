"""Each script in examples/ runs (the endpoint one against the local scripted server)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from openai_server import running_server, text

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(
    name: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def test_openai_endpoint_example() -> None:
    with running_server() as server:
        server.push(
            text(
                '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
            ),
            text("It is 21 degrees and clear in Paris."),
        )
        done = run_example(
            "openai_endpoint.py",
            "What's the weather in Paris?",
            env={"HERMES_BASE_URL": server.base_url, "HERMES_MODEL": "m"},
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "It is 21 degrees and clear in Paris."
        assert '"temperature": 21' in server.requests[1]["messages"][-1]["content"]


def test_embedded_calculator_example() -> None:
    done = run_example("embedded_calculator.py", "What is 12 * 12?")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("called calculator(")


def test_build_from_config_example_needs_no_cli(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import runpy, sys; sys.argv = sys.argv[1:];"
            "runpy.run_path(sys.argv[0], run_name='__main__');"
            "assert not any(m == 'typer' or m.startswith(('typer.', 'hermes_agent.cli'))"
            " for m in sys.modules), 'the example imported the CLI'",
            str(EXAMPLES / "build_from_config.py"),
            "What's the weather in Paris?",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "called get_weather({'city': 'Paris'}) -> "
        "{'city': 'Paris', 'temperature': 23, 'unit': 'celsius'}",
        "It is 23 °C in Paris.",
    ]
    assert list(tmp_path.iterdir()) == []  # no storage configured: nothing kept on disk
