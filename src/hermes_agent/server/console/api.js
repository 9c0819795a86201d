// The service API, with the key the reader pasted (kept in sessionStorage: this tab only,
// gone when it closes), sent as "Authorization: Bearer <key>". With `auth: none` no key is
// needed and none is asked for.

import { lang } from "./i18n.js";

const KEY = "hermes-console-key";

export function getKey() {
  return sessionStorage.getItem(KEY) || "";
}

export function setKey(key) {
  sessionStorage.setItem(KEY, key.trim());
}

export function clearKey() {
  sessionStorage.removeItem(KEY);
}

export class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
  }
}

function headers(extra = {}) {
  // The service's error details and the runtime's messages in the console's language.
  const found = { "Accept-Language": lang === "zh" ? "zh-CN, zh;q=0.9" : "en", ...extra };
  const key = getKey();
  if (key) found.Authorization = `Bearer ${key}`;
  return found;
}

function detailOf(status, data) {
  if (data && typeof data === "object" && "detail" in data) {
    const detail = data.detail;
    if (Array.isArray(detail)) return detail.map((d) => `${(d.loc || []).join(".")}: ${d.msg}`).join("; ");
    return String(detail);
  }
  return typeof data === "string" && data ? data : `HTTP ${status}`;
}

async function check(response) {
  if (response.status === 401) {
    window.dispatchEvent(new CustomEvent("hermes:unauthorized"));
  }
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = text;
  }
  if (!response.ok) throw new ApiError(response.status, detailOf(response.status, data));
  return { status: response.status, data };
}

/** JSON in, JSON out; an ApiError (status, detail) for any answer that is not 2xx. */
export async function api(path, { method = "GET", body, signal } = {}) {
  const init = { method, headers: headers(), signal };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  return (await check(await fetch(path, init))).data;
}

/** The body of a text answer (a JSONL export). */
export async function text(path, { signal } = {}) {
  const response = await fetch(path, { headers: headers(), signal });
  if (!response.ok) await check(response);
  return response.text();
}

/**
 * Read a Server-Sent Events answer (fetch, so that the key goes in a header, which
 * EventSource cannot send). Calls onEvent(kind, data, id) per event; returns the last id seen.
 */
export async function stream(path, { method = "GET", body, signal, lastEventId, onEvent }) {
  // A URL that carries a stream token needs no key (and is not sent one).
  const accept = { Accept: "text/event-stream" };
  const init = { method, headers: path.includes("stream_token=") ? accept : headers(accept), signal };
  if (lastEventId) init.headers["Last-Event-ID"] = String(lastEventId);
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (!response.ok || !(response.headers.get("content-type") || "").startsWith("text/event-stream")) {
    await check(response);
    throw new ApiError(response.status, "the service did not answer with an event stream");
  }
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let last = lastEventId || 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const parsed = parseFrame(frame);
      if (parsed === null) continue;
      if (parsed.id) last = Number(parsed.id);
      onEvent(parsed.event, parsed.data, last);
    }
  }
  return last;
}

function parseFrame(frame) {
  let id = null;
  let event = "message";
  const data = [];
  for (const line of frame.split("\n")) {
    if (line === "" || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const name = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (name === "id") id = value;
    else if (name === "event") event = value;
    else if (name === "data") data.push(value);
  }
  if (!data.length) return null;
  let parsed;
  try {
    parsed = JSON.parse(data.join("\n"));
  } catch {
    parsed = data.join("\n");
  }
  return { id, event, data: parsed };
}

/**
 * A run's event stream: with a key, through a short-lived stream token that opens this run's
 * events only (POST /v1/runs/{id}/stream-token), asked for at each (re)connect; the key itself
 * never goes in a URL.
 */
async function eventsUrl(requestId, signal) {
  const run = `/v1/runs/${encodeURIComponent(requestId)}`;
  if (!getKey()) return `${run}/events`;
  const { token } = await api(`${run}/stream-token`, { method: "POST", signal });
  return `${run}/events?stream_token=${encodeURIComponent(token)}`;
}

const FINAL = new Set(["result", "run_stopped"]);

/**
 * Follow a run's events until it ends, reconnecting with Last-Event-ID when the stream drops
 * (the run goes on without us). Resolves when the run is over or `signal` aborts.
 */
export async function follow(requestId, { signal, onEvent, after = 0 }) {
  let last = after;
  let over = false;
  while (!over && !signal?.aborted) {
    try {
      last = await stream(await eventsUrl(requestId, signal), {
        signal,
        lastEventId: last,
        onEvent: (kind, data, id) => {
          if (FINAL.has(kind)) over = true;
          onEvent(kind, data, id);
        },
      });
      if (!over) over = true; // the stream ended cleanly: the run is over
    } catch (error) {
      if (signal?.aborted) return;
      if (error instanceof ApiError && error.status !== 503) throw error;
      await new Promise((resolve) => setTimeout(resolve, 1000));
    }
  }
}
