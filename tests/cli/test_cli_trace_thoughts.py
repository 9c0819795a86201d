"""``hermes-agent trace show`` prints each step's thought whole, as the parser reads it from
the recorded completion, with a note for a call seen inside it (never run)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from hermes_agent.cli import app
from hermes_agent.protocol.parser import NOTE_CALL_IN_THOUGHT, NOTE_REVEALED_THOUGHT

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "17 * 23"}}</tool_call>'
# Inside the thought: a call that must not run, and text Rich would read as markup or emoji.
IN_THOUGHT = '<tool_call>{"name": "calculator", "arguments": {"expression": "1/0"}}</tool_call>'
THOUGHT = f"Maybe {IN_THOUGHT}? No: that fails.\nUse [bold]17 * 23[/bold] :smile: instead."

runner = CliRunner()


def config(folder: Path, *responses: str) -> Path:
    path = folder / "config.yaml"
    listed = "".join(f"\n    - {json.dumps(response)}" for response in responses)
    path.write_text(
        f"model:\n  provider: scripted\n  responses:{listed}\n"
        f"storage:\n  url: sqlite:///{folder / 'state.db'}\n"
    )
    return path


def run_and_show(folder: Path, *responses: str) -> tuple[dict[str, object], list[str]]:
    """Runs the scripted turns; returns the run's result and `trace show`'s lines."""
    path = config(folder, *responses)
    done = runner.invoke(app, ["run", "--config", str(path), "--json", "What is 17 * 23?"])
    assert done.exit_code == 0, done.output
    result = json.loads(done.stdout)
    shown = runner.invoke(app, ["trace", "show", result["request_id"], "--config", str(path)])
    assert shown.exit_code == 0, shown.output
    return result, shown.stdout.splitlines()


def section(lines: list[str], step: int) -> list[str]:
    """The lines printed for one step's thought: from its heading to the next heading."""
    start = lines.index(f"step {step} · thought") + 1
    end = next((i for i in range(start, len(lines)) if lines[i].endswith("· thought")), len(lines))
    return lines[start:end]


def test_trace_show_prints_the_thought_whole_with_a_note_for_the_call_in_it(
    tmp_path: Path,
) -> None:
    result, lines = run_and_show(tmp_path, f"<think>{THOUGHT}</think>\n{CALL}", "It is 391.")

    assert result["output"] == "It is 391."
    # Only the call after </think> ran.
    assert [c["arguments"] for c in result["tool_calls"]] == [{"expression": "17 * 23"}]
    assert section(lines, 0) == [*THOUGHT.splitlines(), f"note: {NOTE_CALL_IN_THOUGHT}"]
    # The second turn thought nothing: no section for it.
    assert "step 1 · thought" not in lines


def test_trace_show_reads_a_pre_opened_thought(tmp_path: Path) -> None:
    # The chat template opened <think> in the prompt: only the bare </think> is in the output.
    result, lines = run_and_show(tmp_path, f"{THOUGHT}\n</think>\n\nIt is 391.")

    assert result["output"] == "It is 391." and result["tool_calls"] == []
    assert section(lines, 0) == [
        *THOUGHT.splitlines(),
        f"note: {NOTE_REVEALED_THOUGHT}",
        f"note: {NOTE_CALL_IN_THOUGHT}",
    ]


def test_trace_show_prints_no_thought_section_for_a_model_that_does_not_think(
    tmp_path: Path,
) -> None:
    _, lines = run_and_show(tmp_path, CALL, "It is 391.")
    assert not [line for line in lines if line.endswith("· thought")]
    assert any("ToolExecutor" in line for line in lines)
