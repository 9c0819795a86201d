// One run: per step the five stages as a timeline (latency bars, status codes), the prompt,
// the thought (and what the parser did not act on), the raw completion, each call; usage and cost; JSONL export; replay against today's tools.

import { t } from "./i18n.js";
import { api, follow, text } from "./api.js";
import { alertBox, append, badge, fmtMs, fmtTime, h, pretty, replace, shortId, statusBadge, statusClass } from "./dom.js";
import { approvalCard } from "./approvals.js";
import { codeBlock } from "./highlight.js";
import { liveLog } from "./live.js";

const LIVE = new Set(["running", "waiting_approval"]);
const REFRESHING = new Set(["tool_results", "output", "result", "run_stopped", "approval_required", "approval_resolved"]);

export async function renderRun(main, requestId, signal) {
  const path = `/v1/console/runs/${encodeURIComponent(requestId)}`;
  const head = h("div");
  const pending = h("div", { class: "pending" });
  const live = h("div", { class: "live" });
  const steps = h("div", { class: "steps" });
  const replay = h("div", { class: "replay", "aria-live": "polite" });
  append(main, head, pending, live, steps, replay);

  let view;
  let following = false;
  let refreshTimer = null;
  const approvalsShown = new Set();

  async function load() {
    try {
      view = await api(path, { signal });
    } catch (error) {
      if (signal.aborted) return;
      replace(head, h("h1", { tabindex: "-1" }, `${t("Run")} ${shortId(requestId)}`), alertBox(`${t("Could not load the run")}: ${error.message}`));
      return;
    }
    const open = new Set([...main.querySelectorAll("details[open][data-key]")].map((d) => d.dataset.key));
    replace(head, header(view, requestId, replay, signal));
    replace(steps, view.steps.length ? view.steps.map((step) => stepSection(step, view)) : h("p", { class: "muted empty" }, LIVE.has(view.status) ? t("No step is recorded yet: steps are recorded once they are whole.") : t("No audit records for this run.")));
    for (const details of main.querySelectorAll("details[data-key]")) if (open.has(details.dataset.key)) details.open = true;
    showPending();
    if (LIVE.has(view.status) && !following) startFollowing();
  }

  function showPending() {
    for (const item of view.pending_approvals) {
      if (approvalsShown.has(item.approval_id)) continue;
      approvalsShown.add(item.approval_id);
      pending.appendChild(approvalCard({ ...item, session_id: view.session_id }, { signal, followRun: false }));
    }
  }

  function scheduleRefresh(delay = 250) {
    clearTimeout(refreshTimer);
    refreshTimer = setTimeout(load, delay);
  }

  function startFollowing() {
    following = true;
    const log = liveLog();
    replace(live, h("h2", {}, t("Live"), " ", badge("live", "live")), log.element);
    follow(requestId, {
      signal,
      onEvent: (kind, data) => {
        log.add(kind, data);
        if (REFRESHING.has(kind)) scheduleRefresh();
      },
    })
      .then(() => scheduleRefresh(50))
      .catch((error) => log.problem(`Stopped following: ${error.message}`));
  }
  signal.addEventListener("abort", () => clearTimeout(refreshTimer));

  await load();
}

function header(view, requestId, replayBox, signal) {
  const usage = view.usage;
  const facts = [
    [t("Session"), h("a", { href: `#/chat/${encodeURIComponent(view.session_id)}`, title: "open this session in the chat" }, view.session_id)],
    [t("Status"), h("span", {}, statusBadge(view.status, view.status_code), typeof view.status_code === "number" ? ` ${view.status_code}` : "")],
    [t("Started"), fmtTime(view.created)],
    [t("Duration"), fmtMs(view.duration_ms)],
    [t("Model"), view.model ?? "—"],
    [t("Steps"), String(view.steps.length)],
    [t("Tokens"), usage ? `${usage.prompt_tokens} prompt + ${usage.completion_tokens} completion = ${usage.total_tokens ?? usage.prompt_tokens + usage.completion_tokens} (${usage.requests} requests)` : h("span", { class: "muted", title: "usage is kept with the run while the service holds it in memory; the audit trail does not record it" }, t("not recorded"))],
    [t("Cost"), view.cost === null || view.cost === undefined ? h("span", { class: "muted" }, usage ? t("no prices configured") : "—") : `$${view.cost.toFixed(6)}`],
  ];
  const exportButton = h("button", { type: "button", "data-action": "export" }, t("Export JSONL"));
  const replayButton = h("button", { type: "button", "data-action": "replay", disabled: LIVE.has(view.status) }, t("Replay against today's tools"));
  const exportStatus = h("span", { role: "status", class: "muted" });
  exportButton.addEventListener("click", async () => {
    try {
      const body = await text(`/v1/runs/${encodeURIComponent(requestId)}/trace.jsonl`, { signal });
      const url = URL.createObjectURL(new Blob([body], { type: "application/x-ndjson" }));
      const link = h("a", { href: url, download: `${requestId}.jsonl` });
      document.body.appendChild(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
      replace(exportStatus, `${body.split("\n").filter(Boolean).length} records exported`);
    } catch (error) {
      replace(exportStatus, alertBox(`Export failed: ${error.message}`));
    }
  });
  replayButton.addEventListener("click", () => runReplay(requestId, replayBox, replayButton, signal));
  const actions = [exportButton, replayButton];
  if (LIVE.has(view.status)) {
    const cancel = h("button", { type: "button", class: "danger", "data-action": "cancel" }, t("Cancel run"));
    cancel.addEventListener("click", async () => {
      cancel.disabled = true;
      try {
        await api(`/v1/runs/${encodeURIComponent(requestId)}/cancel`, { method: "POST" });
      } catch (error) {
        replace(exportStatus, alertBox(`Cancel failed: ${error.message}`));
      }
    });
    actions.push(cancel);
  }
  return [
    h("div", { class: "title-row" }, h("h1", { tabindex: "-1" }, t("Run"), " ", h("span", { class: "mono", title: requestId }, requestId))),
    h("dl", { class: "facts" }, facts.map(([name, value]) => h("div", {}, h("dt", {}, name), h("dd", {}, value)))),
    // The error gets the page's width below the facts: a long one (a traceback, a model's
    // reply quoted) would not fit the Status cell.
    view.error ? h("section", { class: "card run-error", "aria-label": "error" }, h("h2", {}, t("Error")), h("pre", { class: "code error", tabindex: "0" }, view.error)) : "",
    h("div", { class: "buttons actions" }, actions, exportStatus),
    h("p", { class: "muted small" }, t("A replay runs the recorded model answers through the agent as it is now: its tools run for real, calls that need approval are refused.")),
    view.user_message !== null ? h("section", { class: "card" }, h("h2", {}, t("User message")), h("pre", { class: "code", tabindex: "0" }, view.user_message)) : "",
    view.output !== null && view.output !== undefined ? h("section", { class: "card output" }, h("h2", {}, t("Final output")), h("pre", { class: "code", tabindex: "0" }, view.output)) : "",
    view.warnings.length ? h("ul", { class: "warnings" }, view.warnings.map((w) => h("li", {}, w))) : "",
  ];
}

function stepSection(step, view) {
  const heading = `step-${step.step}`;
  const tokens = step.usage ? ` · ${step.usage.prompt_tokens + step.usage.completion_tokens} tokens` : "";
  return h(
    "section",
    { class: "step card", "aria-labelledby": heading, "data-step": String(step.step), "data-nav-item": "", tabindex: "-1" },
    h("h2", { id: heading }, `${t("Step")} ${step.step}`, h("span", { class: "muted small" }, ` · at +${fmtMs(step.offset_ms)} · took ${fmtMs(step.duration_ms)}${tokens}`)),
    timeline(step),
    step.summary ? details(`summary-${step.step}`, t("Summary of older turns (the model was asked)"), [h("h4", {}, t("Asked")), codeBlock(step.summary.prompt), h("h4", {}, t("Answer")), codeBlock(step.summary.completion)]) : "",
    step.prompt ? details(`prompt-${step.step}`, step.prompt.kind === "prompt" ? t("Prompt (the whole prompt as sent)") : t("Prompt (the turns added since the previous step)"), codeBlock(step.prompt.text, "prompt")) : "",
    step.thought ? details(`thought-${step.step}`, t("Thought"), h("pre", { class: "code thought", tabindex: "0", "aria-label": "thought" }, step.thought), true) : "",
    step.notes?.length ? h("ul", { class: "warnings notes", "aria-label": "parser notes" }, step.notes.map((note) => h("li", {}, note))) : "",
    step.completion !== null ? details(`completion-${step.step}`, t("Raw completion"), codeBlock(step.completion, "raw completion", { completion: true }), true) : "",
    step.calls.length ? h("div", { class: "calls" }, h("h3", {}, `Tool calls (${step.calls.length})`), step.calls.map(callCard)) : "",
    step.output !== null ? h("div", { class: "step-output" }, h("h3", {}, t("Output")), h("pre", { class: "code", tabindex: "0" }, step.output)) : "",
  );
}

function details(key, summary, content, open = false) {
  return h("details", { "data-key": key, open }, h("summary", {}, summary), content);
}

function timeline(step) {
  const span = Math.max(step.duration_ms, 0.001);
  return h(
    "ol",
    { class: "timeline", "aria-label": `stages of step ${step.step}` },
    step.stages.map((stage) => {
      if (!stage.ran) {
        return h(
          "li",
          { class: "stage-row skipped", "data-stage": stage.stage },
          h("span", { class: "stage-name" }, stage.stage),
          h("span", { class: "track" }, h("span", { class: "stage-skip" }, "not run in this step")),
          h("span", { class: "latency" }, "—"),
          h("span", { class: "code-cell" }),
        );
      }
      const left = Math.min(100, (stage.offset_ms / span) * 100);
      const width = Math.max(0.6, Math.min(100 - left, (stage.latency_ms / span) * 100));
      return h(
        "li",
        { class: "stage-row", "data-stage": stage.stage },
        h("span", { class: "stage-name" }, stage.stage),
        h(
          "span",
          { class: "track" },
          h("span", {
            class: `stage-bar ${statusClass(stage.status_code)}`,
            role: "img",
            "aria-label": `${stage.stage}: ${fmtMs(stage.latency_ms)}, status ${stage.status_code}`,
            title: `${stage.stage}: started at +${fmtMs(stage.offset_ms)}, took ${fmtMs(stage.latency_ms)}`,
            style: { left: `${left}%`, width: `${width}%` },
          }),
        ),
        h("span", { class: "latency" }, fmtMs(stage.latency_ms)),
        h("span", { class: "code-cell" }, badge(String(stage.status_code), statusClass(stage.status_code), `status ${stage.status_code}`)),
      );
    }),
  );
}

function callCard(call) {
  const facts = [];
  if (call.refused) facts.push(badge("refused", "warn"));
  else if (call.ran) facts.push(h("span", {}, `ran in ${fmtMs(call.execution_time_ms)}`));
  else facts.push(badge("not run", "warn"));
  if (call.cache_hit) facts.push(badge("cache hit", "live"));
  else if (call.ran) facts.push(h("span", { class: "muted" }, "not cached"));
  if (call.approval) {
    facts.push(badge(call.approval.approved ? "approved" : "denied", call.approval.approved ? "ok" : "err", "approval decision"), h("span", { class: "muted" }, ` ${call.approval.reason ?? ""}`));
  }
  for (const [key, value] of Object.entries(call.metadata || {})) facts.push(h("span", { class: "muted" }, `${key}: ${pretty(value)}`));
  return h(
    "article",
    { class: "card call", "data-tool": call.name },
    h(
      "header",
      { class: "card-head" },
      h("h4", {}, h("code", {}, call.name)),
      call.status_code !== null && call.status_code !== undefined ? badge(String(call.status_code), statusClass(call.status_code), `status ${call.status_code}`) : "",
      h("span", { class: "call-facts" }, facts),
      call.id ? h("span", { class: "muted mono small", title: "call id" }, call.id) : "",
    ),
    h("div", { class: "call-grid" },
      h("div", {}, h("h5", {}, t("Arguments")), h("pre", { class: "code args", tabindex: "0" }, pretty(call.arguments ?? {}))),
      h("div", {}, h("h5", {}, call.error ? t("Error") : t("Result")), h("pre", { class: `code result ${call.error ? "error" : ""}`, tabindex: "0" }, call.error ? call.error : pretty(call.result ?? null))),
    ),
  );
}

async function runReplay(requestId, box, button, signal) {
  button.disabled = true;
  replace(box, h("p", { role: "status" }, t("Replaying…")));
  try {
    const report = await api(`/v1/runs/${encodeURIComponent(requestId)}/replay`, { method: "POST", signal });
    replace(box, replayReport(report));
    box.querySelector("h2")?.focus();
  } catch (error) {
    replace(box, alertBox(`Replay failed: ${error.message}`));
  } finally {
    button.disabled = false;
  }
}

function replayReport(report) {
  const differing = report.steps.filter((s) => !s.matched).length;
  return h(
    "section",
    { class: `card replay-report ${report.matched ? "matched" : "differs"}`, "data-nav-item": "", tabindex: "-1" },
    h("h2", { tabindex: "-1" }, t("Replay against today's tools")),
    h(
      "p",
      { class: "verdict" },
      report.matched
        ? [badge("matches", "ok"), ` all ${report.steps.length} steps do the same today`]
        : [badge("differs", "err"), ` ${differing} of ${report.steps.length} steps differ, first at step ${report.first_difference}`],
    ),
    report.notes.length ? h("ul", { class: "warnings" }, report.notes.map((n) => h("li", {}, n))) : "",
    report.steps.map((step) =>
      h(
        "div",
        { class: `replay-step ${step.matched ? "matched" : "differs"}`, "data-step": String(step.step) },
        h("h3", {}, `Step ${step.step} `, step.matched ? badge("same", "ok") : badge("differs", "err"), step.prompt_changed ? badge("prompt changed", "warn", "the prompt differs from the recorded one (not a mismatch)") : ""),
        step.differences.length ? h("ul", { class: "differences" }, step.differences.map((d) => h("li", {}, d))) : "",
        step.matched ? "" : comparison(step),
      ),
    ),
  );
}

function comparison(step) {
  const rows = [];
  if (pretty(step.expected_calls) !== pretty(step.actual_calls)) rows.push([t("Calls"), pretty(step.expected_calls), pretty(step.actual_calls)]);
  if (step.expected_results !== step.actual_results) rows.push([t("Tool results"), step.expected_results ?? "(none)", step.actual_results ?? "(none)"]);
  if (step.expected_output !== step.actual_output) rows.push([t("Output"), step.expected_output ?? "(none)", step.actual_output ?? "(none)"]);
  return rows.map(([what, before, after]) =>
    h("div", { class: "diff" },
      h("h4", {}, what),
      h("div", { class: "diff-grid" },
        h("div", { class: "diff-old" }, h("h5", {}, t("Recorded")), codeBlock(before)),
        h("div", { class: "diff-new" }, h("h5", {}, t("Today")), codeBlock(after)),
      ),
    ),
  );
}
