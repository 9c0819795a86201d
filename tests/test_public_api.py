"""The public API is a documented list of modules, each with an ``__all__`` whose every name
exists; the code examples of the README, the docs and ``examples/`` import only those names;
the renamed storage modules keep working; and no module of the package grows past 800 lines."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

import hermes_agent

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "hermes_agent"
API_PAGE = ROOT / "docs" / "api.md"
MAX_LINES = 800


def _public_modules() -> list[str]:
    section = API_PAGE.read_text(encoding="utf-8").split("## Public modules", 1)[1]
    section = section.split("\n## ", 1)[0]
    return re.findall(r"^\| `(hermes_agent[\w.]*)` \|", section, re.M)


PUBLIC = _public_modules()


def _examples() -> list[tuple[str, str]]:
    """(where, source) of every Python code block of the README and docs, and every example."""
    found = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        if page.name == "decisions.md":
            continue  # the record of decisions quotes code as it was
        blocks = re.findall(r"```(?:python|py)\b[^\n]*\n(.*?)```", page.read_text("utf-8"), re.S)
        found += [(f"{page.name} block {n}", block) for n, block in enumerate(blocks, start=1)]
    for example in sorted((ROOT / "examples").glob("*.py")):
        found.append((f"examples/{example.name}", example.read_text(encoding="utf-8")))
    return found


def _offered(module: str) -> set[str]:
    return set(importlib.import_module(module).__all__)


def _declares_all(path: Path) -> bool:
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        if any(isinstance(target, ast.Name) and target.id == "__all__" for target in targets):
            return True
    return False


def _import_problems(where: str, source: str) -> list[str]:
    """What ``source`` imports from the package that is not public, one line each."""
    problems = []
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("hermes_agent.") and alias.name not in PUBLIC:
                    problems.append(f"{where}:{node.lineno}: import {alias.name} (not public)")
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module != "hermes_agent" and not node.module.startswith("hermes_agent."):
                continue
            if node.module not in PUBLIC:
                problems.append(f"{where}:{node.lineno}: from {node.module} (not public)")
                continue
            hidden = sorted(a.name for a in node.names if a.name not in _offered(node.module))
            if hidden:
                problems.append(f"{where}:{node.lineno}: {node.module} does not offer {hidden}")
    return problems


def test_the_api_page_and_the_package_docstring_name_the_same_public_modules() -> None:
    assert PUBLIC[0] == "hermes_agent" and len(PUBLIC) == len(set(PUBLIC)) >= 10
    assert hermes_agent.__doc__ is not None
    named = re.findall(r"^- ``(hermes_agent[\w.]*)``:", hermes_agent.__doc__, re.M)
    assert named == PUBLIC


@pytest.mark.parametrize("module", PUBLIC)
def test_every_name_a_public_module_offers_exists(module: str) -> None:
    imported = importlib.import_module(module)
    offered = imported.__all__
    assert offered and all(isinstance(name, str) for name in offered)
    assert len(offered) == len(set(offered)), "a name listed twice"
    assert [name for name in offered if not hasattr(imported, name)] == []


def test_every_package_that_declares_all_has_the_names_it_lists() -> None:
    # The implementation packages too: an __all__ is a promise inside the project as well.
    checked = []
    for init in sorted(SRC.rglob("__init__.py")):
        if not _declares_all(init):
            continue
        parts = init.relative_to(SRC.parent).parent.parts
        module = importlib.import_module(".".join(parts))
        checked.append(module.__name__)
        assert [n for n in module.__all__ if not hasattr(module, n)] == [], module.__name__
    assert {"hermes_agent", "hermes_agent.storage", "hermes_agent.runs"} <= set(checked)


def test_the_examples_import_only_public_names() -> None:
    examples = _examples()
    assert len(examples) > 50  # the README, the pages and examples/ were all read
    problems = [
        problem for where, source in examples for problem in _import_problems(where, source)
    ]
    assert problems == []


def test_the_check_sees_an_import_of_a_private_module_or_name() -> None:
    block = (
        "from hermes_agent import Agent, Message\n"
        "from hermes_agent.types import Message\n"
        "import hermes_agent.pipeline.loop\n"
        "def later():\n"
        "    from hermes_agent.storage import InMemoryStorage, replay\n"
    )
    assert _import_problems("block", block) == [
        "block:2: from hermes_agent.types (not public)",
        "block:3: import hermes_agent.pipeline.loop (not public)",
        "block:5: hermes_agent.storage does not offer ['replay']",
    ]


@pytest.mark.parametrize(
    "old",
    [
        "hermes_agent.storage.memory",
        "hermes_agent.storage.replay",
        "hermes_agent.server.events",
        "hermes_agent.mcp.client",
        "hermes_agent.mcp.schemas",
    ],
)
def test_modules_that_moved_before_the_first_release_left_no_old_path(old: str) -> None:
    # 0.1.0 is the first release: nobody imports the old paths, so none is kept.
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)


def test_replay_is_offered_by_its_own_module_only() -> None:
    from hermes_agent import replay as replay_module
    from hermes_agent import storage

    assert callable(replay_module.replay) and "replay" in replay_module.__all__
    assert not hasattr(storage, "replay") and not hasattr(storage, "ReplayReport")


def test_no_module_of_the_package_is_over_800_lines() -> None:
    lines = {
        str(path.relative_to(SRC)): len(path.read_text(encoding="utf-8").splitlines())
        for path in SRC.rglob("*.py")
    }
    assert len(lines) > 100
    assert {path: n for path, n in lines.items() if n > MAX_LINES} == {}
