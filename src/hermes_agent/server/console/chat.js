// Chat: pick a session, send a message, watch the answer and the calls stream in (SSE over
// fetch); approvals asked on the way are answered in place. A thinking model's thoughts go to
// their own box, never into the answer.

import { t } from "./i18n.js";
import { api, stream } from "./api.js";
import { alertBox, append, badge, field, fmtTime, h, pretty, replace, resultBadge, resultText, shortId, statusClass } from "./dom.js";
import { approvalCard } from "./approvals.js";
import { markdown } from "./markdown.js";

function newSessionId() {
  const random = crypto.getRandomValues(new Uint32Array(2));
  return `chat-${[...random].map((n) => n.toString(36)).join("")}`;
}

export async function renderChat(main, sessionId, signal) {
  const picker = h("select", { name: "session" });
  const fresh = h("button", { type: "button", "data-action": "new-session" }, t("New session"));
  const transcript = h("div", { class: "transcript", role: "log", "aria-label": "conversation", "aria-live": "polite", tabindex: "0" });
  const message = h("textarea", { name: "message", rows: "3", placeholder: "Ask the agent… (Enter sends, Shift+Enter for a new line)", "data-search": "" });
  const send = h("button", { type: "submit", class: "primary", disabled: true }, t("Send"));
  const stop = h("button", { type: "button", class: "danger", hidden: true }, t("Stop"));
  const problem = h("div");
  const form = h("form", { class: "composer" }, field(t("Message"), message), h("div", { class: "buttons" }, send, stop));
  let current = sessionId || "";

  append(
    main,
    h("div", { class: "title-row" }, h("h1", { tabindex: "-1" }, t("Chat")),
      h("div", { class: "session-picker" }, field(t("Session"), picker), fresh)),
    problem,
    transcript,
    form,
  );

  fresh.addEventListener("click", () => {
    location.hash = `#/chat/${encodeURIComponent(newSessionId())}`;
  });
  picker.addEventListener("change", () => {
    location.hash = picker.value ? `#/chat/${encodeURIComponent(picker.value)}` : "#/chat";
  });
  message.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      form.requestSubmit();
    }
  });

  let loaded = false; // the session's messages are on screen (sending waits for them)
  let controller = null;
  let running = null;
  stop.addEventListener("click", async () => {
    if (running) {
      try {
        await api(`/v1/runs/${encodeURIComponent(running)}/cancel`, { method: "POST" });
      } catch (error) {
        replace(problem, alertBox(`Could not stop the run: ${error.message}`));
      }
    }
  });

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const text = message.value.trim();
    if (!text || controller || !loaded) return;
    if (!current) {
      // A first message without a session starts one; the address names it from now on.
      current = newSessionId();
      history.replaceState(null, "", `#/chat/${encodeURIComponent(current)}`);
    }
    follow(current);
    const session = current;
    transcript.querySelector(".empty")?.remove();
    transcript.appendChild(h("div", { class: "msg user" }, h("div", { class: "who" }, "you"), h("div", { class: "body" }, text)));
    const turn = assistantTurn(signal);
    transcript.appendChild(turn.element);
    message.value = "";
    send.disabled = true;
    stop.hidden = false;
    replace(problem);
    controller = new AbortController();
    signal.addEventListener("abort", () => controller?.abort());
    try {
      await stream("/v1/runs", {
        method: "POST",
        body: { message: text, session_id: session, stream: true },
        signal: controller.signal,
        onEvent: (kind, data) => {
          if (kind === "input") running = data.request_id;
          turn.add(kind, data);
          transcript.scrollTop = transcript.scrollHeight;
        },
      });
    } catch (error) {
      if (!controller.signal.aborted) turn.fail(error.message);
    } finally {
      controller = null;
      running = null;
      send.disabled = false;
      stop.hidden = true;
      message.focus();
    }
  });

  // The picker shows the session the chat is in, also one that the first message started.
  function follow(id) {
    let option = [...picker.options].find((o) => o.value === id);
    if (!option) {
      option = h("option", { value: id }, `${id} (new)`);
      picker.options.length ? picker.options[0].after(option) : picker.appendChild(option);
    }
    picker.value = id;
  }

  // Loaded after every handler is in place: the form works while the session loads.
  try {
    const { sessions } = await api("/v1/sessions", { signal });
    const ids = sessions.map((s) => s.id);
    if (current && !ids.includes(current)) ids.unshift(current);
    replace(
      picker,
      h("option", { value: "" }, "— pick a session —"),
      ids.map((id) => {
        const row = sessions.find((s) => s.id === id);
        const label = row ? `${id} · ${row.turns} turns · ${fmtTime(Date.parse(row.updated) / 1000)}` : `${id} (new)`;
        return h("option", { value: id, selected: id === current }, label);
      }),
    );
  } catch (error) {
    if (!signal.aborted) replace(problem, alertBox(`Could not load sessions: ${error.message}`));
  }

  if (current) {
    try {
      const shown = await api(`/v1/sessions/${encodeURIComponent(current)}`, { signal });
      for (const item of shown.messages) transcript.appendChild(storedMessage(item));
    } catch (error) {
      if (error.status !== 404 && !signal.aborted) replace(problem, alertBox(`Could not load the session: ${error.message}`));
    }
    if (!transcript.children.length) transcript.appendChild(h("p", { class: "muted empty" }, `Session ${current} is new: say something.`));
  } else {
    transcript.appendChild(h("p", { class: "muted empty" }, "Pick a session, or just send a message to start a new one."));
  }
  transcript.scrollTop = transcript.scrollHeight;
  loaded = true;
  send.disabled = false;
}

function storedMessage(item) {
  if (item.role === "tool") {
    return h("div", { class: "msg tool" }, h("div", { class: "who" }, "tools"),
      h("details", {}, h("summary", {}, `${item.tool_results?.length || 0} tool results`),
        (item.tool_results || []).map((r) => h("pre", { class: "code" }, `${r.name} (${r.status_code}): ${resultText(r.content)}`))));
  }
  const calls = (item.tool_calls || []).map((c) => h("div", { class: "call-chip" }, h("code", {}, c.name), " ", h("span", { class: "mono small" }, JSON.stringify(c.arguments))));
  return h("div", { class: `msg ${item.role === "user" ? "user" : "assistant"}` },
    h("div", { class: "who" }, item.role === "user" ? "you" : item.role),
    h("div", { class: "body" }, item.role === "user" ? item.content : markdown(item.content)), calls);
}

function assistantTurn(signal) {
  const answer = h("div", { class: "body answer", dataset: { deltas: "0" } });
  const scratch = h("pre", { class: "code scratch" });
  const scratchBox = h("details", { class: "scratch-box", hidden: true }, h("summary", {}, t("Scratch pad")), scratch);
  const thoughts = h("div", { class: "thoughts" });
  const thoughtBox = h("details", { class: "thought-box", hidden: true }, h("summary", {}, t("Thought")), thoughts);
  const calls = h("div", { class: "calls" });
  const footer = h("div", { class: "turn-footer muted small" }, badge("streaming", "live"));
  const element = h("div", { class: "msg assistant", "aria-busy": "true" }, h("div", { class: "who" }, "agent"), thoughtBox, scratchBox, calls, answer, footer);
  const cards = [];
  let requestId = null;
  let thought = null; // the <pre> holding this model turn's thought, once one streams
  // Where this model turn's streamed text and calls begin: a revealed thought (a bare </think>)
  // voids what the turn streamed before it, and only that.
  let mark = { answer: 0, scratch: 0, cards: 0 };

  function stepThought() {
    if (!thought) {
      thought = h("pre", { class: "code thought", dataset: { turn: String(thoughts.querySelectorAll("pre").length) } });
      thoughts.appendChild(thought);
      thoughtBox.hidden = false;
    }
    return thought;
  }

  function nextStep() {
    thought = null;
    mark = { answer: answer.textContent.length, scratch: scratch.textContent.length, cards: cards.length };
  }

  function reveal(text) {
    // The text, scratch pad and calls streamed so far in this turn were the thought that the
    // chat template opened in the prompt: none of it is the answer, and its calls never ran.
    answer.textContent = answer.textContent.slice(0, mark.answer);
    scratch.textContent = scratch.textContent.slice(0, mark.scratch);
    scratchBox.hidden = !scratch.textContent;
    for (const card of cards.splice(mark.cards)) card.element.remove();
    const box = stepThought();
    box.textContent = text;
    box.dataset.revealed = "true";
    box.title = "the chat template opened this thought in the prompt: it first streamed as the answer";
  }

  function finish(...content) {
    element.removeAttribute("aria-busy");
    replace(footer, ...content);
  }

  function add(kind, data) {
    switch (kind) {
      case "input":
        requestId = data.request_id;
        break;
      case "text_delta":
        answer.textContent += data.text;
        answer.dataset.deltas = String(Number(answer.dataset.deltas) + 1);
        break;
      case "scratch_pad_delta":
        scratchBox.hidden = false;
        scratch.textContent += data.text;
        break;
      case "thought_delta":
        if (data.revealed) reveal(data.text);
        else stepThought().textContent += data.text;
        break;
      case "thought":
        // The parsed turn is the final word on its thought (stripped, as the trail keeps it),
        // with what the parser saw in it and did not run.
        if (data.thought) {
          const box = stepThought();
          box.textContent = data.thought;
          box.after(...(data.notes || []).map((note) => h("p", { class: "thought-note muted small", role: "note" }, note)));
        }
        nextStep();
        break;
      case "tool_call_parsed": {
        const status = h("span", { class: "call-status" }, badge("planned", "live"));
        const result = h("pre", { class: "code result", hidden: true });
        const card = h("div", { class: "call-chip", "data-tool": data.name ?? "" },
          h("code", {}, data.name ?? "(unparsed)"), " ", status, " ",
          h("span", { class: "mono small" }, data.error ? data.error : JSON.stringify(data.arguments)), result);
        cards.push({ name: data.name, status, result, element: card });
        calls.appendChild(card);
        break;
      }
      case "selection":
        for (const refused of data.rejected) {
          const card = cards.find((c) => c.name === refused.name && !c.done);
          if (card) {
            card.done = true;
            replace(card.status, badge(`refused ${refused.status}`, "warn"));
            card.result.hidden = false;
            card.result.textContent = refused.error ?? "";
          }
        }
        break;
      case "tool_results":
        for (const outcome of data.results) {
          const card = cards.find((c) => c.name === outcome.name && !c.done);
          if (!card) continue;
          card.done = true;
          replace(card.status, badge(String(outcome.status), statusClass(outcome.status), `status ${outcome.status}`));
          card.result.hidden = false;
          card.result.textContent = resultText(outcome.content);
        }
        // The text streamed so far was the model's words before its calls; the answer follows.
        if (answer.textContent.trim()) calls.appendChild(h("p", { class: "interim muted" }, answer.textContent));
        answer.textContent = "";
        nextStep();
        break;
      case "approval_required":
        calls.appendChild(approvalCard(data, { signal, followRun: false }));
        break;
      case "result":
        // Streamed as plain text; the whole answer is then drawn as Markdown (as nodes, never
        // parsed as HTML: see markdown.js).
        replace(answer, markdown(data.result.output));
        answer.dataset.markdown = "true";
        finish(
          resultBadge(data.result.status), ` ${data.result.usage.total_tokens} tokens · `,
          h("a", { href: `#/runs/${encodeURIComponent(data.result.request_id)}` }, `run ${shortId(data.result.request_id)}`),
        );
        break;
      case "run_stopped":
        finish(badge(data.status.replace("_", " "), "err"), ` ${data.error}`, requestId ? [" · ", h("a", { href: `#/runs/${encodeURIComponent(requestId)}` }, `run ${shortId(requestId)}`)] : "");
        break;
      default:
        break;
    }
  }

  function fail(message) {
    finish(alertBox(message));
  }

  return { element, add, fail };
}
