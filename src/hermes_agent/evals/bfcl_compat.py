"""The one place that imports ``bfcl_eval``: its data files, its checkers, its backend classes.

Why a module of its own: ``bfcl_eval.eval_checker.ast_eval.ast_checker`` imports
``bfcl_eval.constants.model_config``, which imports a handler for every model BFCL can query —
and so the SDK of every vendor (anthropic, openai, google, cohere, mistral, ...), several GB
that the harness installs bfcl-eval without (``bfcl_install``). The checker needs one thing from
that module: ``MODEL_CONFIG_MAPPING[model].underscore_to_dot``, asked only for dotted function
names, to know whether a model's API renamed ``math.factorial`` to ``math_factorial``. We never
rename (dotted names reach the model as they are), so while the checker is imported a minimal
stand-in module answers ``underscore_to_dot=False`` for every model name; the stand-in is then
taken out of ``sys.modules`` again, so nothing else sees it.

The multi-turn checker and the backend classes (GorillaFileSystem, MathAPI, TradingBot, ...)
import no vendor SDK and are imported as they are. The data (questions, possible answers,
multi-turn function docs) are read straight from the package's ``data`` folder;
``bfcl_eval.utils`` is not imported because it takes file locks under its install folder.

Where the package comes from: the harness's own folder, outside the environment's packages
(``bfcl_install``; ``hermes-agent eval bfcl --setup`` fills it). The top-level package is
imported from there by its spec; its submodules then resolve through the package's own
``__path__``, so the folder never goes on ``sys.path``.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from hermes_agent.errors import MissingDependencyError
from hermes_agent.evals import bfcl_install

VERSION_PREFIX = "BFCL_v4"
_MODEL_CONFIG = "bfcl_eval.constants.model_config"

AstChecker = Callable[..., dict[str, Any]]
MultiTurnChecker = Callable[..., dict[str, Any]]


@dataclass(frozen=True)
class _NoRenaming:
    """What the AST checker asks of a model's config: are dots in names replaced? Never here."""

    underscore_to_dot: bool = False


class _AnyModel(dict[str, _NoRenaming]):
    """``MODEL_CONFIG_MAPPING`` stand-in: every model name maps to ``_NoRenaming``."""

    def __missing__(self, key: str) -> _NoRenaming:
        return _NoRenaming()


@cache
def package() -> types.ModuleType:
    """The ``bfcl_eval`` package, imported from where ``bfcl_install`` finds it.

    Raises ``MissingDependencyError`` naming the setup command when it is not installed, or the
    ``eval`` extra when a module its checkers import is missing.
    """
    missing = bfcl_install.missing_extra()
    if missing:
        raise MissingDependencyError(
            f"BFCL's checkers need {', '.join(missing)}: {bfcl_install.EXTRA_HINT}"
        )
    loaded = sys.modules.get(bfcl_install.PACKAGE)
    if loaded is not None:
        return loaded
    spec = bfcl_install.find_package()
    if spec is None or spec.loader is None:
        raise MissingDependencyError(bfcl_install.missing_message())
    module = importlib.util.module_from_spec(spec)
    sys.modules[bfcl_install.PACKAGE] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[bfcl_install.PACKAGE]
        raise
    return module


def available() -> bool:
    """Whether the harness can run here (bfcl-eval found, the ``eval`` extra installed)."""
    try:
        package()
    except MissingDependencyError:
        return False
    return True


def package_folder() -> Path:
    """The folder of the ``bfcl_eval`` package in use."""
    return Path(str(package().__file__)).parent


def installed_version() -> str | None:
    """The version of the ``bfcl_eval`` package in use (``None`` when it has no metadata)."""
    return bfcl_install.version_in(package_folder().parent)


def data_folder() -> Path:
    """The ``data`` folder of the ``bfcl_eval`` package."""
    folder = package_folder() / "data"
    if not folder.is_dir():
        raise MissingDependencyError(
            f"bfcl_eval in {package_folder()} has no data folder; {bfcl_install.missing_message()}"
        )
    return folder


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """BFCL data files hold one JSON object per line."""
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


@cache
def ast_checker() -> AstChecker:
    """BFCL's ``ast_checker``, imported without the vendor SDKs (see the module docstring)."""
    package()
    previous = sys.modules.get(_MODEL_CONFIG)
    stand_in = types.ModuleType(_MODEL_CONFIG)
    stand_in.MODEL_CONFIG_MAPPING = _AnyModel()  # type: ignore[attr-defined]
    sys.modules[_MODEL_CONFIG] = stand_in
    try:
        module = importlib.import_module("bfcl_eval.eval_checker.ast_eval.ast_checker")
    finally:
        if previous is None:
            sys.modules.pop(_MODEL_CONFIG, None)
        else:
            sys.modules[_MODEL_CONFIG] = previous
    checker: AstChecker = module.ast_checker
    return checker


def python_language() -> Any:
    """``bfcl_eval.constants.enums.Language.PYTHON`` (what the AST checker wants)."""
    return checker_language("python")


def checker_language(name: str) -> Any:
    """The ``bfcl_eval.constants.enums.Language`` member for ``python``, ``java`` or
    ``javascript`` (what the AST checker wants)."""
    package()
    return getattr(importlib.import_module("bfcl_eval.constants.enums").Language, name.upper())


def type_converter(language: str) -> Callable[..., Any]:
    """BFCL's reader of Java or JavaScript source text (``java_type_converter``,
    ``js_type_converter``): what its checker applies to every argument of those languages."""
    package()
    short = {"java": "java", "javascript": "js"}[language]
    module = importlib.import_module(
        f"bfcl_eval.eval_checker.ast_eval.type_convertor.{short}_type_converter"
    )
    converter: Callable[..., Any] = getattr(module, f"{short}_type_converter")
    return converter


@cache
def multi_turn_checker() -> MultiTurnChecker:
    """BFCL's ``multi_turn_checker`` (it imports no vendor SDK)."""
    package()
    module = importlib.import_module("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker")
    checker: MultiTurnChecker = module.multi_turn_checker
    return checker


def forget_checker_instances(key: str, case_id: str | None = None) -> int:
    """Drop the backend instances the multi-turn checker cached for model name ``key``.

    ``execute_multi_turn_func_call`` keeps every instance it makes in its module globals, under
    a name built from the model name and the test id, and reuses it on the next call with the
    same name. A run uses a model name of its own (so no two runs share state), and drops its
    instances once a case is scored (so a long run does not hold 200 file systems). With
    ``case_id``, only that case's instances go (other cases may be checked at the same time).
    """
    package()
    module = importlib.import_module("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils")
    names = [name for name in list(vars(module)) if name.startswith(key)]
    if case_id is not None:
        # BFCL names an instance f"{model}_{test id}_{class}_instance", with -./: made _, and
        # the model name gains _eval (the model's calls) or _ground_truth_eval when checking.
        config = importlib.import_module("bfcl_eval.constants.executable_backend_config")
        classes = "|".join(re.escape(name) for name in config.CLASS_FILE_PATH_MAPPING)
        pattern = re.compile(
            rf"{re.escape(key)}(?:_ground_truth)?(?:_eval)?_"
            rf"{re.escape(re.sub(r'[-./:]', '_', case_id))}_(?:{classes})_instance"
        )
        names = [name for name in names if pattern.fullmatch(name)]
    for name in names:
        delattr(module, name)
    return len(names)


def backend_class(class_name: str) -> type[Any]:
    """A BFCL multi-turn backend class (``GorillaFileSystem``, ``TradingBot``, ...)."""
    package()
    config = importlib.import_module("bfcl_eval.constants.executable_backend_config")
    module = importlib.import_module(config.CLASS_FILE_PATH_MAPPING[class_name])
    cls: type[Any] = getattr(module, class_name)
    return cls


def is_stateless(class_name: str) -> bool:
    """Whether BFCL's backend class keeps no state (it then loads no scenario)."""
    package()
    config = importlib.import_module("bfcl_eval.constants.executable_backend_config")
    return class_name in config.STATELESS_CLASSES


def function_doc_file(class_name: str) -> Path:
    """The JSON-lines file of function docs for a multi-turn backend class."""
    package()
    config = importlib.import_module("bfcl_eval.constants.executable_backend_config")
    name: str = config.MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]
    return data_folder() / "multi_turn_func_doc" / name
