// Building the page without ever parsing data as HTML: every string becomes a text node or an
// attribute value, and the few attributes that could carry code are refused.

const REFUSED = new Set(["innerHTML", "outerHTML", "srcdoc", "src", "formaction", "action"]);

/**
 * h("a", {href: "#/runs", class: "x", onclick: fn}, "text", child, [more]) -> Element.
 * Children that are not Nodes are shown as text; null, undefined and false are skipped.
 */
export function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (REFUSED.has(key)) throw new Error(`h(): the attribute ${key} is not allowed`);
    if (key.startsWith("on")) {
      if (typeof value !== "function") throw new Error(`h(): ${key} must be a function`);
      el.addEventListener(key.slice(2), value);
    } else if (key === "class") {
      el.className = value;
    } else if (key === "text") {
      el.textContent = String(value);
    } else if (key === "dataset") {
      for (const [name, item] of Object.entries(value)) el.dataset[name] = String(item);
    } else if (key === "style") {
      for (const [name, item] of Object.entries(value)) el.style.setProperty(name, String(item));
    } else if (key === "value") {
      el.value = String(value);
    } else if (key === "href") {
      el.setAttribute("href", safeHref(String(value)));
    } else if (value === true) {
      el.setAttribute(key, "");
    } else {
      el.setAttribute(key, String(value));
    }
  }
  append(el, children);
  return el;
}

/** Links inside the console (hash routes, its own paths) and downloads made here, only. */
export function safeHref(href) {
  if (href.startsWith("#") || href.startsWith("blob:") || /^\/(?!\/)/.test(href)) return href;
  throw new Error(`h(): refusing the link ${href}`);
}

export function append(el, ...children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

export function replace(el, ...children) {
  return append(clear(el), children);
}

/** "0.04 ms", "12.3 ms", "1.52 s"; "—" when unknown. */
export function fmtMs(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return "—";
  if (ms < 1) return `${ms.toFixed(2)} ms`;
  if (ms < 1000) return `${ms.toFixed(1)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(2)} s`;
  return `${Math.floor(ms / 60000)} min ${Math.round((ms % 60000) / 1000)} s`;
}

/** A time (seconds since the epoch) in the reader's locale. */
export function fmtTime(seconds) {
  if (!seconds) return "—";
  return new Date(seconds * 1000).toLocaleString(undefined, {
    year: "numeric", month: "short", day: "numeric",
    hour: "2-digit", minute: "2-digit", second: "2-digit",
  });
}

export function pretty(value) {
  if (typeof value === "string") return value;
  try {
    return JSON.stringify(value, null, 2);
  } catch {
    return String(value);
  }
}

/** What a tool returned, as the model reads it: the envelope's data, or its error. */
export function resultText(content) {
  if (content && typeof content === "object" && "status" in content && ("data" in content || "error" in content)) {
    return content.error !== null && content.error !== undefined ? `error: ${content.error}` : pretty(content.data);
  }
  return pretty(content);
}

export function shortId(id) {
  return String(id || "").slice(0, 8);
}

/** The class of a status badge: ok (2xx), warn (4xx), err (5xx) or a run status. A run that
 * did not finish with an answer (failed, timed out, cancelled, dead) is a failure: red. */
export function statusClass(code) {
  if (typeof code === "number") return code >= 500 ? "err" : code >= 400 ? "warn" : "ok";
  return {
    completed: "ok", running: "live", waiting_approval: "wait", failed: "err",
    cancelled: "err", timed_out: "err", dead: "err", interrupted: "err", incomplete: "warn",
  }[code] || "";
}

export function badge(text, cls, label) {
  return h("span", { class: `badge ${cls || ""}`, title: label || null }, text);
}

/** A run's status as a badge. ``code`` is the run's status code when known: a run that ended
 * with a 4xx or 5xx is shown as failed whatever its status word says, never as a green
 * "completed"; one that ended with a partial answer (206) is the amber "partial" that the
 * chat shows for the same run (resultBadge). */
export function statusBadge(status, code) {
  if (status === "completed" && code === 206) return badge("partial", "warn", `status: ${status}, 206: a partial answer`);
  const failed = status === "completed" && typeof code === "number" && code >= 400;
  const shown = failed ? "failed" : String(status);
  const label = failed ? `status: ${status}, ${code}` : `status: ${status}`;
  return badge(shown.replaceAll("_", " "), statusClass(shown), label);
}

/** The badge of a finished turn's result (the ``result`` event's RunResult status). */
export function resultBadge(status) {
  if (status >= 400) return badge(`failed ${status}`, "err", `status ${status}`);
  if (status === 206) return badge("partial", "warn", "status 206: a partial answer");
  return badge("done", "ok", `status ${status}`);
}

/** A labelled form control. */
export function field(label, control) {
  const id = control.id || `f-${Math.random().toString(36).slice(2, 9)}`;
  control.id = id;
  return h("div", { class: "field" }, h("label", { for: id }, label), control);
}

export function alertBox(message) {
  return h("p", { class: "alert", role: "alert" }, message);
}
