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
