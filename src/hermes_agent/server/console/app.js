// The console's shell: the key, the routes (#/runs, #/runs/<id>, #/approvals, #/chat[/<session>]),
// the keyboard, and the count of approvals waiting.

import { ApiError, api, clearKey, getKey, setKey } from "./api.js";
import { alertBox, append, field, h, replace } from "./dom.js";
import { t, translatePage } from "./i18n.js";
import { renderApprovals } from "./approvals.js";
import { renderChat } from "./chat.js";
import { renderRun } from "./run.js";
import { renderRuns } from "./runs.js";

const main = document.getElementById("main");
const who = document.getElementById("who");
const count = document.getElementById("approval-count");
const help = document.getElementById("help");
const helpToggle = document.getElementById("help-toggle");
const nav = document.querySelector("header.top nav");
let current = null; // the AbortController of the view on screen
let me = null;

function parseRoute() {
  const raw = location.hash.startsWith("#/") ? location.hash.slice(2) : "";
  const [pathPart, queryPart] = raw.split("?", 2);
  const parts = pathPart.split("/").filter(Boolean).map(decodeURIComponent);
  return { name: parts[0] || "runs", arg: parts[1] || "", query: new URLSearchParams(queryPart || "") };
}

async function show() {
  current?.abort();
  current = new AbortController();
  const { signal } = current;
  const route = parseRoute();
  for (const link of document.querySelectorAll("nav a[data-route]")) {
    if (link.dataset.route === route.name) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  replace(main);
  document.title = `${route.name[0].toUpperCase()}${route.name.slice(1)} · Hermes Agent console`;
  try {
    if (route.name === "runs" && route.arg) await renderRun(main, route.arg, signal);
    else if (route.name === "runs") await renderRuns(main, route.query, signal);
    else if (route.name === "approvals") await renderApprovals(main, signal);
    else if (route.name === "chat") await renderChat(main, route.arg, signal);
    else append(main, h("h1", { tabindex: "-1" }, t("Not found")), h("p", {}, h("a", { href: "#/runs" }, t("Back to the runs"))));
  } catch (error) {
    if (!signal.aborted) append(main, alertBox(`Something went wrong: ${error.message}`));
  }
  if (!signal.aborted) {
    main.dataset.ready = route.name;
    const heading = main.querySelector("h1");
    if (heading && document.activeElement === document.body) heading.focus({ preventScroll: true });
  }
}

function askForKey(message) {
  current?.abort();
  nav.hidden = true;
  replace(who);
  count.hidden = true;
  const input = h("input", { type: "password", name: "key", autocomplete: "off", spellcheck: "false", required: true, placeholder: "hk_…" });
  const form = h(
    "form",
    { class: "card key-form" },
    h("h1", { tabindex: "-1" }, t("API key")),
    h("p", {}, "Paste an API key: the one ", h("code", {}, "hermes-agent serve"), " keeps in ", h("code", {}, ".hermes/api-key"), ", or one made with ", h("code", {}, "hermes-agent keys create --user NAME"), "."),
    h("p", { class: "muted" }, "It is kept in this tab only (sessionStorage, gone when the tab closes) and sent as ", h("code", {}, "Authorization: Bearer"), " to this service, nowhere else."),
    message ? alertBox(message) : "",
    field(t("Key"), input),
    h("div", { class: "buttons" }, h("button", { type: "submit", class: "primary" }, t("Use this key"))),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    setKey(input.value);
    start();
  });
  replace(main, form);
  main.dataset.ready = "key";
  input.focus();
}

async function start() {
  try {
    me = await api("/v1/console/me");
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) {
      const had = getKey();
      clearKey();
      askForKey(had ? "That key was not accepted: it is unknown or revoked." : "");
      return;
    }
    replace(main, alertBox(`The service did not answer: ${error.message}`));
    return;
  }
  nav.hidden = false;
  replace(who, h("span", { title: me.admin ? "admin key" : "" }, me.user_id, me.admin ? " (admin)" : ""));
  if (getKey()) {
    const forget = h("button", { type: "button", class: "link", "data-action": "forget-key" }, t("Forget key"));
    forget.addEventListener("click", () => {
      clearKey();
      me = null;
      askForKey("");
    });
    append(who, " ", forget);
  }
  pollApprovals();
  await show();
}

let approvalTimer = null;
async function pollApprovals() {
  clearTimeout(approvalTimer);
  if (!me) return;
  try {
    if (document.visibilityState === "visible") {
      const { approvals } = await api("/v1/approvals");
      count.hidden = approvals.length === 0;
      count.textContent = String(approvals.length);
      count.setAttribute("aria-label", `${approvals.length} waiting`);
    }
  } catch {
    // shown by the views; the count just stays as it was
  }
  approvalTimer = setTimeout(pollApprovals, 3000);
}

function typing(target) {
  return target instanceof HTMLElement && (target.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(target.tagName));
}

function toggleHelp(open = help.hidden) {
  help.hidden = !open;
  helpToggle.setAttribute("aria-expanded", String(open));
}

function move(by) {
  const items = [...main.querySelectorAll("[data-nav-item]")];
  if (!items.length) return;
  const at = items.findIndex((item) => item.contains(document.activeElement));
  const next = items[Math.max(0, Math.min(items.length - 1, at < 0 ? (by > 0 ? 0 : items.length - 1) : at + by))];
  next.focus();
  next.scrollIntoView({ block: "start", behavior: "smooth" });
}

document.addEventListener("keydown", (event) => {
  if (event.key === "Escape" && !help.hidden) {
    toggleHelp(false);
    helpToggle.focus();
    return;
  }
  if (event.ctrlKey || event.metaKey || event.altKey || typing(event.target) || !me) return;
  const go = { r: "#/runs", a: "#/approvals", c: "#/chat" }[event.key];
  if (go) {
    event.preventDefault();
    location.hash = go;
  } else if (event.key === "/") {
    event.preventDefault();
    main.querySelector("[data-search]")?.focus();
  } else if (event.key === "?") {
    event.preventDefault();
    toggleHelp();
  } else if (event.key === "j" || event.key === "k") {
    event.preventDefault();
    move(event.key === "j" ? 1 : -1);
  }
});

helpToggle.addEventListener("click", () => toggleHelp());
window.addEventListener("hashchange", () => {
  // "#main" (the skip link) moves focus; only "#/..." is a route.
  if (me && (location.hash === "" || location.hash.startsWith("#/"))) show();
});
window.addEventListener("hermes:unauthorized", () => {
  if (me) {
    me = null;
    clearKey();
    askForKey("The key stopped working (revoked?): paste another.");
  }
});
window.addEventListener("hermes:approvals-changed", () => pollApprovals());
document.addEventListener("visibilitychange", () => {
  if (document.visibilityState === "visible") pollApprovals();
});

translatePage();
start();
