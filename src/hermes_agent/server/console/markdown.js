// Markdown from the model, drawn as DOM nodes: what it writes is never parsed as HTML. Every
// piece of text becomes a text node, so a "<script>" in an answer is shown as those characters;
// links are shown as their text and address, not followed (the console links only to itself).
//
// What is understood is what chat answers use: paragraphs, headings (#), bullet and numbered
// lists, fenced code (```), block quotes (>), pipe tables (what the ``table`` and ``markdown``
// output formats draw: a header row, a |---|:--:| row, then rows; "\|" is a pipe in a cell),
// and inline **bold**, *italic* or _italic_, `code` and [text](address). Anything else stays
// as the text it is.

import { h } from "./dom.js";

// Every piece is bounded (and a link's text holds no "["), so no line can make a match try
// more than a few thousand characters from any position: the model's text cannot make the
// page work quadratically.
const INLINE = /(`[^`\n]{1,1000}`)|(\*\*[^*\n]{1,1000}\*\*)|(\*[^*\s][^*\n]{0,1000}\*|_[^_\s][^_\n]{0,1000}_)|(\[[^\][\n]{1,500}\]\([^)\s]{1,2000}\))/;
const MAX_CHARS = 200_000; // past this, the answer is shown as plain text
const MAX_INLINE_LINE = 4_000; // a longer line is shown as its text
// Block quotes nest this deep at most: the innermost holds the rest as its text. Each level reads
// the quote's lines again and is one more call on the stack, so without a bound a line of
// many ">" would take time quadratic in its length and overflow the stack.
export const MAX_QUOTE_DEPTH = 32;
// A table wider than this is not one: its lines stay a paragraph. Cells are read in one pass
// over each line, so a table costs time linear in its text.
export const MAX_TABLE_COLUMNS = 64;
const DELIMITER_CELL = /^\s*(:?)-+(:?)\s*$/;

/** The cells of one table line: split at each "|" that no "\\" escapes, the outer pipes
 * dropped, "\\|" and "\\\\" read as the characters they stand for; ``null`` past the bound. */
function cells(line) {
  let text = line.trim();
  if (text.startsWith("|")) text = text.slice(1);
  const found = [];
  let current = "";
  let closed = false;
  for (let i = 0; i < text.length; i += 1) {
    const char = text[i];
    if (char === "\\" && (text[i + 1] === "|" || text[i + 1] === "\\")) {
      current += text[i + 1];
      i += 1;
    } else if (char === "|") {
      found.push(current.trim());
      if (found.length > MAX_TABLE_COLUMNS) return null;
      current = "";
      closed = true;
    } else {
      current += char;
      closed = false;
    }
  }
  if (!closed || current.trim()) found.push(current.trim());
  return found.length > MAX_TABLE_COLUMNS ? null : found;
}

/** The alignments of a delimiter row (``|---|:--:|--:|``), or ``null`` when ``line`` is not one
 * for ``count`` columns. */
function alignments(line, count) {
  if (!line || !line.includes("-") || !/^[\s|:-]+$/.test(line)) return null;
  const parts = cells(line);
  if (!parts || parts.length !== count) return null;
  const found = [];
  for (const part of parts) {
    const match = DELIMITER_CELL.exec(part);
    if (!match) return null;
    found.push(match[1] && match[2] ? "center" : match[2] ? "right" : match[1] ? "left" : null);
  }
  return found;
}

/** A table starting at ``lines[i]``: its header cells and alignments, or ``null``. */
function tableAt(lines, i) {
  const line = lines[i];
  if (!line.includes("|") || i + 1 >= lines.length || !lines[i + 1].includes("-")) return null;
  const header = cells(line);
  if (!header || !header.length) return null;
  const align = alignments(lines[i + 1], header.length);
  return align ? { header, align } : null;
}

function tableCell(tag, text, align) {
  return h(tag, { scope: tag === "th" ? "col" : null, class: align ? `align-${align}` : null }, inline(text));
}

/** The inline pieces of one line of text, as nodes. */
function inline(text) {
  if (text.length > MAX_INLINE_LINE) return [text];
  const nodes = [];
  let rest = text;
  while (rest) {
    const found = INLINE.exec(rest);
    if (!found) {
      nodes.push(rest);
      break;
    }
    if (found.index) nodes.push(rest.slice(0, found.index));
    const [token] = found;
    if (found[1]) nodes.push(h("code", {}, token.slice(1, -1)));
    else if (found[2]) nodes.push(h("strong", {}, inline(token.slice(2, -2))));
    else if (found[3]) nodes.push(h("em", {}, inline(token.slice(1, -1))));
    else {
      const split = token.indexOf("](");
      nodes.push(h("span", { class: "md-link", title: token.slice(split + 2, -1) }, inline(token.slice(1, split)), " ", h("span", { class: "muted" }, `(${token.slice(split + 2, -1)})`)));
    }
    rest = rest.slice(found.index + token.length);
  }
  return nodes;
}

/** ``text`` (Markdown) as an array of block elements. */
export function markdown(text) {
  const source = String(text ?? "");
  if (source.length > MAX_CHARS) return [h("p", {}, source)];
  return blocks(source.replace(/\r\n?/g, "\n").split("\n"), 0);
}

/** ``lines``, inside ``depth`` block quotes, as block elements. */
function blocks(lines, depth) {
  const found = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    const fence = /^\s*(```|~~~)\s*([\w+-]*)\s*$/.exec(line);
    if (fence) {
      const body = [];
      i += 1;
      while (i < lines.length && !lines[i].trim().startsWith(fence[1])) body.push(lines[i++]);
      i += 1; // the closing fence (or the end of an unclosed block)
      found.push(h("pre", { class: "code md-code", dataset: fence[2] ? { lang: fence[2] } : null }, h("code", {}, body.join("\n"))));
      continue;
    }
    const heading = /^(#{1,6})\s+(.*)$/.exec(line);
    if (heading) {
      // Headings inside an answer sit below the page's own h1-h3.
      found.push(h(`h${Math.min(6, heading[1].length + 3)}`, { class: "md-heading" }, inline(heading[2])));
      i += 1;
      continue;
    }
    const table = tableAt(lines, i);
    if (table) {
      const { header, align } = table;
      const rows = [];
      i += 2;
      while (i < lines.length && lines[i].trim() && lines[i].includes("|")) {
        const row = cells(lines[i++]) || [];
        rows.push(h("tr", {}, header.map((_, n) => tableCell("td", row[n] ?? "", align[n]))));
      }
      found.push(h("div", { class: "md-table-wrap" },
        h("table", { class: "md-table" },
          h("thead", {}, h("tr", {}, header.map((text, n) => tableCell("th", text, align[n])))),
          h("tbody", {}, rows))));
      continue;
    }
    const item = /^\s*([-*+]|\d{1,9}[.)])\s+(.*)$/.exec(line);
    if (item) {
      const ordered = /\d/.test(item[1]);
      const items = [];
      while (i < lines.length) {
        const next = /^\s*([-*+]|\d{1,9}[.)])\s+(.*)$/.exec(lines[i]);
        if (!next || /\d/.test(next[1]) !== ordered) break;
        items.push(h("li", {}, inline(next[2])));
        i += 1;
      }
      found.push(h(ordered ? "ol" : "ul", { class: "md-list" }, items));
      continue;
    }
    if (/^\s*>/.test(line)) {
      const quoted = [];
      while (i < lines.length && /^\s*>/.test(lines[i])) quoted.push(lines[i++].replace(/^\s*>\s?/, ""));
      const inside = depth + 1 < MAX_QUOTE_DEPTH ? blocks(quoted, depth + 1) : [h("p", {}, quoted.join("\n"))];
      found.push(h("blockquote", {}, inside));
      continue;
    }
    if (!line.trim()) {
      i += 1;
      continue;
    }
    const paragraph = [];
    while (i < lines.length && lines[i].trim() && !/^\s*(```|~~~|#{1,6}\s|>|[-*+]\s|\d{1,9}[.)]\s)/.test(lines[i]) && !(paragraph.length && tableAt(lines, i))) paragraph.push(lines[i++]);
    if (!paragraph.length) paragraph.push(lines[i++]); // a line no other rule took
    found.push(h("p", {}, paragraph.flatMap((part, n) => (n ? [h("br"), ...inline(part)] : inline(part)))));
  }
  return found;
}
