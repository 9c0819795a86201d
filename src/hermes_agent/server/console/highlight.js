// Model text with its Hermes tags marked: <tool_call>, <scratch_pad>, <tool_response>, <tools>
// and the ChatML turn markers. Everything is text nodes inside spans; nothing is parsed as HTML.

import { h } from "./dom.js";

const PATTERN =
  /<(tool_call|scratch_pad|tool_response|tools)>([\s\S]*?)(<\/\1>|$)|<\|im_start\|>[a-z_]*|<\|im_end\|>/g;

/** A fragment showing `text` with its tags highlighted (an unclosed tag runs to the end). */
export function highlighted(text) {
  const fragment = document.createDocumentFragment();
  const source = String(text ?? "");
  let at = 0;
  for (const match of source.matchAll(PATTERN)) {
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

/** A <pre> of highlighted model text. */
export function codeBlock(text, label) {
  return h("pre", { class: "code", tabindex: "0", "aria-label": label || null }, highlighted(text));
}
