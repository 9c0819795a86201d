// A run's events as they happen, one line each (streamed text gathered into one line).

import { badge, h, resultText, statusClass } from "./dom.js";

// The streamed kinds, gathered into one line per run of deltas, and what each line is called.
const STREAMED = { text_delta: "text", scratch_pad_delta: "scratch pad", thought_delta: "thought" };

function code(status) {
  return typeof status === "number" ? badge(String(status), statusClass(status), `status ${status}`) : "";
}

function short(value, limit = 300) {
  let text;
  try {
    text = typeof value === "string" ? value : JSON.stringify(value);
  } catch {
    text = String(value);
  }
  return text.length > limit ? `${text.slice(0, limit - 1)}…` : text;
}

export function liveLog() {
  const list = h("ol", { class: "live-log", "aria-live": "polite", "aria-label": "live events" });
  let stream = null; // { kind, node } of the line streamed text goes into

  function line(kind, ...children) {
    stream = null;
    const item = h("li", { class: `ev ev-${kind}`, dataset: { kind } }, h("span", { class: "ev-kind" }, kind), " ", ...children);
    list.appendChild(item);
    list.scrollTop = list.scrollHeight;
    return item;
  }

  function streamed(kind, text) {
    if (!stream || stream.kind !== kind) {
      const node = h("span", { class: "ev-text" });
      list.appendChild(h("li", { class: `ev ev-${kind}`, dataset: { kind } }, h("span", { class: "ev-kind" }, STREAMED[kind]), " ", node));
      stream = { kind, node };
    }
    stream.node.textContent += text;
    list.scrollTop = list.scrollHeight;
  }

  function add(kind, data) {
    switch (kind) {
      case "text_delta":
      case "scratch_pad_delta":
        streamed(kind, data.text);
        break;
      case "thought_delta":
        if (data.revealed) {
          // A bare </think>: the lines streamed before in this turn were the thought, not text.
          line(kind, badge("revealed", "warn", "a bare </think>: what streamed before in this turn was the thought"), " ", h("span", { class: "ev-text" }, data.text));
        } else {
          streamed(kind, data.text);
        }
        break;
      case "tool_call_started":
      case "tool_call_delta":
        break;
      case "tool_call_parsed":
        line(kind, h("code", {}, data.name ?? "(unparsed)"), " ", data.error ? data.error : short(data.arguments));
        break;
      case "input":
        line(kind, code(data.status), " request ", h("code", {}, data.request_id));
        break;
      case "thought":
        line(
          kind, `step ${data.step} `, code(data.status),
          data.tool_calls?.length ? ` calls ${data.tool_calls.join(", ")}` : "",
          data.thought ? ` thought of ${data.thought.length} characters` : "",
          ...(data.notes || []).map((note) => h("span", { class: "ev-note" }, ` note: ${note}`)),
          data.error ? ` ${data.error}` : "",
        );
        break;
      case "selection":
        line(
          kind,
          code(data.status),
          ` planned ${data.planned.map((c) => c.name).join(", ") || "none"}`,
          data.rejected.length ? `; refused ${data.rejected.map((c) => `${c.name} (${c.status})`).join(", ")}` : "",
        );
        break;
      case "tool_results":
        line(kind, code(data.status), ...data.results.map((r) => h("span", { class: "ev-result" }, " ", h("code", {}, r.name), " ", code(r.status), " ", short(resultText(r.content), 300))));
        break;
      case "approval_required":
        line(kind, h("code", {}, data.tool), " ", short(data.arguments));
        break;
      case "approval_resolved":
        line(kind, badge(data.approved ? "approved" : "denied", data.approved ? "ok" : "err"), " ", data.reason);
        break;
      case "output":
        line(kind, code(data.status), " ", short(data.output, 2000));
        break;
      case "result":
        line(kind, badge("completed", "ok"), " ", code(data.result.status), " ", short(data.result.output, 2000));
        break;
      case "run_stopped":
        line(kind, badge(data.status.replace("_", " "), "err"), " ", data.error);
        break;
      default:
        line(kind, short(data));
    }
  }

  function problem(message) {
    line("problem", h("span", { role: "alert" }, message));
  }

  return { element: list, add, problem };
}
