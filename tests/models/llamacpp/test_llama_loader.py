"""Every llama.cpp model is built through the project's loader, which turns weight repacking off
(some CPUs advertise AMX and trap on it at the first decode): nothing else in the product, the
tests, the benchmarks or the examples constructs ``llama_cpp.Llama`` itself."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
LOADER = ROOT / "src" / "hermes_agent" / "models" / "llamacpp" / "loader.py"
# A call of the class (``Llama(`` or ``llama_cpp.Llama(``), not ``LlamaCpp(`` or ``new_llama(``.
CONSTRUCTS = re.compile(r"(?<![\w.])(?:llama_cpp\.)?Llama\s*\(|llama_cpp\.Llama\s*\(")


def test_nothing_but_the_loader_constructs_llama() -> None:
    offenders = []
    for folder in ("src", "tests", "benchmarks", "examples"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == LOADER or path == Path(__file__).resolve():
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if CONSTRUCTS.search(line) and not line.lstrip().startswith("#"):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == [], "build llama.cpp models with models.llamacpp.new_llama:\n" + "\n".join(
        offenders
    )


def test_the_check_sees_a_direct_construction() -> None:
    assert CONSTRUCTS.search("llm = llama_cpp.Llama(model_path=path)")
    assert CONSTRUCTS.search("llm = Llama(model_path=path)")
    assert not CONSTRUCTS.search("model = LlamaCpp(n_ctx=2048)")
    assert not CONSTRUCTS.search("llm = llamacpp.new_llama(path)")


def test_new_llama_loads_the_bundled_model_with_repacking_off() -> None:
    from hermes_agent.models import llamacpp

    llm = llamacpp.new_llama(
        str(llamacpp.bundled_model_path()), n_ctx=256, n_threads=1, verbose=False
    )
    try:
        out = llm.create_completion("Hello", max_tokens=2, temperature=0.0)
        assert isinstance(out["choices"][0]["text"], str)
    finally:
        llm.close()
