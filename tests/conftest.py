"""The test session's ground rules: nothing outside temporary folders changes.

- Every test runs in its own temporary working folder (fixtures of wider scope in one for the
  session), so code that writes under the working folder (the command line's
  ``.hermes/state.db``, an eval report) writes there, and a subprocess inherits it.
- Hypothesis keeps no example database and puts its caches in a folder of the system's
  temporary folder, not in ``.hypothesis/`` of the working folder; the folder is kept from one
  session to the next, so the constants Hypothesis reads from the tests' modules at collection
  are read again only where a module changed.
- The session records the checkout's state when it starts; ``test_zz_clean_tree.py``, the
  last test file, fails when the run changed it or ``~/.hermes``.

The folders of tests/ follow ``src/hermes_agent/``: the tests of a module are in the folder of
its package (``tests/worker/`` for ``hermes_agent.worker``, tests/ itself for the top-level
modules). The helpers they share are in ``tests/harness/`` (on ``sys.path``: pytest's
``pythonpath``). Test modules are imported by their file names, which are unique across the
folders; every folder is on ``sys.path``, so a test module imports another by its name wherever
either lives (``from test_channels import Receiver``).

Two fixtures the worker tests share (``worker/test_worker_runs.py``, ``test_worker_attacks.py``):
``url``, an empty SQL database (SQLite in tmp_path, then a throwaway PostgreSQL database), and
``cleanup``, a list whose entries are closed, last first, when the test ends.

Every test is marked ``unit``, ``integration`` or ``integration`` and ``slow`` by what it uses
(the rules are in ``harness/marker_rules.py``), so ``pytest -m unit`` runs the fast, in-process
tests alone; the header of a run says how many of each were collected. ``test_zz_clean_tree.py``
runs after every other test, whatever the folders.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis.configuration import set_hypothesis_home_dir

from marker_rules import STORAGE_FIXTURES, uses
from storage_backends import _url
from tree_guard import ROOT, TREE_AT_START, snapshot

_HYPOTHESIS_HOME = pytest.StashKey[Path]()

settings.register_profile("hermes-tests", database=None)
settings.load_profile("hermes-tests")


def pytest_configure(config: pytest.Config) -> None:
    home = Path(tempfile.gettempdir()) / f"hermes-tests-hypothesis-{os.getuid()}"
    try:
        home.mkdir(mode=0o700, exist_ok=True)
        kept = home.is_dir() and not home.is_symlink() and home.stat().st_uid == os.getuid()
    except OSError:
        kept = False
    if not kept:  # someone else's, or no such folder can be made: one for this session
        home = Path(tempfile.mkdtemp(prefix="hermes-tests-hypothesis-"))
        config.stash[_HYPOTHESIS_HOME] = home
    set_hypothesis_home_dir(home)


def pytest_unconfigure(config: pytest.Config) -> None:
    home = config.stash.get(_HYPOTHESIS_HOME, None)
    if home is not None:
        shutil.rmtree(home, ignore_errors=True)


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[TREE_AT_START] = snapshot(ROOT, Path.home())


TESTS = Path(__file__).resolve().parent
_OWN_MARKS = ("unit", "integration", "slow")
_LAST = "test_zz_clean_tree"

for _folder in sorted(TESTS.glob("**/")):
    if _folder.name != "__pycache__" and str(_folder) not in sys.path:
        sys.path.append(str(_folder))


def _test_modules() -> set[str]:
    """The modules of tests/ imported so far (test files and their harnesses)."""
    stems = {path.stem for path in TESTS.rglob("*.py")}
    found = set()
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        # A module of tests/ has the name of one of its files: only those are resolved.
        if path and Path(path).stem in stems and Path(path).resolve().is_relative_to(TESTS):
            found.add(name)
    return found


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects by these marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    modules = _test_modules()
    for item in items:
        if not isinstance(item, pytest.Function):
            continue
        markers = {mark.name for mark in item.iter_markers()}
        if markers & set(_OWN_MARKS):
            continue
        definitions = item._fixtureinfo.name2fixturedefs
        fixtures = [
            definitions[name][-1].func
            for name in item.fixturenames
            if name in definitions and name not in STORAGE_FIXTURES
        ]
        params = item.callspec.params if hasattr(item, "callspec") else {}
        found = uses(item.function, fixtures, params, markers, modules)
        if found.integration:
            item.add_marker(pytest.mark.integration)
        if found.slow:
            item.add_marker(pytest.mark.slow)
        if not found.integration and not found.slow:
            item.add_marker(pytest.mark.unit)
        reasons = [*sorted(found.reasons), found.slow_in_process or ""]
        item.user_properties.append(("uses", ", ".join(filter(None, reasons)) or "nothing real"))
    # The check that the run left the checkout unchanged goes last.
    items.sort(key=lambda item: item.module is not None and item.module.__name__ == _LAST)


def pytest_collection_finish(session: pytest.Session) -> None:
    counts = dict.fromkeys(_OWN_MARKS, 0)
    for item in session.items:
        for mark in _OWN_MARKS:
            counts[mark] += item.get_closest_marker(mark) is not None
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and session.items:
        reporter.write_line(
            f"selected by marker: {counts['unit']} unit, {counts['integration']} integration, "
            f"{counts['slow']} slow"
        )


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


@pytest.fixture
def pg_url(tmp_path: Path) -> Iterator[str]:
    """A throwaway PostgreSQL database's URL (skipped when no server answers)."""
    yield from _url("postgresql", tmp_path)
