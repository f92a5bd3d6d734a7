// Pulls in the Models view: one this page starts streams its progress lines
// (POST /api/pull); others in flight are read from GET /v1/admin/pulls. A
// bar with the bytes, the rate and the time left; Cancel stops the pull.
import { api } from "./api.js";
import { $, el, size } from "./dom.js";
import { lines } from "./sse.js";

const rows = new Map();  // model -> its row's state

function draw(p) {
  const pct = p.total > 0 ? Math.min(100, Math.floor((p.completed * 100) / p.total)) : p.state === "finished" ? 100 : 0;
  const bar = el("progress", { max: p.total || 1, value: p.total ? Math.min(p.completed, p.total) : pct / 100,
                               "aria-label": "Pull of " + p.model });
  const eta = p.rate > 0 && p.total > p.completed ? Math.ceil((p.total - p.completed) / p.rate) + " s left" : "";
  const node = el("div", { class: "mpull " + p.state, "data-model": p.model },
    el("span", { class: "state", text: p.state }), el("b", { text: p.model }), bar,
    el("span", { class: "pct", text: pct + "%" }),
    el("span", { class: "bytes", text: size(p.completed) + (p.total ? " / " + size(p.total) : "") }),
    el("span", { class: "rate", text: p.rate > 0 ? size(p.rate) + "/s" : "" }), el("span", { class: "eta", text: eta }),
    p.state === "pulling" ? el("button", { type: "button", text: "Cancel", "aria-label": "Cancel the pull of " + p.model,
      onclick: () => cancel(p.model) }) : null,
    p.error ? el("span", { class: "reason", text: p.error }) : null);
  const old = $("m-pulls").querySelector(`.mpull[data-model="${CSS.escape(p.model)}"]`);
  if (old) old.replaceWith(node); else $("m-pulls").append(node);
}

async function cancel(model) {
  try { await api("/v1/admin/pulls/" + encodeURIComponent(model), { method: "DELETE" }); }
  catch (e) { $("m-note").textContent = e.message; }
}

/** Pull ``model`` and follow it; ``done()`` once it ended (pulled or not). */
export async function pull(model, done) {
  const p = { model, state: "pulling", completed: 0, total: 0, rate: 0, error: null, own: true };
  const files = new Map();  // digest -> [completed, total]
  let last = { t: performance.now(), bytes: 0 };
  rows.set(model, p);
  draw(p);
  try {
    const r = await api("/api/pull", { method: "POST", body: { model, stream: true }, raw: true });
    for await (const line of lines(r)) {
      if (line.error) { p.error = line.error; p.state = /cancel/i.test(line.error) ? "cancelled" : "failed"; break; }
      if (line.digest) files.set(line.digest, [line.completed || 0, line.total || 0]);
      p.completed = [...files.values()].reduce((a, f) => a + f[0], 0);
      p.total = [...files.values()].reduce((a, f) => a + f[1], 0);
      const now = performance.now();
      if (now - last.t >= 250) {  // bytes a second, smoothed
        const rate = ((p.completed - last.bytes) * 1000) / (now - last.t);
        p.rate = p.rate ? 0.7 * p.rate + 0.3 * rate : rate;
        last = { t: now, bytes: p.completed };
      }
      if (line.status === "success") { p.state = "finished"; p.completed = p.total; }
      draw(p);
    }
  } catch (e) { p.error = e.message; p.state = "failed"; }
  if (p.state === "pulling") p.state = "failed";
  draw(p);
  done();
}

/** A pull this page did not start, as the server's modelPull events tell it. */
export function fromEvent(e) {
  if (rows.get(e.model)?.own) return;
  const was = rows.get(e.model);
  const state = { started: "pulling", progress: "pulling", finished: "finished" }[e.phase]
    || (/cancel/i.test(e.reason || "") ? "cancelled" : "failed");
  const dt = was ? (e.atMs - was.atMs) / 1000 : 0;
  const rate = dt > 0 ? (e.fetched - was.fetched) / dt : was?.rate ?? 0;
  const p = { model: e.model, state, completed: e.completed, total: e.total, fetched: e.fetched, atMs: e.atMs,
              rate: state === "pulling" ? rate : 0, error: e.reason || null };
  rows.set(e.model, p);
  draw(p);
}

/** Pulls in flight when the view opens (GET /v1/admin/pulls). */
export async function inFlight() {
  for (const x of (await api("/v1/admin/pulls")).data) {
    if (rows.has(x.model) || !["listing", "waiting", "pulling", "verifying", "writing"].includes(x.state)) continue;
    const p = { ...x, state: "pulling", atMs: Date.now(), fetched: x.fetched };
    rows.set(x.model, p);
    draw(p);
  }
}
