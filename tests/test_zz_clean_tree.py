"""The last test file of a run (named to sort last): the run left the checkout and ``~/.hermes``
as it found them. The state at the start is recorded by ``conftest.py``; the checks of
``tree_guard`` are tested here on a scratch repository."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tree_guard import ROOT, TREE_AT_START, changes, snapshot

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


@needs_git
def test_the_run_left_the_checkout_and_home_unchanged(pytestconfig: pytest.Config) -> None:
    before = pytestconfig.stash.get(TREE_AT_START, None)
    if before is None:
        pytest.skip(f"{ROOT} is not a git checkout: nothing to compare against")
    after = snapshot(ROOT, Path.home())
    assert after is not None
    found = changes(before, after)
    assert not found, (
        "the test run changed files outside temporary folders (or someone edited these while "
        "it ran):\n  " + "\n  ".join(found)
    )


def git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=repo,
        check=True,
        capture_output=True,
    )


@pytest.fixture
def scratch(tmp_path: Path) -> tuple[Path, Path]:
    repo, home = tmp_path / "repo", tmp_path / "home"
    repo.mkdir()
    home.mkdir()
    git(repo, "init", "-q")
    (repo / ".gitignore").write_text(".hermes/\n__pycache__/\n", encoding="utf-8")
    (repo / "kept.py").write_text("x = 1\n", encoding="utf-8")
    (repo / ".hermes").mkdir()
    (repo / ".hermes" / "state.db").write_text("old", encoding="utf-8")
    git(repo, "add", ".gitignore", "kept.py")
    git(repo, "commit", "-q", "-m", "start")
    return repo, home


@needs_git
def test_an_untouched_tree_has_no_changes(scratch: tuple[Path, Path]) -> None:
    repo, home = scratch
    before = snapshot(repo, home)
    assert before is not None
    (repo / "__pycache__").mkdir()
    (repo / "__pycache__" / "kept.cpython-311.pyc").write_bytes(b"cache")  # a cache: allowed
    after = snapshot(repo, home)
    assert after is not None and changes(before, after) == []


@needs_git
@pytest.mark.parametrize(
    ("write", "expected"),
    [
        (lambda repo, home: (repo / "eval-report.json").write_text("{}"), "eval-report.json"),
        (lambda repo, home: (repo / "kept.py").write_text("x = 2\n"), "kept.py"),
        (
            lambda repo, home: (repo / ".hermes" / "state.db").write_text("new and longer"),
            "changed: .hermes/state.db",
        ),
        (
            lambda repo, home: (repo / ".hermes" / "bfcl-report.json").write_text("{}"),
            "written: .hermes/bfcl-report.json",
        ),
        (
            lambda repo, home: ((home / ".hermes").mkdir(), (home / ".hermes" / "s.db").touch()),
            "written: ~/.hermes/s.db",
        ),
    ],
    ids=["new-file", "tracked-file", "ignored-file", "file-in-ignored-folder", "home"],
)
def test_a_write_outside_temporary_folders_is_found(
    scratch: tuple[Path, Path], write: object, expected: str
) -> None:
    repo, home = scratch
    before = snapshot(repo, home)
    assert before is not None
    write(repo, home)  # type: ignore[operator]
    after = snapshot(repo, home)
    assert after is not None
    found = changes(before, after)
    assert any(expected in line for line in found), found


@needs_git
def test_a_new_hermes_folder_in_the_checkout_is_found(scratch: tuple[Path, Path]) -> None:
    repo, home = scratch
    shutil.rmtree(repo / ".hermes")
    before = snapshot(repo, home)
    assert before is not None
    (repo / ".hermes").mkdir()
    (repo / ".hermes" / "state.db").write_text("")
    after = snapshot(repo, home)
    assert after is not None
    assert changes(before, after) == [
        "git status: new entry '!! .hermes/'",
        "written: .hermes/state.db",
    ]
