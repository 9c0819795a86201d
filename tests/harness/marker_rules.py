"""Which tests are ``unit``, ``integration`` and ``slow``, read from what each test uses.

``tests/conftest.py`` marks every collected test with these rules, so a new test needs no
marker of its own. A test is

- ``integration`` when it, one of its fixtures, or a helper of the tests it calls (followed
  through ``tests/`` modules, not into the library) uses something real: a server on a
  socket (uvicorn, the test harnesses' ``serve``/``running_server``), PostgreSQL, Redis,
  RabbitMQ, a subprocess, worker processes, a browser or the embedded model;
- ``slow`` as well when that real thing takes seconds to start or to finish (the embedded
  model, a browser, a cluster of worker processes, a PostgreSQL server of its own); an
  in-process test measured to take seconds is ``slow`` alone (``SLOW_TESTS``);
- ``unit`` otherwise: in-process, in-memory or SQLite, the ASGI transport, a scripted model.

A test's own ``@pytest.mark.integration``/``slow``/``unit`` wins over the rules.
"""

from __future__ import annotations

import dis
import functools
import importlib
import inspect
import sys
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parents[1]
# Modules of tests/ that are not followed: these rules themselves, whose tables name every
# real thing, and the conftest that applies them.
NOT_FOLLOWED = frozenset({"marker_rules", "conftest"})

# Modules whose use makes a test an integration test, with why (prefix match on the name).
REAL_MODULES: Mapping[str, str] = {
    "uvicorn": "a uvicorn server",
    "socket": "a socket",
    "http.server": "a server on a socket",
    "socketserver": "a server on a socket",
    "aiosmtpd": "an SMTP server",
    "subprocess": "a subprocess",
    "multiprocessing": "worker processes",
    "psycopg": "PostgreSQL",
    "redis": "Redis",
    "celery": "a broker (Redis or RabbitMQ)",
    "kombu": "a broker (Redis or RabbitMQ)",
    "hermes_agent.worker.client": "a broker (Redis or RabbitMQ)",
    "aio_pika": "RabbitMQ",
    "aiormq": "RabbitMQ",
    "pika": "RabbitMQ",
    "playwright": "a browser",
    "llama_cpp": "the embedded model",
    "hermes_agent.models.llamacpp": "the embedded model",
    "hermes_agent.worker.app": "worker processes",
    "hermes_agent.tools.sandbox": "tool worker processes",
    "hermes_agent.cli.llama_server": "a llama.cpp server",
}

# What of those is slow as well: seconds to start, or to run.
SLOW_REASONS = frozenset(
    {"a browser", "the embedded model", "worker processes", "a PostgreSQL server of its own"}
)

# Helpers in tests/ that stand for a real thing (checked before looking inside them).
REAL_HELPERS: Mapping[tuple[str, str], str] = {
    ("server_harness", "serve"): "a uvicorn server",
    ("openai_server", "running_server"): "a uvicorn server",
    ("step_model", "running_step_model"): "a uvicorn server",
    ("worker_harness", "cluster"): "worker processes",
    ("worker_harness", "Cluster"): "worker processes",
    ("fault_harness", "own_postgres"): "a PostgreSQL server of its own",
    ("fault_harness", "OwnPostgres"): "a PostgreSQL server of its own",
    ("fault_harness", "FaultCluster"): "worker processes",
    ("llama_context_harness", "raw_loaded"): "the embedded model",
}

# Literal strings that say what a test starts: a tool's ``execution_mode="subprocess"`` (a pool of
# tool worker processes), ``--model embedded`` / ``provider: embedded`` (the embedded model).
REAL_STRINGS: Mapping[str, str] = {
    "subprocess": "tool worker processes",
    "embedded": "the embedded model",
}

# Test modules about one real thing that their names do not show (``Agent()`` with no model
# loads the embedded one).
MODULE_REASONS: Mapping[str, str] = {"test_embedded_e2e": "the embedded model"}

# Tests whose real thing is out of sight of the rules (deep in the library).
NAMED_TESTS: Mapping[str, str] = {
    "test_bfcl::test_setup_installs_bfcl_eval_into_its_own_folder_only": "a subprocess",
}

# In-process tests measured to take seconds on two busy cores: ``slow``, not ``unit``.
SLOW_TESTS: Mapping[str, str] = {
    "test_grammar::test_every_rule_reference_is_defined": "a regex of every grammar rule",
    "test_types::test_mypy_reads_data_as_the_output_type": "mypy over the package, uncached",
}

# Parametrized storage fixtures: the parameter, not the fixture's code, says what is real.
STORAGE_FIXTURES = frozenset({"url", "db_url", "sql_url"})
STORAGE_PARAMS: Mapping[str, str] = {"postgresql": "PostgreSQL"}

# Test modules that are unit tests whatever they use: the check that a run left the checkout
# unchanged (it runs git, briefly) belongs to every selection.
ALWAYS_UNIT = frozenset({"test_zz_clean_tree"})

# Markers that say what a test uses.
MARKER_REASONS: Mapping[str, str] = {"embedded": "the embedded model"}


@dataclass
class Uses:
    """What a test was found to use (``reasons``), and the marks that follow."""

    reasons: set[str] = field(default_factory=set)

    slow_in_process: str | None = None

    @property
    def integration(self) -> bool:
        return bool(self.reasons)

    @property
    def slow(self) -> bool:
        return bool(self.reasons & SLOW_REASONS) or self.slow_in_process is not None


def _module_reason(name: str) -> str | None:
    for prefix, reason in REAL_MODULES.items():
        if name == prefix or name.startswith(prefix + "."):
            return reason
    return None


class _Walker:
    """Follows the names a code object uses, through the tests' own helpers.

    What each function, code object and class of the tests leads to is worked out once and
    kept (``found``), so a helper that a thousand tests call is read once per session, not once
    per test. An answer that leaned on a helper still being read further up (a cycle) is not
    kept: it is read again when asked.
    """

    def __init__(self, test_modules: Iterable[str]) -> None:
        self.test_modules = set(test_modules)
        self.found: dict[object, frozenset[str]] = {}
        self.open: set[object] = set()
        self.waiting: list[set[object]] = [set()]

    def function(self, function: Callable[..., Any]) -> frozenset[str]:
        function = inspect.unwrap(function)
        code = getattr(function, "__code__", None)
        if code is None:
            return frozenset()
        return self.code(code, getattr(function, "__globals__", {}))

    def _kept(self, key: object, read: Callable[[set[str]], object]) -> frozenset[str]:
        """What ``key`` leads to: kept from before, or ``read`` into a new set. The answer is
        kept unless it leaned on a part of the tests still being read further up (a cycle)."""
        if key in self.found:
            return self.found[key]
        if key in self.open:
            self.waiting[-1].add(key)
            return frozenset()
        self.open.add(key)
        self.waiting.append(set())
        reasons: set[str] = set()
        try:
            read(reasons)
        finally:
            self.open.discard(key)
            waiting = self.waiting.pop() - {key}
        answer = frozenset(reasons)
        if waiting:
            self.waiting[-1] |= waiting
        else:
            self.found[key] = answer
        return answer

    def code(self, code: types.CodeType, namespace: Mapping[str, Any]) -> frozenset[str]:
        key = (id(code), id(namespace))  # code objects compare by value: two modules' copies differ
        return self._kept(key, lambda reasons: self._read_code(code, namespace, reasons))

    def _read_code(
        self, code: types.CodeType, namespace: Mapping[str, Any], reasons: set[str]
    ) -> None:
        imported = ""
        for instruction in _import_instructions(code):
            if instruction.opname == "IMPORT_NAME":
                imported = str(instruction.argval)
                reason = _module_reason(imported)
                if reason:
                    reasons.add(reason)
            elif instruction.opname == "IMPORT_FROM":
                # ``from hermes_agent.models import llamacpp``: a submodule by its full name.
                reason = _module_reason(f"{imported}.{instruction.argval}")
                if reason:
                    reasons.add(reason)
                # ``from server_harness import serve`` inside a function: follow it as a global.
                module = self.test_module(imported)
                if module is not None and hasattr(module, str(instruction.argval)):
                    reasons |= self.thing(getattr(module, str(instruction.argval)))
        for name in code.co_names:
            if name in namespace:
                reasons |= self.thing(namespace[name])
        if "executable" in code.co_names and namespace.get("sys") is sys:
            reasons.add("a subprocess")  # sys.executable: a Python process of its own
        for constant in code.co_consts:
            if isinstance(constant, types.CodeType):
                reasons |= self.code(constant, namespace)
            elif isinstance(constant, str) and constant in REAL_STRINGS:
                reasons.add(REAL_STRINGS[constant])
            elif isinstance(constant, tuple):
                for item in constant:
                    if isinstance(item, str) and item in REAL_STRINGS:
                        reasons.add(REAL_STRINGS[item])

    def followed(self, name: str) -> bool:
        """Whether ``name`` is a module of tests/ whose functions are followed."""
        if name in NOT_FOLLOWED:
            return False
        return name in self.test_modules or name in _modules_of_tests()

    def test_module(self, name: str) -> types.ModuleType | None:
        """The module of tests/ called ``name`` (imported for the rules if nothing had yet)."""
        if not self.followed(name):
            return None
        try:
            return importlib.import_module(name)
        except Exception:
            return None

    def thing(self, value: Any) -> frozenset[str]:
        if getattr(value, "execution_mode", None) == "subprocess":  # a Tool
            return frozenset({"tool worker processes"})
        if isinstance(value, types.ModuleType):
            reason = _module_reason(value.__name__)
            return frozenset({reason}) if reason else frozenset()
        module = getattr(value, "__module__", None)
        if not isinstance(module, str):
            return frozenset()
        reason = _module_reason(module)
        if reason:
            return frozenset({reason})
        if not self.followed(module):
            return frozenset()
        helper = REAL_HELPERS.get((module, getattr(value, "__name__", "")))
        if helper:
            return frozenset({helper})
        if inspect.isclass(value):
            return self._kept(id(value), lambda reasons: self._read_class(value, reasons))
        if inspect.isfunction(value):
            return self.function(value)
        return frozenset()

    def _read_class(self, value: type, reasons: set[str]) -> None:
        for member in vars(value).values():
            if isinstance(member, staticmethod | classmethod):
                member = member.__func__
            if isinstance(member, property):
                member = member.fget
            if inspect.isfunction(member):
                reasons |= self.function(member)


_IMPORTS = bytes([dis.opmap["IMPORT_NAME"], dis.opmap["IMPORT_FROM"]])


def _import_instructions(code: types.CodeType) -> Iterable[dis.Instruction]:
    """The instructions of ``code``, or none where no opcode is an import (most code: a look at
    the opcodes, every other byte, instead of disassembling it all)."""
    opcodes = code.co_code[::2]
    if not any(opcode in opcodes for opcode in _IMPORTS):
        return ()
    return dis.get_instructions(code)


@functools.cache
def _modules_of_tests() -> frozenset[str]:
    """The names of the modules in tests/, every folder (test files import by basename)."""
    return frozenset(path.stem for path in TESTS.rglob("*.py"))


_WALKERS: dict[frozenset[str], _Walker] = {}


def _walker(test_modules: Iterable[str]) -> _Walker:
    """One walker, and what it found, per set of modules followed (one for a whole session)."""
    key = frozenset(test_modules)
    if key not in _WALKERS:
        _WALKERS[key] = _Walker(key)
    return _WALKERS[key]


def uses(
    function: Callable[..., Any],
    fixtures: Iterable[Callable[..., Any]] = (),
    params: Mapping[str, object] | None = None,
    markers: Iterable[str] = (),
    test_modules: Iterable[str] = (),
) -> Uses:
    """What a test uses: its function, the functions of its fixtures, its storage parameters
    (``params``: fixture name → parameter) and its markers. The functions of tests/ it calls
    are followed (``test_modules`` adds modules to follow beyond the files of tests/)."""
    module = getattr(function, "__module__", None)
    if module in ALWAYS_UNIT:
        return Uses()
    walker = _walker(test_modules)
    reasons: set[str] = set()
    if module in MODULE_REASONS:
        reasons.add(MODULE_REASONS[module])
    reasons |= walker.function(function)
    for fixture in fixtures:
        reasons |= walker.function(fixture)
    for name, value in (params or {}).items():
        if name in STORAGE_FIXTURES and isinstance(value, str) and value in STORAGE_PARAMS:
            reasons.add(STORAGE_PARAMS[value])
    for marker in markers:
        if marker in MARKER_REASONS:
            reasons.add(MARKER_REASONS[marker])
    test_id = f"{module}::{getattr(function, '__name__', '')}"
    if test_id in NAMED_TESTS:
        reasons.add(NAMED_TESTS[test_id])
    return Uses(reasons, SLOW_TESTS.get(test_id))
