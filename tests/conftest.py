"""The test session's ground rules: nothing outside temporary folders changes.

- Every test runs in its own temporary working folder (fixtures of wider scope in one for the
  session), so code that writes under the working folder (the command line's
  ``.hermes/state.db``, an eval report) writes there, and a subprocess inherits it.
- Hypothesis keeps no example database and puts its caches in a temporary folder, not in
  ``.hypothesis/`` of the working folder.
- The session records the checkout's state when it starts; ``test_zz_clean_tree.py``, the
  last test file, fails when the run changed it or ``~/.hermes``.

Two fixtures the worker tests share (``test_worker_runs.py``, ``test_worker_attacks.py``):
``url``, an empty SQL database (SQLite in tmp_path, then a throwaway PostgreSQL database), and
``cleanup``, a list whose entries are closed, last first, when the test ends.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis.configuration import set_hypothesis_home_dir

from storage_backends import _url
from tree_guard import ROOT, TREE_AT_START, snapshot

_HYPOTHESIS_HOME = pytest.StashKey[Path]()

settings.register_profile("hermes-tests", database=None)
settings.load_profile("hermes-tests")


def pytest_configure(config: pytest.Config) -> None:
    home = Path(tempfile.mkdtemp(prefix="hermes-tests-hypothesis-"))
    config.stash[_HYPOTHESIS_HOME] = home
    set_hypothesis_home_dir(home)


def pytest_unconfigure(config: pytest.Config) -> None:
    home = config.stash.get(_HYPOTHESIS_HOME, None)
    if home is not None:
        shutil.rmtree(home, ignore_errors=True)


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[TREE_AT_START] = snapshot(ROOT, Path.home())


@pytest.fixture(scope="session", autouse=True)
def _session_in_a_temporary_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path_factory.mktemp("session-cwd"))
        yield


@pytest.fixture(autouse=True)
def _test_in_a_temporary_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty SQL database: SQLite in tmp_path, then a throwaway PostgreSQL database."""
    yield from _url(request.param, tmp_path)


@pytest.fixture
def cleanup() -> Iterator[list[Any]]:
    """Things to close when the test ends (``close()``, last added first)."""
    things: list[Any] = []
    yield things
    for thing in reversed(things):
        thing.close()
