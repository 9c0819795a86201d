"""Every exception class the package defines is in one tree under ``HermesAgentError``, and
errors.py's docstring draws that tree as it is."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import hermes_agent
from hermes_agent import errors
from hermes_agent.errors import HermesAgentError

# Modules whose import needs an optional extra that may be missing; the rest must import.
OPTIONAL_MODULE_PREFIXES = (
    "hermes_agent.models.llamacpp",
    "hermes_agent.mcp",
    "hermes_agent.tracing",
)


def _package_exceptions() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(hermes_agent.__path__, "hermes_agent."):
        if info.name == "hermes_agent.__main__":
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:
            if info.name.startswith(OPTIONAL_MODULE_PREFIXES):
                continue
            raise
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__ == module.__name__  # defined here, not imported
            ):
                found[f"{module.__name__}.{name}"] = obj
    return found


def _drawn() -> dict[str, str | None]:
    """Each class drawn in errors.py's docstring, with the class drawn as its parent."""
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    for line in (errors.__doc__ or "").splitlines():
        match = re.match(r"^(\s*)((?:[│ ]   )*)(?:[├└]── )?([A-Z][A-Za-z]+)\s", line + " ")
        if not match or not re.search(r"[├└]── |^    HermesAgentError", line):
            continue
        depth = 0 if "──" not in line else len(match.group(2)) // 4 + 1
        name = match.group(3)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parents[name] = stack[-1][1] if stack else None
        stack.append((depth, name))
    return parents


def test_every_public_exception_is_under_the_root() -> None:
    outside = sorted(
        path
        for path, cls in _package_exceptions().items()
        if not path.rsplit(".", 1)[1].startswith("_") and not issubclass(cls, HermesAgentError)
    )
    assert outside == []


def test_the_docstring_draws_the_tree_as_it_is() -> None:
    public = {
        path.rsplit(".", 1)[1]: cls
        for path, cls in _package_exceptions().items()
        if not path.rsplit(".", 1)[1].startswith("_")
    }
    drawn = _drawn()
    assert set(drawn) == set(public), "drawn but not defined, or defined but not drawn"
    for name, parent in drawn.items():
        cls = public[name]
        if parent is None:
            assert cls is HermesAgentError
        else:
            # The parent drawn is the class's nearest base in the tree.
            assert cls.__mro__[1:][0].__name__ == parent or parent in [
                base.__name__ for base in cls.__bases__
            ], (name, parent)


def test_the_exports_the_docstring_names_are_exported() -> None:
    text = " ".join((errors.__doc__ or "").split())
    exported = re.search(r"exports the ones a caller of the library handles: (.*?)\. ", text)
    assert exported is not None
    names = re.findall(r"``(\w+)``", exported.group(1))
    assert len(names) == 10
    for name in names:
        assert issubclass(getattr(hermes_agent, name), HermesAgentError), name


def test_older_callers_still_catch_the_builtin_kinds() -> None:
    from hermes_agent.runs.backend import RunNotFound
    from hermes_agent.runs.events import UnknownEvent
    from hermes_agent.tools.runtime import ClosedError

    assert issubclass(RunNotFound, LookupError)
    assert issubclass(UnknownEvent, ValueError)
    assert issubclass(ClosedError, RuntimeError)
