"""Start llama-cpp-python's own OpenAI-compatible server (``python -m llama_cpp.server``) with
llama.cpp's weight repacking off, for the tests in ``test_llama_server.py``.

The server's options are its own command line, passed through unchanged. Repacking is switched
off the way ``LlamaCpp`` does it, because the repacked AMX kernels crashed with the bundled
model on some machines; the server has no option for it.
"""

from __future__ import annotations

import sys

import llama_cpp
from llama_cpp.server.__main__ import main

from hermes_agent.models.llamacpp import _weight_repacking

if __name__ == "__main__":
    with _weight_repacking(llama_cpp, False):
        sys.argv = ["llama_cpp.server", *sys.argv[1:]]
        main()
