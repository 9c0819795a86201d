// Model text with its Hermes tags marked: <tool_call>, <scratch_pad>, <think>, <tool_response>,
// <tools> and the ChatML turn markers. Everything is text nodes inside spans; nothing is parsed as HTML.

import { h } from "./dom.js";

const PATTERN =
  /<(tool_call|scratch_pad|think|tool_response|tools)>([\s\S]*?)(<\/\1>|$)|<\|im_start\|>[a-z_]*|<\|im_end\|>/g;

/**
 * A fragment showing `text` with its tags highlighted (an unclosed tag runs to the end).
 * `completion`: the text is one model turn, where a </think> before any <think> means the chat
 * template opened the thought in the prompt, so all the text before it is the thought (as the
 * parser reads it). Elsewhere (a prompt holds many turns) a bare </think> is plain text.
 */
export function highlighted(text, { completion = false } = {}) {
  const fragment = document.createDocumentFragment();
  const source = String(text ?? "");
  let at = 0;
  const close = completion ? source.indexOf("</think>") : -1;
  if (close !== -1 && !source.slice(0, close).includes("<think>")) {
    fragment.appendChild(
      h(
        "span",
        { class: "hl hl-think pre-opened", title: "<think> (opened by the chat template, in the prompt)" },
        source.slice(0, close),
        h("span", { class: "hl-tag" }, "</think>"),
      ),
    );
    at = close + "</think>".length;
  }
  PATTERN.lastIndex = at;
  for (let match = PATTERN.exec(source); match; match = PATTERN.exec(source)) {
    if (match.index > at) fragment.appendChild(document.createTextNode(source.slice(at, match.index)));
    if (match[1]) {
      const tag = match[1];
      fragment.appendChild(
        h(
          "span",
          { class: `hl hl-${tag.replace("_", "-")}`, title: `<${tag}>` },
          h("span", { class: "hl-tag" }, `<${tag}>`),
          match[2],
          match[3] ? h("span", { class: "hl-tag" }, match[3]) : h("span", { class: "hl-unclosed" }, " (unclosed)"),
        ),
      );
    } else {
      fragment.appendChild(h("span", { class: "hl-chatml" }, match[0]));
    }
    at = match.index + match[0].length;
  }
  if (at < source.length) fragment.appendChild(document.createTextNode(source.slice(at)));
  return fragment;
}

/** A <pre> of highlighted model text (`options` as for `highlighted`). */
export function codeBlock(text, label, options) {
  return h("pre", { class: "code", tabindex: "0", "aria-label": label || null }, highlighted(text, options));
}
