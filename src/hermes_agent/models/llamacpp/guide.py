"""The grammar guide: a logits processor that keeps decoding inside a GBNF grammar, cheaply.

It replaces handing a ``LlamaGrammar`` to llama-cpp-python, which checks all ~49k vocabulary
entries at every step and made SmolLM2 about 1.7x slower per token: the guide checks the model's
own favourite first and masks the whole vocabulary only when the favourite is not allowed.
"""

from __future__ import annotations

from typing import Any

from hermes_agent.errors import ModelError
from hermes_agent.models.llamacpp.context import Candidates, LoadedModel
from hermes_agent.models.llamacpp.files import import_llama_cpp

__all__ = ["TOP_K", "WIDE_CHECK", "GrammarGuide", "check_guide", "top_ids"]

TOP_K = 40  # llama-cpp-python's default top_k, which create_completion applies when sampling
WIDE_CHECK = 512  # candidates checked before the whole vocabulary is (see GrammarGuide)


def top_ids(scores: Any, width: int) -> Any:
    """The ids of the ``width`` highest ``scores``, in no particular order."""
    import numpy as np

    if width >= len(scores):
        return np.arange(len(scores), dtype=np.intc)
    if width == 1:
        return np.array([int(np.argmax(scores))], dtype=np.intc)
    return np.argpartition(scores, -width)[-width:].astype(np.intc)


def check_guide(guide: GrammarGuide | None) -> None:
    if guide is not None and guide.lost:
        raise ModelError(
            "constrained decoding lost track of the tool-call grammar (a bug: please report it "
            "with the prompt); the completion is not guaranteed to be valid"
        )


class GrammarGuide:
    """A logits processor that keeps sampling inside a grammar, cheaply.

    At each step it first checks only the model's own choice (greedy: the top token; sampling:
    the top ``top_k``, which ``create_completion`` would keep anyway) and, when one is allowed,
    masks everything else. When none is, it checks the best 512 tokens, and only when none of
    those is allowed either, the whole vocabulary. Greedy decoding then takes the best allowed
    token (the first allowed one in the model's order, so the staged check loses nothing), with
    one twist: if a shorter
    allowed token spells the beginning of that token's text, the shorter one is taken. The
    model's favourite was illegal, so commit to as little as the grammar needs (say ``"`` rather
    than ``"}}`` where a string must start) and let the model choose again with it in view;
    otherwise SmolLM2 tends to fill a forced string with the text it meant to write after it.

    Tokens the model sampled are fed to the grammar at the next call, when they appear at the
    end of ``input_ids``. Each is checked first: llama.cpp aborts the process when a grammar is
    fed a token it does not allow, so should one ever slip through, the guide stops, and
    ``lost`` tells the caller.
    """

    def __init__(self, loaded: LoadedModel, sampler: Any, *, greedy: bool) -> None:
        self._llama_cpp = import_llama_cpp()
        self._loaded = loaded
        self._sampler = sampler
        self._greedy = greedy
        self._seen: int | None = None
        self.lost = False
        self.checks: dict[int, int] = {}  # how many steps needed how wide a check

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import numpy as np

        if self._loaded.candidates is None:
            self._loaded.candidates = Candidates(self._llama_cpp, len(scores))
        candidates = self._loaded.candidates
        for token in input_ids[self._seen if self._seen is not None else len(input_ids) :]:
            if self.lost or not candidates.allowed(self._sampler, [token], [0.0])[0]:
                self.lost = True
                break
            self._llama_cpp.llama_sampler_accept(self._sampler, int(token))
        self._seen = len(input_ids)
        if self.lost:
            return scores

        first = 1 if self._greedy else TOP_K
        for width in (first, WIDE_CHECK, len(scores)):
            top = top_ids(scores, width)
            keep = top[candidates.allowed(self._sampler, top, scores[top])]
            if len(keep) or width >= len(scores):
                break
        self.checks[width] = self.checks.get(width, 0) + 1
        if self._greedy and width > 1:
            keep = np.array([self._shortest_start(int(keep[np.argmax(scores[keep])]))])
        out = np.full_like(scores, -np.inf)
        out[keep] = scores[keep]
        return out

    def _shortest_start(self, token: int) -> int:
        """The shortest allowed token whose text begins the text of ``token`` (else ``token``)."""
        import numpy as np

        pieces = self._loaded.token_pieces()
        text = self._loaded.llm.detokenize([token])
        starts = [pieces[text[:n]] for n in range(1, len(text)) if text[:n] in pieces]
        if not starts:
            return token
        ids = np.array(starts, dtype=np.intc)
        mask = self._loaded.candidates.allowed(  # type: ignore[union-attr]
            self._sampler, ids, np.zeros(len(ids), dtype=np.single)
        )
        return int(ids[mask][0]) if mask.any() else token
