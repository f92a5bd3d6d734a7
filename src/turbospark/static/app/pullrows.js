// The Activity view's pull rows: pulls in progress with a bar, one that
// ended for a while after this page saw it end.
import { $, el, size } from "./dom.js";

export const shown = { endedMs: 30000 };  // how long an ended pull stays (from when this page saw it end)
const endedSeen = new Map();  // "model@atMs" of a pull that ended -> when this page first showed it
let timer = null;

function row(p) {
  const bar = el("progress");
  // whole percent, rounded down (100 only once it all came); no size told: an
  // indeterminate bar (full once finished)
  const pct = p.total > 0 ? Math.min(100, Math.floor((p.completed * 100) / p.total)) : p.state === "finished" ? 100 : null;
  if (p.total > 0) { bar.setAttribute("max", String(p.total)); bar.setAttribute("value", String(Math.min(p.completed, p.total))); }
  else if (pct === 100) { bar.setAttribute("max", "1"); bar.setAttribute("value", "1"); }
  const label = { pulling: "pulling", finished: "pulled", failed: "failed" }[p.state] || p.state;
  const took = p.state === "finished" && p.seconds != null ? " in " + p.seconds.toFixed(1) + " s" : "";
  const r = el("div", { class: "pull " + p.state, "data-model": p.model },
    el("span", { class: "state", text: label }), el("b", { class: "model", text: p.model }), bar,
    el("span", { class: "pct", text: (pct === null ? "–" : pct) + "%" }),
    el("span", { class: "sizes", text: size(p.completed) + (p.total ? " / " + size(p.total) : "") + took }),
    el("span", { class: "rate", text: p.bytesPerSec == null ? "" : size(p.bytesPerSec) + "/s" }));
  if (p.state === "failed") r.append(el("span", { class: "reason", text: p.reason || "failed" }));
  return r;
}

export function renderPulls(pulls, again) {
  const now = Date.now(), keep = new Set();
  let next = null;
  const visible = pulls.filter((p) => {
    if (p.state === "pulling") return true;
    const k = p.model + "@" + p.atMs;
    keep.add(k);
    if (!endedSeen.has(k)) endedSeen.set(k, now);
    const gone = endedSeen.get(k) + shown.endedMs;
    if (gone <= now) return false;
    next = next === null ? gone : Math.min(next, gone);
    return true;
  });
  for (const k of [...endedSeen.keys()]) if (!keep.has(k)) endedSeen.delete(k);
  clearTimeout(timer);
  if (next !== null) timer = setTimeout(again, next - now + 10);
  const box = $("pulls");
  box.hidden = visible.length === 0;
  box.replaceChildren(...visible.map(row));
}
