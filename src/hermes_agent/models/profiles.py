"""What a model family does with its thought: whether its chat template opens ``<think>`` in the
prompt, and what a ``<tool_call>`` written inside the thought is.

Thinking models differ, and the servers in front of them disagree: some families write their
calls inside the thought (Qwen3.5 and 3.6 do; Ollama and Transformers run those calls), others
think about a call before making it after ``</think>``. Some templates end the prompt with
``<think>`` (QwQ, DeepSeek-R1 distills, Qwen3's thinking models), so the completion starts
inside the thought and only closes it. A ``ThoughtPolicy`` says both for one model; it is found
by the model's name (``thought_policy``) and can be set per model (the engines' ``thought_calls``
and ``opens_thought`` arguments, ``model.thought_calls`` / ``model.opens_thought`` in a config).

``thought_calls``:

- ``ignore`` (the default): a call inside a thought is thought, never run; the run's result
  warns about it, the trail records it, and the log says so at debug level.
- ``run``: such a call is one of the turn's calls, as if written after ``</think>`` (before
  them: it was written first). A call the model then wrote again after the thought, the same
  tool with the same arguments, runs once.
- ``ask``: such a call runs only if the run's approver approves it (whatever its tool says
  about approval); with no approver it is refused (403) and the model reads why.

Example::

    >>> thought_policy("Qwen/Qwen3.5-27B")
    ThoughtPolicy(thought_calls='run', opens_thought=True, family='qwen3.5')
    >>> thought_policy("qwq-32b", thought_calls="ask").thought_calls
    'ask'
    >>> thought_policy("hermes-3-llama-3.1-8b")
    ThoughtPolicy(thought_calls='ignore', opens_thought=False, family='')
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal, get_args

__all__ = ["FAMILIES", "THOUGHT_CALLS", "ThoughtCalls", "ThoughtPolicy", "thought_policy"]

ThoughtCalls = Literal["ignore", "run", "ask"]
"""What a ``<tool_call>`` written inside a thought is (see the module docstring)."""

THOUGHT_CALLS: Final[tuple[str, ...]] = get_args(ThoughtCalls)


@dataclass(frozen=True, slots=True)
class ThoughtPolicy:
    """One model's thought policy: ``thought_calls`` (``ignore``, ``run`` or ``ask``), whether
    its template opens the thought in the prompt (``opens_thought``: its completions start
    inside ``<think>``), and the family entry it came from (``""``: none matched)."""

    thought_calls: ThoughtCalls = "ignore"
    opens_thought: bool = False
    family: str = ""

    def __post_init__(self) -> None:
        if self.thought_calls not in THOUGHT_CALLS:
            raise ValueError(
                f"thought_calls must be one of {', '.join(THOUGHT_CALLS)}, "
                f"got {self.thought_calls!r}"
            )


@dataclass(frozen=True, slots=True)
class _Family:
    name: str
    pattern: re.Pattern[str]
    policy: ThoughtPolicy


def _family(name: str, pattern: str, calls: ThoughtCalls, opens: bool) -> _Family:
    return _Family(name, re.compile(pattern, re.I), ThoughtPolicy(calls, opens, name))


FAMILIES: Final[tuple[_Family, ...]] = (
    # Qwen3.5/3.6 write calls inside the thought, and their servers (Ollama, Transformers
    # serve) run them; the template opens the thought when thinking is on (its default).
    _family("qwen3.5", r"qwen3[._]?[5-9](?![0-9])", "run", True),
    # Qwen3's thinking-only models (the 2507 "Thinking" releases) and QwQ open the thought.
    _family("qwen3-thinking", r"qwen3\S*thinking", "ignore", True),
    _family("qwq", r"qwq", "ignore", True),
    # DeepSeek-R1 and its distills (Qwen and Llama based) open the thought.
    _family("deepseek-r1", r"deepseek[-_ ]?r1|r1[-_]distill", "ignore", True),
    # Hermes 4 writes its own <think> when asked to reason; its calls come after it.
    _family("hermes-4", r"hermes[-_ ]?4", "ignore", False),
)
"""The known families, first match wins (matched anywhere in the model's name, any case)."""


def thought_policy(
    model_name: str,
    *,
    thought_calls: ThoughtCalls | None = None,
    opens_thought: bool | None = None,
) -> ThoughtPolicy:
    """The thought policy for a model named ``model_name`` (its family's, or the default),
    with ``thought_calls`` and ``opens_thought`` overriding the family's when given."""
    found = next((f.policy for f in FAMILIES if f.pattern.search(model_name)), ThoughtPolicy())
    return ThoughtPolicy(
        thought_calls if thought_calls is not None else found.thought_calls,
        opens_thought if opens_thought is not None else found.opens_thought,
        found.family,
    )
