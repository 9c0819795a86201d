"""What the tests of the embedded model's context copies share: a raw ``Llama`` of its own,
the text they tokenize, a calculator tool and the logits of the last evaluated token."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hermes_agent.models import llamacpp
from hermes_agent.models.llamacpp import bundled_model_path
from hermes_agent.models.llamacpp.context import LoadedModel
from hermes_agent.protocol.prompts import openai_tool

FACTS = " ".join(f"Fact {i}: the code of item {i} is {i * 7919 % 10007}." for i in range(120))

CALCULATOR = openai_tool(
    "calculator",
    "Evaluate an arithmetic expression.",
    {
        "type": "object",
        "properties": {"expression": {"type": "string"}},
        "required": ["expression"],
        "additionalProperties": False,
    },
)


def raw_loaded() -> Iterator[Any]:
    """A ``LoadedModel`` around a raw ``Llama`` (n_ctx 2048, one thread) that no ``LlamaCpp``
    shares; closed when the generator is."""
    llm = llamacpp.new_llama(
        str(bundled_model_path()),
        n_ctx=2048,
        n_threads=1,
        n_threads_batch=1,
        verbose=False,
    )
    yield LoadedModel(llm)
    llm.close()


def logits(llm: Any) -> Any:
    """The logits of the last token ``llm`` evaluated (a copy)."""
    import numpy as np

    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).copy()
