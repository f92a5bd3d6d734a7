// The Activity view (the dashboard): the server's fold (GET /v1/stats: the
// same numbers as the console and the report), re-read when GET /v1/events
// says something happened. Nothing is computed here but pixel positions.
import { $, el, fmt, sleep } from "./dom.js";
import { askKey, authHeaders } from "./key.js";
import { frames } from "./sse.js";
import { drawRates, drawTimes } from "./charts.js";
import { renderPulls, shown } from "./pullrows.js";

const VIEW_PATHS = new Set(["/v1/events", "/v1/stats", "/dashboard"]);
const isView = (path) => VIEW_PATHS.has(path) || String(path).startsWith("/app/");
let seq = null;            // last event sequence number seen (for ?since=)
let summary = null;        // the server's fold, as last read
let selected = null;       // id of the request in the details pane
const hidden = new Set();  // ids of the views' own requests: never a reason to re-read
const pending = new Set(); // request ids reported since the last read
let pendingOther = false, timer = null, mounted = false;

function setState(s) {
  if ($("pause").checked && s !== "paused") return;
  const e = $("state"); e.textContent = s; e.className = s;
}

async function readStats() {
  const r = await fetch("/v1/stats?requests=200", { headers: authHeaders(), cache: "no-store" });
  const rid = r.headers.get("x-request-id");
  if (rid) hidden.add(Number(rid));
  if (r.status === 401) { await askKey("The Activity view needs an API key:"); throw new Error("unauthorized"); }
  if (!r.ok) throw new Error("HTTP " + r.status);
  return r.json();
}

async function refresh(force) {
  timer = null;
  // re-read only for other clients' requests (the view's own /v1/stats reads
  // report events too: following them would loop)
  const needed = force || pendingOther || [...pending].some((id) => !hidden.has(id));
  pending.clear(); pendingOther = false;
  if (!needed || $("pause").checked) return;
  try {
    summary = await readStats();
    if (seq === null) seq = summary.seq;
    render();
  } catch (e) { $("note").textContent = "stats: " + e.message; }
}
function schedule() { if (timer === null) timer = setTimeout(refresh, 150); }

function onFrame(f) {
  if (f.id !== null) seq = Number(f.id);
  const e = JSON.parse(f.data);
  if (f.event === "requestStarted" && isView(e.path)) { hidden.add(e.id); return; }
  if (e.id !== undefined && f.event !== "gap") pending.add(e.id); else pendingOther = true;
  schedule();
}

async function stream() {
  for (;;) {
    try {
      setState(seq === null ? "connecting" : "reconnecting");
      const r = await fetch("/v1/events?since=" + (seq ?? 0), { headers: authHeaders(), cache: "no-store" });
      if (r.status === 401) { await askKey("The Activity view needs an API key:"); await sleep(1000); continue; }
      if (!r.ok || !r.body) throw new Error("HTTP " + r.status);
      setState("live");
      for await (const f of frames(r)) onFrame(f);
    } catch (e) { $("note").textContent = "events: " + e.message; }
    setState("reconnecting");
    await sleep(1000);
  }
}

function visible(recs) {
  const errorsOnly = $("errorsOnly").checked, model = $("model").value;
  return recs.filter((r) => (!errorsOnly || (r.status !== null && r.status >= 400)) &&
                            (!model || r.served === model || r.model === model));
}

function renderHeader(s) {
  $("address").textContent = location.host;
  // a model whose last health report was not ok, in red with its state; the reason in its tooltip
  const states = s.modelStates || {};
  $("models").replaceChildren(...(s.models.length ? s.models.flatMap((m, i) => {
    const st = states[m], span = el("span", { text: st ? m + " " + st.state : m });
    if (st) { span.className = "s5 unwell"; span.title = st.reason; }
    return i ? [", ", span] : [span];
  }) : ["–"]));
  $("requests").textContent = s.requests;
  $("inflight").textContent = s.inFlight;
  $("errors").textContent = s.errors;
  $("rate").textContent = fmt(s.decodeTokPerSec);
  for (const k of ["prefill", "queue", "overhead"]) $(k).textContent = fmt(s[k + "Ms"].p50) + " / " + fmt(s[k + "Ms"].p95);
  $("reuse").textContent = s.prefixReuseRatio === null ? "–" : (100 * s.prefixReuseRatio).toFixed(1) + "%";
  $("evictions").textContent = s.evictions;
  $("mediaBox").hidden = !s.mediaItems;
  $("media").textContent = s.mediaItems + " (" + s.mediaTokens + " tok, " + s.mediaEncoded + " encoded)";
  $("rerankBox").hidden = !s.reranks;
  $("reranks").textContent = s.reranks + " (" + s.rerankPairs + " pairs, " + fmt(s.rerankPairsPerSec) + " pairs/s)";
  $("gaps").textContent = s.droppedEvents;
  const sel = $("model"), names = [...new Set([...s.models, ...Object.keys(s.perModel)])];
  for (const n of names) if (![...sel.options].some((o) => o.value === n)) sel.add(new Option(n, n));
}

export function render() {
  const s = summary;
  if (!s) return;
  renderHeader(s);
  renderPulls(s.pulls || [], () => renderPulls((summary && summary.pulls) || [], null));
  const recs = visible(s.records);
  renderTable(recs);
  drawRates($("rateChart"), recs);
  drawTimes($("timeChart"), recs);
  const rec = s.records.find((r) => r.id === selected);
  // (a request without media: no media lines; one that did not rerank: no rerank lines)
  const reranked = rec && rec.kind === "rerank";
  const round = (k, v) => (k.startsWith("media") && rec && !rec.mediaItems ? undefined
                           : ["kind", "pairs", "pairsPerSec"].includes(k) && !reranked ? undefined
                           : typeof v === "number" && !Number.isInteger(v) ? Math.round(v * 100) / 100 : v);
  // a Responses API request: its response and where it sits in its chain first
  if (rec) $("details").textContent = (rec.chainText ? rec.responseId + ": " + rec.chainText + "\n" : "") +
                                      JSON.stringify(rec, round, 2);
  else if (selected !== null) $("details").textContent = "request " + selected + " is not among the last 200";
}

function cells(r) {
  // a rerank: its pairs' tokens, its pairs in "new", its compute as its prefill
  const gen = r.generations > 0, ranked = r.kind === "rerank", td = (text, cls) => el("td", { class: cls, text: String(text) });
  const served = r.served === null ? "–" : (r.requested ?? "(none)") + " → " + r.served;
  return [td(r.id), td((r.status === null ? r.state : String(r.status)) + (r.state === "streaming" ? "…" : ""),
                       r.status === null ? "srun" : "s" + String(r.status)[0]),
    td(r.method ?? "?", "l"), td(r.path ?? "?", "l"), td(served, "l"),
    td(r.stream === null ? "–" : r.stream ? "yes" : "no", "l"),
    td(gen || ranked ? r.promptTokens : "–"), td(gen ? r.newTokens : ranked ? r.pairs + " pairs" : "–"),
    td(r.mediaItems ? r.mediaItems + " · " + r.mediaTokens + " tok" : "–", "media"),
    td(r.mediaItems ? r.mediaEncoded + " · " + fmt(r.mediaEncodeMs) + " ms" : "–", "encoded"),
    td(gen || ranked ? fmt(r.prefillMs) : "–"), td(gen ? fmt(r.decodeMs) : "–"), td(fmt(r.queuedMs)), td(fmt(r.overheadMs)),
    td(fmt(r.decodeTokPerSec)), td(gen ? r.reusedTokens : "–"), td(gen && r.prefixMissAt != null ? r.prefixMissAt : "–"),
    td(gen ? (r.evicted ? "yes" : "no") : "–", "l"), td(r.turn == null ? "–" : r.turn + (r.chainStartSeen ? "" : "+"), "turn")];
}

function renderTable(recs) {
  $("rows").replaceChildren(...recs.slice().reverse().map((r) => {
    const tr = el("tr", { "data-id": r.id, class: r.id === selected ? "sel" : null, title: r.chainText,
                          tabindex: 0, onclick: () => select(r.id) }, ...cells(r));
    tr.addEventListener("keydown", (e) => { if (e.key === "Enter") select(r.id); });
    return tr;
  }));
}

/** Show one request's details (a chat answer links here). */
export function select(id) {
  selected = Number(id);
  render();
  document.querySelector(`#rows tr[data-id="${selected}"]`)?.scrollIntoView({ block: "nearest" });
}

/** ``#/activity/ID``: that request's details. */
export function open(id) { if (id) select(id); }

export async function mount() {
  if (mounted) return;
  mounted = true;
  for (const id of ["errorsOnly", "model"]) $(id).addEventListener("change", render);
  $("pause").addEventListener("change", () => {
    if ($("pause").checked) setState("paused"); else { setState("live"); refresh(true); }
  });
  window.addEventListener("resize", () => { if (!$("view-activity").hidden) render(); });
  $("address").textContent = location.host;
  for (let tries = 0; summary === null && tries < 30; tries++) {
    await refresh(true);
    if (summary === null) await sleep(1000);
  }
  stream();
}

// for the tests (and a curious person's console): how long ended pulls stay
window.turbospark = { ...(window.turbospark || {}), activity: { shown, render, select } };
