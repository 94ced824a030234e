// The chat page of `mlxspec serve`: streams replies from /v1/chat/completions, renders them as
// markdown (markdown.js: DOM nodes only, never innerHTML) with accepted draft tokens in green, and
// sends only the settings the user set (an empty field leaves the server's default in force).
"use strict";
const $ = (id) => document.getElementById(id);
let messages = [];
let controller = null;  // the running request's AbortController (Stop aborts it; the server cancels)

fetch("/health").then(r => r.json()).then(h => { $("model").textContent = h.model; $("model").title = h.model; })
  .catch(() => {});
$("key").value = localStorage.getItem("mlxspec-key") || "";
$("key").addEventListener("change", () => localStorage.setItem("mlxspec-key", $("key").value));
$("reset").addEventListener("click", () => { if (controller) controller.abort(); messages = []; $("log").replaceChildren(); });
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("form").requestSubmit(); }
});
$("form").addEventListener("submit", (e) => { e.preventDefault(); send(); });
$("stop").addEventListener("click", () => { if (controller) controller.abort(); });

function bubble(cls, text) {
  const div = document.createElement("div");
  div.className = "msg " + cls;
  if (text) div.textContent = text;
  $("log").appendChild(div);
  return div;
}

function statsLine(s) {
  const parts = [`${s.generated_tokens} tokens`, `${s.generation_tps.toFixed(1)} tok/s`];
  if (s.drafted) {
    parts.push(`acceptance ${(100 * s.acceptance_rate).toFixed(1)}% (${s.accepted}/${s.drafted})`);
    parts.push(`${s.tokens_per_pass.toFixed(2)} tok/pass`);
  }
  parts.push(s.num_draft_tokens === 0 ? "draft off" : `k=${s.num_draft_tokens}`);
  if (s.fallback) parts.push("fell back to plain decoding");
  parts.push(`prompt ${s.prompt_tokens_processed}/${s.prompt_tokens} tok processed`);
  return "[" + parts.join(", ") + "]";
}

// The request's settings: only the fields the user filled in.
function settings() {
  const req = {};
  const num = (id) => $(id).value.trim() === "" ? null : Number($(id).value);
  const max = num("max_tokens"), temp = num("temperature"), seed = num("seed");
  if (max !== null && max > 0) req.max_tokens = Math.floor(max);
  if (temp !== null && temp >= 0) req.temperature = temp;
  if (seed !== null && Number.isInteger(seed) && seed >= 0) req.seed = seed;
  if (!$("drafting").checked) req.num_draft_tokens = 0;
  return req;
}

function setBusy(on) {
  $("send").hidden = on;
  $("stop").hidden = !on;
}

async function send() {
  const text = $("prompt").value;
  if (controller || !text.trim()) return;
  controller = new AbortController();
  setBusy(true);
  $("prompt").value = "";
  messages.push({role: "user", content: text});
  bubble("user", text);
  const reply = bubble("assistant");
  const body = document.createElement("div");
  body.className = "body";
  body.raw = "";
  const stats = document.createElement("div");
  stats.className = "stats";
  reply.append(body, stats);
  const pieces = [];  // [text, from_draft]
  let queued = false;
  const show = () => { queued = false; body.replaceChildren(MD.render(pieces)); };
  const req = {messages, stream: true, stream_options: {include_usage: true}, ...settings()};
  const headers = {"Content-Type": "application/json"};
  if ($("key").value) headers["Authorization"] = "Bearer " + $("key").value;
  try {
    const resp = await fetch("/v1/chat/completions", {method: "POST", headers, body: JSON.stringify(req),
                                                      signal: controller.signal});
    if (!resp.ok) {
      let msg = resp.statusText;
      try { msg = (await resp.json()).error.message; } catch (e) {}
      throw new Error(`${resp.status}: ${msg}`);
    }
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buf += decoder.decode(value, {stream: true});
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const line = buf.slice(0, cut).trim();
        buf = buf.slice(cut + 2);
        if (!line.startsWith("data: ") || line === "data: [DONE]") continue;  // keep-alive comments too
        const ev = JSON.parse(line.slice(6));
        if (ev.error) throw new Error(ev.error.message);
        const c = ev.choices && ev.choices[0];
        if (c && c.delta && c.delta.content) {
          pieces.push([c.delta.content, !!c.from_draft]);
          body.raw += c.delta.content;
          if (!queued) { queued = true; requestAnimationFrame(show); }
          window.scrollTo(0, document.body.scrollHeight);
        }
        if (ev.speculative) stats.textContent = statsLine(ev.speculative);
      }
    }
    show();
    messages.push({role: "assistant", content: body.raw});
  } catch (err) {
    show();
    if (err.name === "AbortError") {  // Stop: the reply so far stays in the conversation
      if (body.raw) messages.push({role: "assistant", content: body.raw}); else messages.pop();
      stats.textContent = "[stopped]";
      stats.classList.add("stopped");
    } else {
      messages.pop();
      stats.textContent = "[error: " + err.message + "]";
      stats.classList.add("error");
    }
  } finally {
    reply.dataset.done = "1";
    controller = null;
    setBusy(false);
  }
}
