"""Building llama.cpp models the one safe way, and the process-wide cache of loaded ones.

Every ``llama_cpp.Llama`` the project builds is built here (``new_llama``, ``load_model``, and
llama-cpp-python's own server under ``llama_server_loading``), with llama.cpp's weight
repacking off unless asked for: some CPUs advertise AMX and trap on it at the first decode
(see ``_weight_repacking``). A test checks that nothing else constructs ``Llama``.

One ``Llama`` object per (model file, context size) is loaded per process, lazily, on first use,
and shared by every ``LlamaCpp`` built for it; the first loader's ``n_threads`` and ``seed``
apply.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hermes_agent.errors import MissingDependencyError, ModelError
from hermes_agent.models.llamacpp.context import LoadedModel, unescaped_controls
from hermes_agent.models.llamacpp.files import import_llama_cpp

__all__ = ["llama_server_loading", "load_model", "new_llama"]

_LOADED: dict[tuple[str, int], LoadedModel] = {}
_LOAD_LOCK = threading.Lock()
_log = logging.getLogger(__name__)


@atexit.register
def _unload_all() -> None:
    # Free the models while llama_cpp's module globals still exist; left to garbage collection
    # at interpreter exit, Llama.__del__ runs after they are gone and prints a TypeError.
    with _LOAD_LOCK:
        loaded = list(_LOADED.values())
        _LOADED.clear()
    for item in loaded:
        with contextlib.suppress(Exception):
            item.llm.close()


def load_model(
    path: str, n_ctx: int, n_threads: int, seed: int, repack_weights: bool
) -> LoadedModel:
    key = (path, n_ctx)
    with _LOAD_LOCK:
        loaded = _LOADED.get(key)
        if loaded is None:
            llama_cpp = import_llama_cpp()
            try:
                with _weight_repacking(llama_cpp, repack_weights):
                    llm = llama_cpp.Llama(
                        model_path=path,
                        n_ctx=n_ctx,
                        n_threads=n_threads,
                        n_threads_batch=n_threads,
                        seed=seed,
                        verbose=False,
                    )
            except Exception as exc:
                raise ModelError(f"could not load the model file {path}: {exc}") from exc
            loaded = _LOADED[key] = LoadedModel(llm)
            if unescaped := unescaped_controls(llm):
                _log.warning(
                    "%s has control tokens the prompt renderer does not escape in content "
                    "(%s): text holding them reaches the model as control tokens",
                    path,
                    ", ".join(unescaped[:8]) + (" ..." if len(unescaped) > 8 else ""),
                )
        return loaded


def new_llama(model_path: str, *, repack_weights: bool = False, **options: Any) -> Any:
    """A raw ``llama_cpp.Llama`` built the one safe way: with weight repacking off unless asked
    for (see ``_weight_repacking``). Everything that builds a llama.cpp model — the product,
    its tests, benchmarks and examples — goes through here or ``LlamaCpp``."""
    llama_cpp = import_llama_cpp()
    with _LOAD_LOCK, _weight_repacking(llama_cpp, repack_weights):
        return llama_cpp.Llama(model_path=model_path, **options)


@contextmanager
def llama_server_loading(*, repack_weights: bool = False) -> Iterator[None]:
    """While open, llama-cpp-python's own server (``llama_cpp.server``) loads its models the
    way ``new_llama`` does: under the load lock, with weight repacking off unless asked for.

    The server builds its ``Llama`` inside ``LlamaProxy.load_llama_from_model_settings`` (at
    start and whenever a request names another model of its config file); that one function
    is wrapped, so no option of the server's is lost. ``hermes-agent llama-server`` runs the
    server inside it.
    """
    llama_cpp = import_llama_cpp()
    try:
        from llama_cpp.server.model import LlamaProxy
    except ImportError as exc:
        raise MissingDependencyError(
            f"llama-cpp-python's server is not installed ({exc}): "
            'pip install "llama-cpp-python[server]"'
        ) from exc
    original = LlamaProxy.load_llama_from_model_settings

    def load(settings: Any) -> Any:
        with _LOAD_LOCK, _weight_repacking(llama_cpp, repack_weights):
            return original(settings)

    LlamaProxy.load_llama_from_model_settings = staticmethod(load)  # type: ignore[method-assign]
    try:
        yield
    finally:
        LlamaProxy.load_llama_from_model_settings = staticmethod(original)  # type: ignore[method-assign]


@contextmanager
def _weight_repacking(llama_cpp: Any, enabled: bool) -> Iterator[None]:
    """Load with llama.cpp's "extra buffer types" (weight repacking) on or off.

    On CPUs with AMX, llama.cpp repacks the weights for AMX kernels, and with llama-cpp-python
    0.3.36 the first decode then crashed the process (a segmentation fault) on our Xeon VMs.
    A 135M model gains little from repacking, so it is off unless asked for. ``Llama`` has no
    argument for it, so its default model parameters are adjusted while it is built (under
    the load lock).
    """
    low_level = llama_cpp.llama_cpp
    defaults = low_level.llama_model_default_params
    if enabled or "use_extra_bufts" not in {name for name, _ in defaults().__class__._fields_}:
        yield
        return

    def without_repacking() -> Any:
        params = defaults()
        params.use_extra_bufts = False
        return params

    low_level.llama_model_default_params = without_repacking
    try:
        yield
    finally:
        low_level.llama_model_default_params = defaults
