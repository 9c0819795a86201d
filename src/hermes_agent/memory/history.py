"""What a prompt carries of a session: a summary of the turns beyond the window, then the recent
turns verbatim.

The summary is written by the model where its profile says it can (``can_summarize``), and is
extractive otherwise. The model call that writes it is a model call like any other: it happens
inside the InputParser stage (so the ``pre_input`` / ``post_input`` hooks surround it), its
prompt and completion go into that stage's audit record, its usage counts in the run's usage,
and its input is cut to fit the model's context window.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from hermes_agent.errors import HermesAgentError
from hermes_agent.memory.session import split_history, summarize, transcript
from hermes_agent.models.base import Model, ModelSettings
from hermes_agent.types import Message, Usage

SUMMARY_PREFIX = "Earlier in this conversation: "
DEFAULT_SUMMARY_CACHE = 4096
"""Sessions whose summary is kept in memory; the least recently used are forgotten first."""


@dataclass(slots=True)
class SummaryCall:
    """The model call that summarised old turns: what was sent, what came back."""

    prompt: str
    completion: str
    usage: Usage


@dataclass(slots=True)
class LoadedHistory:
    """A session's history as the prompt carries it."""

    messages: list[Message] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    summary_call: SummaryCall | None = None


class HistoryLoader:
    """Builds the prompt's history from a session's stored messages, caching one summary per
    session (in a bounded, least-recently-used cache, so a long-lived process does not grow).

    Runs on several threads (sync ``Agent.run`` callers, each on its own event loop) share the
    cache: a lock guards each look-up and update, and is never held while a summary is written.
    """

    def __init__(
        self,
        *,
        history_window: int,
        summary_max_chars: int,
        summarize_with_model: bool | None = None,
        max_cached: int = DEFAULT_SUMMARY_CACHE,
    ) -> None:
        self.history_window = history_window
        self.summary_max_chars = summary_max_chars
        self.summarize_with_model = summarize_with_model
        self.max_cached = max_cached
        self._summaries: OrderedDict[str, tuple[int, str]] = OrderedDict()
        self._lock = threading.Lock()

    def forget(self) -> None:
        """Drop every cached summary."""
        with self._lock:
            self._summaries.clear()

    async def load(
        self, session_id: str, stored: Sequence[Message], model: Model, *, cached: bool = True
    ) -> LoadedHistory:
        """The history for the prompt. ``cached=False`` always asks the model for the summary
        (a durable run: every attempt must make the same model requests, whatever this
        process's cache holds)."""
        old, kept = split_history(stored, self.history_window)
        if not old or self.summary_max_chars <= 0:
            return LoadedHistory(kept)
        loaded = LoadedHistory()
        use_cache = cached
        with self._lock:
            cached_summary = self._summaries.get(session_id) if use_cache else None
            if cached_summary is not None and cached_summary[0] == len(old):
                self._summaries.move_to_end(session_id)
        if cached_summary is not None and cached_summary[0] == len(old):
            summary = cached_summary[1]
        else:  # one more turn left the window since the last summary
            summary, loaded.summary_call = await self._summarize(old, model)
            if loaded.summary_call is not None:
                loaded.usage = loaded.summary_call.usage
            with self._lock:
                self._summaries[session_id] = (len(old), summary)
                self._summaries.move_to_end(session_id)
                while len(self._summaries) > self.max_cached:
                    self._summaries.popitem(last=False)
        loaded.messages = ([Message("system", summary)] if summary else []) + kept
        return loaded

    async def _summarize(
        self, turns: list[list[Message]], model: Model
    ) -> tuple[str, SummaryCall | None]:
        use_model = self.summarize_with_model
        if use_model is None:  # by default only models that can write a useful summary
            use_model = model.profile.can_summarize
        if not use_model:
            return summarize(turns, self.summary_max_chars), None
        limit = self.summary_max_chars
        settings = ModelSettings(tool_choice="none", max_tokens=max(32, limit // 2))
        request = _fitted_request(transcript(turns), limit, model, settings)
        prompt = model.render_prompt(request, [], settings)
        try:
            response = await model.complete(request, [], settings)
        except HermesAgentError as exc:
            # The extractive summary still keeps the gist; the trail shows why it was used.
            call = SummaryCall(prompt, f"(summary failed: {exc})", Usage())
            return summarize(turns, limit), call
        text = " ".join(response.completion.content.split())
        call = SummaryCall(prompt, response.text, response.usage)
        if not text:
            return summarize(turns, limit), call
        return f"{SUMMARY_PREFIX}{text}"[:limit], call


def _request(text: str, limit: int) -> list[Message]:
    return [
        Message(
            "system",
            f"Summarise the conversation below in at most {limit} characters. Keep "
            "names, numbers and decisions. Answer with the summary only.",
        ),
        Message("user", text),
    ]


def _fitted_request(text: str, limit: int, model: Model, settings: ModelSettings) -> list[Message]:
    """The summary request, with the oldest part of the transcript cut until it fits the
    model's context window (with room for the summary itself)."""
    request = _request(text, limit)
    window = model.profile.context_window
    if window is None or window <= 0:
        return request
    budget = window - (settings.max_tokens or 0)
    while text and model.count_tokens(model.render_prompt(request, [], settings)) > budget:
        text = text[len(text) // 4 + 1 :]  # drop the oldest quarter; the latest turns matter most
        request = _request(text, limit)
    return request
