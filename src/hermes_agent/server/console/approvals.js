// Approvals: what waits for an answer (the exact tool and arguments), approve or deny with a
// reason, and the run resuming live under the card.

import { t } from "./i18n.js";
import { api, follow } from "./api.js";
import { alertBox, append, badge, field, fmtTime, h, pretty, replace, shortId } from "./dom.js";
import { liveLog } from "./live.js";

/**
 * One pending approval. `follow` (default true): after the answer, show the run's events as
 * it resumes, until it ends. `onAnswered(approved)` is called once the service took the answer.
 */
export function approvalCard(pending, { signal, followRun = true, onAnswered } = {}) {
  const reason = h("input", { type: "text", name: "reason", autocomplete: "off", placeholder: "why (kept in the audit trail)" });
  const status = h("p", { class: "approval-status", role: "status" });
  const after = h("div", { class: "approval-after" });
  const approve = h("button", { type: "button", class: "primary", "data-action": "approve" }, t("Approve"));
  const deny = h("button", { type: "button", class: "danger", "data-action": "deny" }, t("Deny"));
  const state = h("span", {}, badge("waiting", "wait"));
  const card = h(
    "article",
    {
      class: "card approval",
      "data-approval-id": pending.approval_id,
      "data-nav-item": "",
      tabindex: "-1",
      "aria-label": `approval for ${pending.tool}`,
    },
    h(
      "header",
      { class: "card-head" },
      h("h3", {}, t("Call"), " ", h("code", {}, pending.tool)),
      state,
      h(
        "span",
        { class: "muted" },
        "run ",
        h("a", { href: `#/runs/${encodeURIComponent(pending.request_id)}` }, shortId(pending.request_id)),
        pending.session_id ? ` · session ${pending.session_id}` : "",
        pending.expires ? ` · expires ${fmtTime(Date.parse(pending.expires) / 1000)}` : "",
      ),
    ),
    h("h4", {}, t("Arguments")),
    h("pre", { class: "code args", tabindex: "0" }, pretty(pending.arguments)),
    h(
      "form",
      { class: "approval-form", onsubmit: (event) => event.preventDefault() },
      field(t("Reason"), reason),
      h("div", { class: "buttons" }, approve, deny),
    ),
    status,
    after,
  );

  async function answer(approved) {
    approve.disabled = deny.disabled = reason.disabled = true;
    replace(status, approved ? t("Approving…") : t("Denying…"));
    try {
      const body = { approved };
      if (reason.value.trim()) body.reason = reason.value.trim();
      const answered = await api(`/v1/approvals/${encodeURIComponent(pending.approval_id)}`, {
        method: "POST",
        body,
      });
      card.classList.add(approved ? "approved" : "denied");
      replace(state, badge("answered", approved ? "ok" : "err"));
      replace(status, badge(approved ? "approved" : "denied", approved ? "ok" : "err"), " ", answered.reason);
      window.dispatchEvent(new CustomEvent("hermes:approvals-changed"));
      onAnswered?.(approved);
      if (followRun) await followAfter(pending.request_id, after, signal);
    } catch (error) {
      approve.disabled = deny.disabled = reason.disabled = false;
      replace(status, alertBox(`${t("Could not answer")}: ${error.message}`));
    }
  }
  approve.addEventListener("click", () => answer(true));
  deny.addEventListener("click", () => answer(false));
  return card;
}

async function followAfter(requestId, into, signal) {
  const log = liveLog();
  append(into, h("h4", {}, t("The run resumes")), log.element);
  try {
    await follow(requestId, { signal, onEvent: (kind, data) => log.add(kind, data) });
  } catch (error) {
    log.problem(`Could not follow the run: ${error.message}`);
  }
}

/** The Approvals view: the caller's pending approvals, refreshed every few seconds. */
export async function renderApprovals(main, signal) {
  const list = h("div", { class: "approval-list" });
  const empty = h("p", { class: "muted empty" }, t("Nothing waits for an approval."));
  const problem = h("div");
  append(
    main,
    h("h1", { tabindex: "-1" }, t("Approvals")),
    h(
      "p",
      { class: "lede" },
      "Calls of tools that need approval wait here with the exact arguments the tool would get. " +
        "An answer is single-use and bound to that call; an unanswered one expires as a denial.",
    ),
    problem,
    list,
  );
  const shown = new Map();
  async function refresh() {
    try {
      const { approvals } = await api("/v1/approvals", { signal });
      replace(problem);
      const waiting = new Set(approvals.map((p) => p.approval_id));
      for (const pending of approvals) {
        if (!shown.has(pending.approval_id)) {
          const card = approvalCard(pending, { signal });
          shown.set(pending.approval_id, card);
          list.appendChild(card);
        }
      }
      for (const [id, card] of shown) {
        const answeredHere = card.classList.contains("approved") || card.classList.contains("denied");
        if (!waiting.has(id) && !answeredHere) {
          card.remove();
          shown.delete(id);
        }
      }
      if (!list.children.length) list.appendChild(empty);
      else if (empty.parentNode && list.children.length > 1) empty.remove();
    } catch (error) {
      if (!signal.aborted) replace(problem, alertBox(`${t("Could not load approvals")}: ${error.message}`));
    }
  }
  await refresh();
  const timer = setInterval(refresh, 2000);
  signal.addEventListener("abort", () => clearInterval(timer));
}
