"""What the tests of the embedded model share: for its context copies, a raw ``Llama`` of its own
(the ``loaded`` fixture), the text they tokenize, a calculator tool and the logits of the last
evaluated token; for its calls, a ``LlamaCpp`` of one call a turn (the ``model`` fixture)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from hermes_agent.models import llamacpp
from hermes_agent.models.llamacpp import LlamaCpp, bundled_model_path
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


@pytest.fixture(name="loaded", scope="module")
def loaded_fixture() -> Iterator[Any]:
    """A ``LoadedModel`` around a raw ``Llama`` that no ``LlamaCpp`` shares, for a test module."""
    yield from raw_loaded()


@pytest.fixture(name="model", scope="module")
def calling_model() -> LlamaCpp:
    """The embedded model for a test module; one call per turn keeps a 135M model (which likes
    to repeat its call) short."""
    return LlamaCpp(max_calls=1, max_string_chars=48)


def logits(llm: Any) -> Any:
    """The logits of the last token ``llm`` evaluated (a copy)."""
    import numpy as np

    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).copy()
