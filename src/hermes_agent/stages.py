"""The five stages' names: one vocabulary for the pipeline, the audit trail, tracing, the
console and the worker.

A step runs the stages in this order. Each has two names: its class name (``StageName``: a
trail record's ``stage``, a span's name) and its word in hook point names (``HookStage``:
``pre_thought``, ``post_execution``). Both are ``str`` enums, so a stored record's plain string
compares equal to a member.
"""

from __future__ import annotations

from enum import StrEnum


class StageName(StrEnum):
    """A stage as the trail and the spans name it."""

    INPUT_PARSER = "InputParser"
    THOUGHT_GENERATOR = "ThoughtGenerator"
    TOOL_SELECTOR = "ToolSelector"
    TOOL_EXECUTOR = "ToolExecutor"
    OUTPUT_RENDERER = "OutputRenderer"

    @property
    def hook_stage(self) -> HookStage:
        return HookStage(_HOOK_WORDS[self])


class HookStage(StrEnum):
    """A stage as hook points name it (``pre_<stage>`` / ``post_<stage>``)."""

    INPUT = "input"
    THOUGHT = "thought"
    SELECTION = "selection"
    EXECUTION = "execution"
    OUTPUT = "output"

    @property
    def stage_name(self) -> StageName:
        return _STAGE_NAMES[self]


_HOOK_WORDS: dict[StageName, str] = dict(zip(StageName, HookStage, strict=True))
_STAGE_NAMES: dict[HookStage, StageName] = dict(zip(HookStage, StageName, strict=True))
