// The runs list: newest first, filtered by session, status, tool and time, refreshed while
// runs are in flight.

import { t } from "./i18n.js";
import { api } from "./api.js";
import { alertBox, append, badge, field, fmtMs, fmtTime, h, replace, shortId, statusBadge } from "./dom.js";

const STATUSES = ["running", "waiting_approval", "completed", "failed", "cancelled", "timed_out", "incomplete"];
const LIVE = new Set(["running", "waiting_approval"]);

// The columns, in the order a wide screen shows them; a phone stacks each row as a card with
// the status beside the run's id (console.css), each cell named by its data-label.
const COLUMNS = [
  ["started", "Started"], ["run", "Run"], ["session", "Session"], ["status", "Status"],
  ["steps", "Steps"], ["duration", "Duration"], ["tools", "Tools"], ["approvals", "Approvals"],
];
const LABELS = Object.fromEntries(COLUMNS);
const NUMERIC = new Set(["steps", "duration"]);

function cell(name, ...content) {
  return h("td", { class: `col-${name}${NUMERIC.has(name) ? " num" : ""}`, "data-label": LABELS[name] }, content);
}

function localInput(seconds) {
  if (!seconds) return "";
  const date = new Date(Number(seconds) * 1000);
  const pad = (n) => String(n).padStart(2, "0");
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}T${pad(date.getHours())}:${pad(date.getMinutes())}`;
}

function epoch(value) {
  const parsed = Date.parse(value); // datetime-local: the reader's time zone
  return Number.isNaN(parsed) ? "" : String(Math.floor(parsed / 1000));
}

export async function renderRuns(main, query, signal) {
  const session = h("input", { type: "search", name: "session_id", value: query.get("session_id") || "", autocomplete: "off", "data-search": "" });
  const status = h(
    "select",
    { name: "status" },
    h("option", { value: "" }, "any"),
    STATUSES.map((s) => h("option", { value: s, selected: query.get("status") === s }, s.replace("_", " "))),
  );
  const tool = h("input", { type: "search", name: "tool", value: query.get("tool") || "", autocomplete: "off" });
  const since = h("input", { type: "datetime-local", name: "since", value: localInput(query.get("since")) });
  const until = h("input", { type: "datetime-local", name: "until", value: localInput(query.get("until")) });
  const form = h(
    "form",
    { class: "filters", role: "search", "aria-label": "filter runs" },
    field("Session", session),
    field("Status", status),
    field("Tool", tool),
    field("From", since),
    field("To", until),
    h("div", { class: "buttons" }, h("button", { type: "submit", class: "primary" }, "Filter"), h("button", { type: "button", "data-action": "clear" }, "Clear")),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const next = new URLSearchParams();
    if (session.value.trim()) next.set("session_id", session.value.trim());
    if (status.value) next.set("status", status.value);
    if (tool.value.trim()) next.set("tool", tool.value.trim());
    if (since.value) next.set("since", epoch(since.value));
    if (until.value) next.set("until", epoch(until.value));
    const hash = `#/runs${next.toString() ? `?${next}` : ""}`;
    if (location.hash === hash) refresh();
    else location.hash = hash;
  });
  form.querySelector("[data-action=clear]").addEventListener("click", () => {
    location.hash = "#/runs";
  });

  const updated = h("span", { class: "muted", role: "status" });
  // Shown only while the table is wider than its box (a tablet, a narrow window): the columns
  // past the edge are there, a swipe or a scroll away. On a phone the rows are stacked as
  // cards instead (console.css), so nothing is past the edge.
  const hint = h("p", { class: "scroll-hint muted small", hidden: true }, "The table is wider than the screen: scroll it sideways for more columns.");
  const problem = h("div");
  const body = h("tbody");
  const table = h(
    "table",
    { class: "runs" },
    h("caption", { class: "visually-hidden" }, "Runs, newest first"),
    h(
      "thead",
      {},
      h("tr", {}, COLUMNS.map(([name, t]) => h("th", { scope: "col", class: `col-${name}` }, t))),
    ),
    body,
  );
  const wrap = h("div", { class: "table-wrap", tabindex: "0", "aria-label": "runs table" }, table);
  append(
    main,
    h("div", { class: "title-row" }, h("h1", { tabindex: "-1" }, t("Runs")), updated),
    form,
    problem,
    hint,
    wrap,
  );
  const showHint = () => {
    hint.hidden = wrap.scrollWidth <= wrap.clientWidth + 1;
  };
  const resized = new ResizeObserver(showHint);
  resized.observe(wrap);
  signal.addEventListener("abort", () => resized.disconnect());

  let lastShown = "";
  let timer = null;
  async function refresh() {
    clearTimeout(timer);
    let live = false;
    try {
      const params = new URLSearchParams(query);
      params.set("limit", "100");
      const { runs } = await api(`/v1/console/runs?${params}`, { signal });
      live = runs.some((r) => LIVE.has(r.status));
      const shown = JSON.stringify(runs);
      if (shown !== lastShown) {
        lastShown = shown;
        fill(runs);
      }
      replace(problem);
      replace(updated, live ? badge("live", "live") : "", ` ${runs.length} runs · updated ${new Date().toLocaleTimeString()}`);
    } catch (error) {
      if (signal.aborted) return;
      replace(problem, alertBox(`Could not load runs: ${error.message}`));
    }
    if (!signal.aborted) timer = setTimeout(refresh, live ? 1000 : 4000);
  }
  signal.addEventListener("abort", () => clearTimeout(timer));

  function fill(runs) {
    // Keep the reader's place: the link that had focus gets it back after the refresh.
    const focused = document.activeElement?.closest?.("tbody") === body ? document.activeElement.getAttribute("href") : null;
    replace(
      body,
      runs.length
        ? runs.map((run) =>
            h(
              "tr",
              { class: `run-row status-${run.status}`, "data-request-id": run.request_id },
              cell("started", fmtTime(run.created)),
              cell("run", h("a", { href: `#/runs/${encodeURIComponent(run.request_id)}`, class: "mono", title: run.request_id }, shortId(run.request_id))),
              cell("session", h("a", { href: `#/runs?session_id=${encodeURIComponent(run.session_id)}`, title: `runs of session ${run.session_id}` }, run.session_id)),
              cell("status", statusBadge(run.status, run.status_code), run.status_code ? ` ${run.status_code}` : ""),
              cell("steps", run.steps ?? "—"),
              cell("duration", fmtMs(run.duration_ms)),
              cell("tools", run.tools.length ? run.tools.map((t) => h("code", { class: "chip" }, t)) : h("span", { class: "muted" }, "none")),
              cell("approvals", run.pending_approvals ? h("a", { href: "#/approvals" }, badge(`${run.pending_approvals} waiting`, "wait")) : ""),
            ),
          )
        : h("tr", {}, h("td", { colspan: String(COLUMNS.length), class: "muted empty" }, "No runs match.")),
    );
    if (focused) body.querySelector(`a[href="${CSS.escape(focused)}"]`)?.focus();
    showHint();
  }

  await refresh();
}
