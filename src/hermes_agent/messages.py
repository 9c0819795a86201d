"""The runtime's own words to an end user, in English and Chinese: one small table.

An agent answers in whatever language its model writes; but when a run stops short (206), its
model fails (502), its input is refused (400) or it runs out of time (504), the text the user
sees is the runtime's. ``agent.language: zh`` in the config (or a run's ``lang`` variable:
``zh``, ``zh-CN``...) turns those into Chinese:

    from hermes_agent.messages import text

    text("model_error", "zh")   # '模型服务暂时出错，请稍后再试。'

Every agent does it as its answer is rendered (``Agent(language="zh")``, the config's
``agent.language``, or per run ``variables={"lang": "zh"}``), so the rendered answer, the
streamed output event and the result agree. It rewrites only outputs the runtime wrote,
recognised by their status, and keeps the technical detail after the translated sentence so an
operator can still read what happened. The answer a model gave is never touched.

The same table holds the command line's words (``cli.*``) and the service's error details
(``http.<status>``, chosen by ``Accept-Language``: ``preferred_language``); docs/languages.md.
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
    "budget_tokens": {
        "en": "I stopped before a final answer: this run used {used} tokens and its budget "
        "is {budget} (max_run_tokens).",
        "zh": "在得到最终答案前停止：本次运行已用 {used} 个 token，"
        "预算为 {budget}（max_run_tokens）。",
    },
    "budget_cost": {
        "en": "I stopped before a final answer: this run cost {cost} and its budget is "
        "{budget} (max_run_cost).",
        "zh": "在得到最终答案前停止：本次运行花费 {cost}，预算为 {budget}（max_run_cost）。",
    },
    # The command line's own words (hermes_agent.cli).
    "cli.error": {"en": "error: ", "zh": "错误："},
    "cli.warning": {"en": "warning: ", "zh": "警告："},
    "cli.partial": {
        "en": "a partial answer (status 206, {why})",
        "zh": "不完整的回答（状态 206，{why}）",
    },
    "cli.dry_run_none": {
        "en": "Dry run: the model planned no tool call; nothing was run.",
        "zh": "试运行：模型没有计划任何工具调用；未执行任何工具。",
    },
    "cli.dry_run": {
        "en": "Dry run: the model planned {counts}; nothing was run.",
        "zh": "试运行：模型计划了 {counts}；未执行任何工具。",
    },
    "cli.valid_calls": {"en": "{count} valid call{s}", "zh": "{count} 个有效调用"},
    "cli.refused_calls": {"en": ", {count} refused", "zh": "，{count} 个被拒绝"},
    "cli.run_failed": {"en": "the run failed", "zh": "运行失败"},
    "cli.chat_banner": {
        "en": " — session {session}; /help for commands, /exit to quit",
        "zh": " — 会话 {session}；/help 查看命令，/exit 退出",
    },
    "cli.you": {"en": "you> ", "zh": "你> "},
    "cli.agent": {"en": "agent> ", "zh": "助手> "},
    "cli.help_other": {
        "en": "anything else is a message to the agent",
        "zh": "其他输入都是发给助手的消息",
    },
    "cli.unknown_command": {
        "en": "unknown command {command}; /help lists the commands",
        "zh": "未知命令 {command}；/help 列出可用命令",
    },
    "cli.cmd_help": {"en": "show these commands", "zh": "显示这些命令"},
    "cli.cmd_exit": {
        "en": "leave the chat (also /quit or Ctrl-D)",
        "zh": "退出对话（也可用 /quit 或 Ctrl-D）",
    },
    "cli.cmd_quit": {"en": "leave the chat", "zh": "退出对话"},
    "cli.loading": {"en": "Loading the model {name}…", "zh": "正在加载模型 {name}…"},
    "cli.loaded": {
        "en": "Loaded {name} in {seconds:.1f} s",
        "zh": "已加载 {name}，用时 {seconds:.1f} 秒",
    },
    "cli.tools": {"en": "Tools", "zh": "工具"},
    # The service's error details (server.middleware), by HTTP status; the machine-readable
    # codes stay English.
    "http.400": {"en": "The request is invalid.", "zh": "请求无效。"},
    "http.401": {
        "en": "Authentication is required: send a valid API key.",
        "zh": "需要身份验证：请提供有效的 API 密钥。",
    },
    "http.403": {"en": "This is not allowed for your key.", "zh": "您的密钥无权执行此操作。"},
    "http.404": {"en": "Not found.", "zh": "未找到。"},
    "http.405": {"en": "Method not allowed.", "zh": "不允许使用该方法。"},
    "http.408": {"en": "The request timed out.", "zh": "请求超时。"},
    "http.409": {
        "en": "The request conflicts with the current state.",
        "zh": "请求与当前状态冲突。",
    },
    "http.413": {"en": "The request is too large.", "zh": "请求过大。"},
    "http.415": {"en": "The request body must be JSON.", "zh": "请求体必须是 JSON。"},
    "http.421": {
        "en": "The request was sent to a host this service does not serve.",
        "zh": "请求发往了本服务不接受的主机名。",
    },
    "http.422": {"en": "The request is invalid.", "zh": "请求无效。"},
    "http.429": {
        "en": "Too many requests; please try again later.",
        "zh": "请求过多，请稍后再试。",
    },
    "http.500": {"en": "Internal server error.", "zh": "服务器内部错误。"},
    "http.502": {
        "en": "The model service failed; please try again later.",
        "zh": "模型服务暂时出错，请稍后再试。",
    },
    "http.503": {
        "en": "The service is unavailable; please try again later.",
        "zh": "服务暂不可用，请稍后再试。",
    },
    "http.504": {"en": "The request took too long.", "zh": "请求处理超时。"},
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


def preferred_language(accept_language: str | None, default: str = "en") -> str:
    """``en`` or ``zh``: the first of them an HTTP ``Accept-Language`` header prefers (by its
    ``q`` weights, then its order); ``default`` when it names neither."""
    best: tuple[float, int, str] | None = None
    for position, part in enumerate((accept_language or "").split(",")):
        tag, _, params = part.partition(";")
        found = language_of(tag, "")
        if not found:
            continue
        weight = 1.0
        for param in params.split(";"):
            name, _, value = param.strip().partition("=")
            if name == "q":
                try:
                    weight = float(value)
                except ValueError:
                    weight = 0.0
        if weight > 0 and (best is None or (-weight, position) < (-best[0], best[1])):
            best = (weight, position, found)
    return best[2] if best is not None else default


def text(key: str, language: str = "en", **values: Any) -> str:
    """The message ``key`` in ``language`` (English when the table has no such language)."""
    entry = MESSAGES[key]
    return entry.get(language, entry["en"]).format(**values)


_STOPPED = re.compile(
    r"I stopped after (\d+) steps \(max_iterations=\d+\) without a final answer\."
)
_LAST_RESULTS = " Last tool results:\n"
_BUDGET_TOKENS = re.compile(
    r"I stopped before a final answer: this run used ([\d,]+) tokens and its budget is "
    r"([\d,]+) \(max_run_tokens\)\."
)
_BUDGET_COST = re.compile(
    r"I stopped before a final answer: this run cost (\S+) and its budget is (\S+) "
    r"\(max_run_cost\)\."
)


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
        tokens = _BUDGET_TOKENS.match(head)
        if tokens:
            return text("budget_tokens", language, used=tokens[1], budget=tokens[2]) + results
        cost = _BUDGET_COST.match(head)
        if cost:
            return text("budget_cost", language, cost=cost[1], budget=cost[2]) + results
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


def error_detail(status: int, detail: str, language: str) -> str:
    """An HTTP error's ``detail`` for a reader of ``language``: in English as it was; in
    another language the status's sentence, then the English detail (what an operator greps)."""
    if language == "en":
        return detail
    key = f"http.{status}" if f"http.{status}" in MESSAGES else f"http.{status // 100}00"
    if key not in MESSAGES:
        return detail
    return text(key, language) + text("detail", language, detail=detail)


def _with_detail(key: str, language: str, detail: str) -> str:
    return f"{text(key, language)}\n{text('detail', language, detail=detail)}"


class LanguageHook:
    """A ``post_output`` hook: the runtime's messages in ``language`` (or in the run's
    ``lang`` variable, when the run has one). Kept for agents that add it by hand: every
    agent now does this itself (``Agent(language=...)``), and a second pass changes nothing."""

    def __init__(self, language: str = "en") -> None:
        self.language = language_of(language)

    def __call__(self, ctx: Any) -> None:
        language = language_of(ctx.variables.get("lang"), self.language)
        translated = translate_output(ctx.output, ctx.status, language, ctx.error)
        if translated != ctx.output:
            ctx.output = translated
