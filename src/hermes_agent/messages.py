"""The runtime's own words to an end user, in English and Chinese: one small table.

An agent answers in whatever language its model writes; but when a run stops short (206), its
model fails (502), its input is refused (400) or it runs out of time (504), the text the user
sees is the runtime's. ``agent.language: zh`` in the config (or a run's ``lang`` variable:
``zh``, ``zh-CN``...) turns those into Chinese:

    from hermes_agent.messages import text

    text("model_error", "zh")   # '模型服务暂时出错，请稍后再试。'

``LanguageHook`` is the ``post_output`` hook that does it (``build_agent`` adds one for a
config whose ``agent.language`` is not ``en``). It rewrites only outputs the runtime wrote,
recognised by their status, and keeps the technical detail after the translated sentence so an
operator can still read what happened. The answer a model gave is never touched.
"""

from __future__ import annotations

import re
from typing import Any

LANGUAGES = ("en", "zh")

MESSAGES: dict[str, dict[str, str]] = {
    "max_iterations": {
        "en": "I stopped after {steps} steps without a final answer.",
        "zh": "已执行 {steps} 步，仍未得到最终答案。",
    },
    "no_final_answer": {
        "en": "The model gave no final answer.",
        "zh": "模型没有给出最终答案。",
    },
    "last_results": {"en": "Last tool results:", "zh": "最近的工具结果："},
    "model_error": {
        "en": "The model service failed; please try again later.",
        "zh": "模型服务暂时出错，请稍后再试。",
    },
    "invalid_input": {
        "en": "The message could not be accepted.",
        "zh": "无法受理这条消息。",
    },
    "empty_message": {
        "en": "The message is empty; ask a question or give an instruction.",
        "zh": "消息为空，请输入问题或指令。",
    },
    "timed_out": {
        "en": "The request took too long and was stopped; please try again.",
        "zh": "处理超时，已停止，请稍后重试。",
    },
    "quota": {
        "en": "You have reached today's usage limit; please try again tomorrow.",
        "zh": "您今天的使用次数已达上限，请明天再试。",
    },
    "failure": {
        "en": "Sorry, I could not answer that just now. Please try again later.",
        "zh": "抱歉，暂时无法回答，请稍后再试。",
    },
    "detail": {"en": "Details: {detail}", "zh": "详情：{detail}"},
}
"""Message key → language → text (``str.format`` fields in braces)."""


def language_of(value: Any, default: str = "en") -> str:
    """``en`` or ``zh`` from a language tag (``zh-CN``, ``zh_Hans``, ``ZH``); ``default`` for
    anything else."""
    if isinstance(value, str):
        primary = re.split(r"[-_]", value.strip().lower(), maxsplit=1)[0]
        if primary in LANGUAGES:
            return primary
    return default


def text(key: str, language: str = "en", **values: Any) -> str:
    """The message ``key`` in ``language`` (English when the table has no such language)."""
    entry = MESSAGES[key]
    return entry.get(language, entry["en"]).format(**values)


_STOPPED = re.compile(
    r"I stopped after (\d+) steps \(max_iterations=\d+\) without a final answer\."
)
_LAST_RESULTS = " Last tool results:\n"


def translate_output(output: str, status: int, language: str, error: str | None = None) -> str:
    """``output`` in ``language`` when the runtime wrote it (by ``status``); as it was otherwise
    (an answer, or English)."""
    if language == "en":
        return output
    head, _, tail = output.partition(_LAST_RESULTS)
    results = f"\n{text('last_results', language)}\n{tail}" if tail else ""
    if status == 206:
        stopped = _STOPPED.match(head)
        if stopped:
            return text("max_iterations", language, steps=stopped.group(1)) + results
        if head.startswith("The model gave no final answer."):
            return text("no_final_answer", language) + results
        return output
    if status == 502:
        return _with_detail("model_error", language, error or output)
    if status == 504:
        return _with_detail("timed_out", language, error or output)
    if status == 400 and error is not None and output == error:  # the input was refused
        if error.startswith("the message is empty"):
            return text("empty_message", language)
        return _with_detail("invalid_input", language, error)
    return output


def _with_detail(key: str, language: str, detail: str) -> str:
    return f"{text(key, language)}\n{text('detail', language, detail=detail)}"


class LanguageHook:
    """A ``post_output`` hook: the runtime's messages in ``language`` (or in the run's
    ``lang`` variable, when the run has one)."""

    def __init__(self, language: str = "en") -> None:
        self.language = language_of(language)

    def __call__(self, ctx: Any) -> None:
        language = language_of(ctx.variables.get("lang"), self.language)
        translated = translate_output(ctx.output, ctx.status, language, ctx.error)
        if translated != ctx.output:
            ctx.output = translated
