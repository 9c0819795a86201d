"""``hermes_agent.testing`` (the tool-call text, the scripted model, ``override``), the page that
documents it and the test layout (docs/testing.md), and the rules that mark tests ``unit``,
``integration`` and ``slow`` (``marker_rules.py``)."""

from __future__ import annotations

import json
import re
import socket
import subprocess
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest

import hermes_agent
from hermes_agent import Agent
from hermes_agent.protocol.parser import parse_completion
from hermes_agent.testing import ScriptedModel, override, tool_call
from marker_rules import uses

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "testing.md"
SRC = ROOT / "src" / "hermes_agent"


# -- tool_call ------------------------------------------------------------------------------


def test_tool_call_is_the_block_a_hermes_model_writes() -> None:
    assert tool_call("add", a=2, b=3) == (
        '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    )
    assert tool_call("now") == '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'


def test_tool_call_takes_an_argument_called_name_and_escapes_what_json_escapes() -> None:
    text = tool_call("greet", name='Ada "the first"', city="长沙", nothing=None)
    assert "\\u957f" in text  # non-ASCII as JSON escapes, as json.dumps writes it
    (parsed,) = parse_completion(text).tool_calls
    assert parsed.name == "greet"
    assert parsed.arguments == {"name": 'Ada "the first"', "city": "长沙", "nothing": None}


def test_tool_calls_joined_are_calls_of_one_turn() -> None:
    completion = parse_completion(tool_call("a", x=1) + tool_call("b", y=[1, 2]))
    assert [(call.name, call.arguments) for call in completion.tool_calls] == [
        ("a", {"x": 1}),
        ("b", {"y": [1, 2]}),
    ]


def test_the_scripted_model_is_the_packages_own() -> None:
    assert ScriptedModel is hermes_agent.ScriptedModel
    result = Agent(model=ScriptedModel([tool_call("missing")])).run("hi")
    assert result.status == 502
    assert result.error == (
        "ScriptedModel ran out of responses after 1 completions; add more to its script"
    )


# -- override -------------------------------------------------------------------------------


def test_override_swaps_the_model_in_the_block_and_puts_it_back() -> None:
    first = ScriptedModel(["first"] * 2)
    agent = Agent(model=first)
    other = ScriptedModel(["other"])
    with override(agent, model=other) as same:
        assert same is agent
        assert agent.model is other
        assert agent.run("hi").output == "other"
    assert agent.model is first
    assert agent.run("hi").output == "first"
    assert len(other.requests) == 1 and len(first.requests) == 1


def test_override_puts_the_models_back_when_the_block_raises() -> None:
    model, answering = ScriptedModel([]), ScriptedModel([])
    agent = Agent(model=model, answer_model=answering)
    with pytest.raises(RuntimeError), override(agent, model=ScriptedModel([]), answer_model=None):
        assert agent.answer_model is None
        raise RuntimeError("inside")
    assert agent.model is model and agent.answer_model is answering


def test_override_of_the_answer_model_keeps_the_model() -> None:
    # The model's turns run until one calls no tool (its draft); then the answer model answers.
    model = ScriptedModel([tool_call("add", a=1, b=1), "a draft"])
    agent = Agent(model=model)

    @agent.tool
    def add(a: int, b: int) -> int:
        return a + b

    answering = ScriptedModel(["two"], name="answering")
    with override(agent, answer_model=answering):
        assert agent.model is model
        assert agent.run("1 + 1?").output == "two"
    assert agent.answer_model is None
    assert len(answering.requests) == 1 and len(model.requests) == 2


def test_override_refuses_what_is_not_a_model() -> None:
    agent = Agent(model=ScriptedModel([]))
    with pytest.raises(TypeError, match="needs a model, got str"):  # noqa: SIM117
        with override(agent, model="scripted"):  # type: ignore[arg-type]
            pass
    assert isinstance(agent.model, ScriptedModel)


# -- docs/testing.md ------------------------------------------------------------------------


def test_the_pages_examples_run_in_order() -> None:
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S)
    assert len(blocks) >= 5
    namespace: dict[str, object] = {"__name__": "docs_testing"}
    for number, block in enumerate(blocks, start=1):
        exec(compile(block, f"testing.md (python block {number})", "exec"), namespace)


def _map_rows() -> list[tuple[list[str], str, list[str]]]:
    text = PAGE.read_text(encoding="utf-8").split("## Where the tests of a module are", 1)[1]
    rows = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("source", "---"):
            continue
        [folder] = re.findall(r"`([^`]+)`", cells[1])
        rows.append(
            (re.findall(r"`([^`]+)`", cells[0]), folder, re.findall(r"`([^`]+)`", cells[2]))
        )
    return rows


def test_the_map_names_every_test_file_in_its_folder_and_every_part_of_the_package() -> None:
    rows = _map_rows()
    tests = ROOT / "tests"
    on_disk = {
        (path.parent.relative_to(ROOT).as_posix() + "/", path.name)
        for path in tests.rglob("test_*.py")
    }
    named = {(folder, f"test_{stem}.py") for _, folder, stems in rows for stem in stems}
    assert not on_disk - named, (
        "docs/testing.md, 'Where the tests of a module are': add these test files to the row "
        f"of what they test, in their folder: {sorted(on_disk - named)}"
    )
    names = [name for _, name in on_disk]
    assert len(names) == len(set(names)), "test file names are unique across the folders"
    missing = {name for _, name in named} - set(names)
    assert not missing, f"the map names missing test files: {missing}"

    sources = [
        source for paths, _, _ in rows for source in paths if not source.startswith("tests/")
    ]
    for source in sources:
        assert list(SRC.glob(source.rstrip("/"))), f"the map names {source}, not in the package"
    for helper in [
        source for paths, _, _ in rows for source in paths if source.startswith("tests/")
    ]:
        assert (ROOT / helper).is_file(), helper
    parts = {
        path.name
        for path in SRC.iterdir()
        if path.name not in ("__init__.py", "__main__.py", "py.typed", "__pycache__")
        and (path.is_dir() or path.suffix == ".py")
    }
    tops = {source.rstrip("/").split("/")[0] for source in sources}
    covered = {part for part in parts if any(fnmatch(part, top) for top in tops)}
    assert not parts - covered, f"parts of src/hermes_agent with no row: {sorted(parts - covered)}"


def test_the_folders_of_tests_mirror_the_packages_of_the_library() -> None:
    """Each folder of tests/ but harness/ and docs/ is a package of src/hermes_agent/."""
    tests = ROOT / "tests"
    for folder in tests.rglob("*/"):
        if folder.name == "__pycache__" or not any(folder.glob("test_*.py")):
            continue
        relative = folder.relative_to(tests)
        if relative.parts[0] in ("harness", "docs"):
            continue
        assert (SRC / relative / "__init__.py").is_file(), f"tests/{relative}/ mirrors no package"


# -- marker rules ---------------------------------------------------------------------------


def _in_process() -> dict[str, Any]:
    return json.loads(tool_call("a", b=1).split("\n")[1])


def _with_a_socket() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))


def _through_a_helper() -> None:
    _with_a_socket()


def _importing_psycopg() -> None:
    import psycopg  # noqa: F401


def _loading_the_embedded_model() -> None:
    from hermes_agent.models import llamacpp

    llamacpp.bundled_model_path()


def _runs_git() -> None:
    subprocess.run(["git", "--version"], check=True, capture_output=True)


def test_a_test_that_uses_nothing_real_is_a_unit_test(request: pytest.FixtureRequest) -> None:
    found = uses(_in_process, test_modules={__name__})
    assert not found.integration and not found.slow
    # This test itself was marked so by the conftest.
    assert request.node.get_closest_marker("unit") is not None
    assert request.node.get_closest_marker("integration") is None


@pytest.mark.unit  # it names the helpers above without calling them, which the rules cannot see
def test_what_a_test_or_its_helpers_use_makes_it_an_integration_test() -> None:
    assert uses(_with_a_socket, test_modules={__name__}).reasons == {"a socket"}
    assert uses(_through_a_helper, test_modules={__name__}).reasons == {"a socket"}
    assert uses(_importing_psycopg).reasons == {"PostgreSQL"}
    assert uses(_loading_the_embedded_model).slow
    assert uses(_runs_git).reasons == {"a subprocess"}
    assert not uses(_runs_git).slow
    # Helpers are followed through the modules of tests/, not into the library (whose code
    # opens sockets and starts processes only when a test asks it to in a way seen above).
    assert not uses(Agent.run).integration
    # A fixture counts as the test's own code.
    assert uses(_in_process, fixtures=[_with_a_socket], test_modules={__name__}).integration


def test_the_storage_parameter_and_the_embedded_marker_count() -> None:
    assert not uses(_in_process, params={"url": "sqlite"}).integration
    assert uses(_in_process, params={"db_url": "postgresql"}).reasons == {"PostgreSQL"}
    embedded = uses(_in_process, markers=["embedded"])
    assert embedded.integration and embedded.slow
