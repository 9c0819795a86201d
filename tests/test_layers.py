"""The layers only call downward: the core (the agent and everything under it) imports no upper
layer — not at module level, not inside a function, not for type checking — and the package has
no import cycle, counting imports made inside functions too. Read from the source with ``ast``,
so a lazy import cannot hide."""

from __future__ import annotations

import ast
from pathlib import Path

# Tarjan's components, as the module-level cycle check in test_seams.py finds them.
try:
    from test_seams import _cycles
except ImportError:  # pragma: no cover - tests/ is a package
    from tests.test_seams import _cycles

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = "hermes_agent"

CORE = (
    "hermes_agent.agent",
    "hermes_agent.types",
    "hermes_agent.events",
    "hermes_agent.errors",
    "hermes_agent.config",
    "hermes_agent.demo_tools",
    "hermes_agent.protocol",
    "hermes_agent.tools",
    "hermes_agent.models",
    "hermes_agent.pipeline",
    "hermes_agent.memory",
    "hermes_agent.audit",
    "hermes_agent.storage",
    "hermes_agent.replay",
)
UPPER = (
    "hermes_agent.backends",
    "hermes_agent.runs",
    "hermes_agent.loading",
    "hermes_agent.server",
    "hermes_agent.worker",
    "hermes_agent.channels",
    "hermes_agent.mcp",
    "hermes_agent.cli",
    "hermes_agent.evals",
    "hermes_agent.tracing",
)


def _modules() -> dict[str, Path]:
    found = {}
    for path in (SRC / PACKAGE).rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _within(name: str, roots: tuple[str, ...]) -> bool:
    return any(name == root or name.startswith(root + ".") for root in roots)


def _imports(module: str) -> set[str]:
    """Every module of the package that ``module`` imports anywhere in its source."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    named: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            submodules = {f"{base}.{alias.name}" for alias in node.names}
            named.update(submodules)
            if not submodules <= MODULES.keys():  # a name the package itself defines
                named.add(base)
    found = set()
    for name in named:
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name and name != module and name.startswith(PACKAGE):
            found.add(name)
    return found


def test_the_core_imports_no_upper_layer_not_even_lazily() -> None:
    reaching_up = {
        module: sorted(t for t in _imports(module) if _within(t, UPPER))
        for module in MODULES
        if _within(module, CORE)
    }
    assert {m: t for m, t in reaching_up.items() if t} == {}


def test_the_package_has_no_import_cycle() -> None:
    # A package's __init__ re-exports its modules; an import of the package is an import of
    # what it re-exports, so the edge to an __init__ stands for the modules it names.
    graph = {module: _imports(module) for module in MODULES if module != PACKAGE}
    assert _cycles(graph) == []


def test_the_checks_see_a_lazy_import() -> None:
    assert "hermes_agent.tracing" in _imports("hermes_agent.loading")  # inside a function
    assert _within("hermes_agent.runs.local", UPPER)
    assert not _within("hermes_agent.agentx", CORE)


ENGINES = ("hermes_agent.runs.local", "hermes_agent.runs.in_process", "hermes_agent.worker")
"""The two engines: the in-process one and the queued one (both sides of the queue)."""

FRONT_DOORS = ("hermes_agent.server", "hermes_agent.mcp", "hermes_agent.channels", "hermes_agent.cli")

ENGINE_READERS = {
    # The composition root is the one place that builds an engine (``backends``); these
    # reach one for what a door cannot do through the seam, each for the reason given.
    "hermes_agent.server.routes_console": "an in-process run's live steps and its approvals "
    "as asked and answered, from memory: the run seam carries neither",
    "hermes_agent.cli.worker": "the worker command runs the queued engine",
    "hermes_agent.cli.runs": "the operator's commands on queued runs (list, requeue, cancel)",
}


def test_front_doors_reach_runs_through_the_seam_never_an_engine() -> None:
    reaching = {
        module: sorted(t for t in _imports(module) if _within(t, ENGINES))
        for module in MODULES
        if _within(module, FRONT_DOORS)
    }
    reaching = {module: found for module, found in reaching.items() if found}
    assert sorted(reaching) == sorted(m for m in ENGINE_READERS if m in MODULES)
    assert "hermes_agent.runs.local" in _imports("hermes_agent.backends")  # it builds them
