// The console's own words in English or Chinese. The language is the one set with
// ?lang=zh (kept in localStorage as "hermes-console-lang"), else the browser's
// (navigator.language); the service's answers follow it through Accept-Language.
// Words are looked up by their English text, so an untranslated one shows in English.

const KEY = "hermes-console-lang";
const WORDS = {
  zh: {
    "Skip to content": "跳到正文",
    "Runs": "运行记录",
    "Approvals": "审批",
    "Chat": "对话",
    "Keyboard": "快捷键",
    "runs": "运行记录",
    "approvals": "审批",
    "chat": "对话",
    "the first filter, or the message box": "第一个筛选框或消息框",
    "next and previous step, approval or report": "下一个或上一个步骤、审批或报告",
    "show or hide this list": "显示或隐藏此列表",
    "Esc hides it": "Esc 隐藏",
    "Everything else is the usual Tab, Enter and Space.": "其余操作照常使用 Tab、Enter 和空格键。",
    "API key": "API 密钥",
    "Key": "密钥",
    "Use this key": "使用此密钥",
    "Forget key": "忘记密钥",
    "Not found": "未找到",
    "Back to the runs": "返回运行记录",
    "Message": "消息",
    "Session": "会话",
    "Send": "发送",
    "Stop": "停止",
    "console": "控制台",
    "No step is recorded yet: steps are recorded once they are whole.": "尚未记录任何步骤：步骤完整后才会记录。",
    "No audit records for this run.": "此运行没有审计记录。",
    "Status": "状态",
    "Started": "开始时间",
    "Duration": "耗时",
    "Model": "模型",
    "Steps": "步骤",
    "Tokens": "词元",
    "Cost": "费用",
    "not recorded": "未记录",
    "no prices configured": "未配置价格",
    "Export JSONL": "导出 JSONL",
    "Replay against today's tools": "用当前工具重放",
    "Cancel run": "取消运行",
    "Error": "错误",
    "A replay runs the recorded model answers through the agent as it is now: its tools run for real, calls that need approval are refused.": "重放会用当前的智能体重新处理记录下的模型回答：工具会真实执行，需要审批的调用会被拒绝。",
    "User message": "用户消息",
    "Final output": "最终输出",
    "Summary of older turns (the model was asked)": "较早轮次的摘要（由模型生成）",
    "Asked": "提问",
    "Answer": "回答",
    "Prompt (the whole prompt as sent)": "提示词（发送的完整提示词）",
    "Prompt (the turns added since the previous step)": "提示词（上一步之后新增的轮次）",
    "Thought": "思考",
    "Raw completion": "原始输出",
    "Output": "输出",
    "Arguments": "参数",
    "Result": "结果",
    "Replaying…": "正在重放…",
    "Calls": "调用",
    "Tool results": "工具结果",
    "Recorded": "记录时",
    "Today": "现在",
    "Live": "实时",
    "Run": "运行",
    "Could not load the run": "无法加载此运行",
    "Step": "步骤",
    "Approve": "批准",
    "Deny": "拒绝",
    "Reason": "理由",
    "Approving…": "正在批准…",
    "Denying…": "正在拒绝…",
    "The run resumes": "运行继续",
    "Nothing waits for an approval.": "没有等待审批的调用。",
    "Call": "调用",
    "Could not answer": "无法提交答复",
    "Could not load approvals": "无法加载审批",
    "New session": "新会话",
    "Scratch pad": "草稿区",
  },
};

function chosen() {
  const asked = new URLSearchParams(location.search).get("lang");
  if (asked) localStorage.setItem(KEY, asked);
  return asked || localStorage.getItem(KEY) || navigator.language || "en";
}

export const lang = chosen().toLowerCase().startsWith("zh") ? "zh" : "en";

/** The console's word `english` in the chosen language. */
export function t(english) {
  return WORDS[lang]?.[english] ?? english;
}

/** Every element of `root` marked data-i18n shows its words in the chosen language. */
export function translatePage(root = document) {
  document.documentElement.lang = lang === "zh" ? "zh-CN" : "en";
  if (lang === "en") return; // the page is written in English, markup and all
  for (const element of root.querySelectorAll("[data-i18n]")) {
    element.textContent = t(element.dataset.i18n || element.textContent.trim());
  }
}
