"""Tool search: a run with many tools shows the model a search tool and a few definitions, not
all of them.

Past ``threshold`` tools (an agent with a large MCP server, say), every definition in every
prompt costs more than it helps: the prompt grows by the whole toolset each turn and a small
model loses the thread. Then the prompt carries:

- ``search_tools(query)``: finds tools by keywords; the definitions of those it returns are in
  the prompt from the next model turn on, so the model calls them the usual way;
- the ``top_k`` definitions that best match the user's message, so a run that needs a tool
  the message names does not spend a turn searching.

Every visible tool stays callable: a call the model writes for a tool it has not searched for
is checked and run like any other. The ranking is BM25 over each tool's name (split into words)
and description: no model, no new dependency, and the same query always gives the same tools
(ties go by name).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, MutableSequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from hermes_agent.tools.registry import Tool

SEARCH_TOOL = "search_tools"
DEFAULT_TOP_K = 5
MAX_RESULTS = 10
"""The most tools one search loads into the prompt."""
_WORD = re.compile(r"[a-z0-9]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_K1, _B = 1.2, 0.75


def words(text: str) -> list[str]:
    """``text`` as lower-case words: ``getWeather_forecast`` → get, weather, forecast."""
    return _WORD.findall(_CAMEL.sub(" ", text).lower())


@dataclass(frozen=True, slots=True)
class ToolIndex:
    """BM25 over the tools' names and descriptions."""

    names: tuple[str, ...]
    terms: tuple[Counter[str], ...]
    lengths: tuple[int, ...]
    idf: Mapping[str, float]
    average: float

    @classmethod
    def of(cls, tools: Iterable[Tool]) -> ToolIndex:
        listed = list(tools)
        terms = tuple(Counter(words(t.name) + words(t.description)) for t in listed)
        lengths = tuple(sum(c.values()) for c in terms)
        documents = Counter(word for counts in terms for word in counts)
        n = len(listed)
        idf = {w: math.log(1 + (n - df + 0.5) / (df + 0.5)) for w, df in documents.items()}
        average = sum(lengths) / n if n else 0.0
        return cls(tuple(t.name for t in listed), terms, lengths, idf, average)

    def search(self, query: str, limit: int) -> list[str]:
        """The names of at most ``limit`` tools that match ``query``, best first (a tool
        named in the query outright first of all); none when nothing matches."""
        asked = set(words(query))
        scored: list[tuple[float, str]] = []
        for name, counts, length in zip(self.names, self.terms, self.lengths, strict=True):
            score = 0.0
            for word in asked:
                tf = counts.get(word, 0)
                if tf:
                    norm = _K1 * (1 - _B + _B * length / (self.average or 1))
                    score += self.idf[word] * tf * (_K1 + 1) / (tf + norm)
            if name.lower() in query.lower():
                score += 100.0
            if score > 0:
                scored.append((-score, name))
        return [name for _, name in sorted(scored)[:limit]]


@lru_cache(maxsize=8)
def _index(tools: tuple[Tool, ...]) -> ToolIndex:
    # An agent's runs share their tools: the index is built once per toolset, not per run.
    return ToolIndex.of(tools)


def narrowed(
    tools: Mapping[str, Tool],
    query: str,
    specs: MutableSequence[dict[str, Any]],
    *,
    threshold: int | None,
    top_k: int = DEFAULT_TOP_K,
) -> Tool | None:
    """When ``tools`` are more than ``threshold``, fill ``specs`` (the prompt's definitions)
    with the ``top_k`` that best match ``query`` and return the search tool, whose calls add
    the definitions they find to ``specs``; else fill ``specs`` with every tool and return
    ``None``. The caller adds the search tool to the run's tools."""
    if threshold is None or len(tools) <= threshold or SEARCH_TOOL in tools:
        specs[:] = [tool.spec() for tool in tools.values()]
        return None
    index = _index(tuple(tools.values()))
    shown = index.search(query, top_k)
    search = _search_tool(index, tools, specs)
    specs[:] = [search.spec(), *(tools[name].spec() for name in shown)]
    return search


def _search_tool(
    index: ToolIndex, tools: Mapping[str, Tool], specs: MutableSequence[dict[str, Any]]
) -> Tool:
    count = len(tools)

    def search_tools(query: str) -> dict[str, Any]:
        found = index.search(query, MAX_RESULTS)
        loaded = {spec["function"]["name"] for spec in specs}
        specs.extend(tools[name].spec() for name in found if name not in loaded)
        return {
            "tools": [{"name": n, "description": tools[n].description} for n in found],
            "note": (
                "these tools can be called from your next turn on"
                if found
                else "no tool matches; try other keywords"
            ),
        }

    return Tool.from_function(
        search_tools,
        description=(
            f"Search the {count} available tools by keywords (what you want to do, the "
            "kind of data); the definitions of the tools found are given to you on your "
            "next turn, and you can call them then."
        ),
        parameters={
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "keywords", "maxLength": 500}
            },
            "required": ["query"],
            "additionalProperties": False,
        },
        execution_mode="inline",
        idempotent=True,
    )
