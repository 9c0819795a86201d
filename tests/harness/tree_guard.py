"""What a test run may not change: the checkout (as ``git status`` sees it, ignored files
included) and ``~/.hermes``. ``snapshot`` records both; ``changes`` says what differs.

Tool caches (``__pycache__``, ``.pytest_cache`` and the like) and virtual environments are left
out: Python and pytest write them whatever the tests do.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

CACHES = frozenset(
    {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".venv", "venv", ".ci-venv"}
)
HOME_WATCHED = ".hermes"

Signature = tuple[int, int]
"""A file's size and modification time (ns)."""

ROOT = Path(__file__).resolve().parents[2]
"""The checkout the tests belong to."""


@dataclass(frozen=True)
class Snapshot:
    """The checkout's ``git status`` entries (modified, untracked, ignored) with the size and
    modification time of every file under them, and the files under ``~/.hermes``."""

    entries: frozenset[str]
    files: dict[str, Signature]
    home_files: dict[str, Signature]


TREE_AT_START = pytest.StashKey["Snapshot | None"]()
"""Where ``conftest.py`` keeps the snapshot taken when the session started."""


def snapshot(root: Path, home: Path) -> Snapshot | None:
    """The state of the checkout at ``root`` and of ``home/.hermes``; ``None`` when ``root`` is
    not a git checkout (nothing to compare against then)."""
    git = shutil.which("git")
    if git is None:
        return None
    done = subprocess.run(
        [git, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--ignored=matching"],
        cwd=root,
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        return None
    entries = frozenset(
        entry
        for entry in _entries(done.stdout.decode("utf-8", "surrogateescape"))
        if not _cached(entry[3:])
    )
    files: dict[str, Signature] = {}
    for entry in entries:
        files.update(_signatures(root, entry[3:].rstrip("/")))
    return Snapshot(entries, files, _signatures(home, HOME_WATCHED))


def changes(before: Snapshot, after: Snapshot) -> list[str]:
    """What differs from ``before`` to ``after``, one line per path; empty when nothing does."""
    found = [f"git status: new entry {entry!r}" for entry in sorted(after.entries - before.entries)]
    found += [
        f"git status: entry gone {entry!r}" for entry in sorted(before.entries - after.entries)
    ]
    found += _compare("", before.files, after.files)
    found += _compare("~/", before.home_files, after.home_files)
    return found


def _compare(prefix: str, before: dict[str, Signature], after: dict[str, Signature]) -> list[str]:
    lines = []
    for path in sorted(before.keys() | after.keys()):
        if path not in before:
            lines.append(f"written: {prefix}{path}")
        elif path not in after:
            lines.append(f"deleted: {prefix}{path}")
        elif before[path] != after[path]:
            lines.append(f"changed: {prefix}{path}")
    return lines


def _entries(output: str) -> list[str]:
    """``XY path`` entries of ``git status --porcelain=v1 -z``; a rename's or copy's second
    field (the path it came from) is not an entry of its own."""
    tokens = iter(output.split("\0"))
    found = []
    for token in tokens:
        if not token:
            continue
        found.append(token)
        if "R" in token[:2] or "C" in token[:2]:
            next(tokens, None)
    return found


def _cached(path: str) -> bool:
    return any(part in CACHES for part in Path(path).parts)


def _signatures(base: Path, relative: str) -> dict[str, Signature]:
    """Every file at or under ``base/relative`` (caches left out), by its path under ``base``."""
    top = base / relative
    if top.is_symlink() or top.is_file():
        return {relative: _signature(top)}
    found: dict[str, Signature] = {}
    for folder, subfolders, names in os.walk(top):
        subfolders[:] = [name for name in subfolders if name not in CACHES]
        for name in names:
            path = Path(folder) / name
            found[path.relative_to(base).as_posix()] = _signature(path)
    return found


def _signature(path: Path) -> Signature:
    try:
        status = path.lstat()
    except FileNotFoundError:
        return (-1, -1)
    return (status.st_size, status.st_mtime_ns)
