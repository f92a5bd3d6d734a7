// One message in the chat log. A user's: its text (as text) and images. An
// answer: its Markdown (sanitized), reasoning folded, tool calls, and a line
// with the engine's numbers, a link to the request in Activity and actions;
// several answers at once (n) with arrows between them. The numbers of an
// answer read back are those the conversation keeps with it (``timings``).
import { el } from "./dom.js";
import { render } from "./markdown.js";
import { imagesOf, textOf } from "./thread.js";

export function userMessage(item, actions) {
  const images = imagesOf(item).map((src) => (String(src).startsWith("data:image/")
    ? el("img", { class: "attached", src, alt: "attached image" }) : el("span", { class: "dim", text: "[image]" })));
  const meta = el("div", { class: "meta" }, ...actions);
  return el("div", { class: "msg user" }, el("div", { class: "body", text: textOf(item) }), ...images, meta);
}

const blank = () => ({ text: "", reasoning: "", calls: [], end: null, timings: null });

const num = (x) => (Number.isFinite(Number(x)) ? Number(x) : 0);

/** The numbers kept with an answer, as numbers (an item holds what was posted: anything), or null. */
function keptTimings(t) {
  if (!t || typeof t !== "object") return null;
  const out = {};
  for (const k of ["cache_n", "prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "queue_ms"]) out[k] = num(t[k]);
  out.request_id = Number.isInteger(t.request_id) ? t.request_id : null;
  out.stop_reason = typeof t.stop_reason === "string" ? t.stop_reason : null;
  return out;
}

/** A request's record (/v1/stats) from the engine's numbers a conversation keeps with an answer. */
export function fromTimings(t) {
  return { generations: 1, newTokens: t.predicted_n, promptTokens: t.cache_n + t.prompt_n, reusedTokens: t.cache_n,
           decodeTokPerSec: t.predicted_ms > 0 ? t.predicted_n / (t.predicted_ms / 1000) : null,
           queuedMs: t.queue_ms ?? 0, prefillMs: t.prompt_ms, stopReason: t.stop_reason ?? null };
}

/** The engine's numbers of a request's record, as a conversation keeps them with an answer. */
export function toTimings(rec, requestId) {
  if (!rec || !(rec.generations > 0)) return null;
  return { cache_n: rec.reusedTokens, prompt_n: rec.promptTokens - rec.reusedTokens, prompt_ms: rec.prefillMs,
           predicted_n: rec.newTokens, predicted_ms: rec.decodeMs, queue_ms: rec.queuedMs ?? 0,
           request_id: requestId, stop_reason: rec.stopReason };
}

export class Answer {
  constructor() {
    this.alts = [blank()];
    this.shown = 0;
    this.requestId = null;
    this.rec = null;
    this.reasoningBox = el("details", { class: "reasoning", hidden: true }, el("summary", { text: "Reasoning" }), el("pre"));
    this.callsBox = el("div", { class: "calls" });
    this.body = el("div", { class: "body" });
    this.arrows = el("span", { class: "arrows", hidden: true });
    this.stats = el("span", { class: "stats" });
    this.actions = el("span", { class: "actions" });
    this.node = el("div", { class: "msg assistant", "aria-label": "Answer" }, this.reasoningBox, this.callsBox, this.body,
      el("div", { class: "meta" }, this.arrows, this.stats, this.actions));
    this._frame = null;
  }

  static fromItems(items) {
    const a = new Answer(), alt = a.alts[0];
    for (const item of items) {
      if (item.type === "message") alt.text += (alt.text ? "\n\n" : "") + textOf(item);
      else if (item.type === "reasoning") alt.reasoning += (item.content || item.summary || []).map((p) => p.text || "").join("");
      else if (item.type === "function_call") alt.calls.push({ name: item.name, args: item.arguments || "" });
      else if (item.type === "function_call_output") alt.calls.push({ name: "→ output", args: String(item.output ?? "") });
    }
    if (items.some((i) => i.status === "incomplete")) alt.end = "incomplete";
    alt.timings = keptTimings([...items].reverse().find((i) => i.timings)?.timings);
    const objects = (i) => (Array.isArray(i.alternatives) ? i.alternatives.filter((x) => x && typeof x === "object") : []);
    const several = items.find((i) => objects(i).length > 1);
    if (several) {
      a.alts = objects(several).map((x) => ({ ...blank(), text: textOf(x), timings: keptTimings(x.timings),
                                              end: x.status === "incomplete" ? "incomplete" : null }));
      a.shown = Math.min(Math.max(0, Number(several.chosen) || 0), a.alts.length - 1);
      a.arrows.hidden = false;
    }
    a.draw();
    return a;
  }

  choices(n) { this.alts = Array.from({ length: n }, blank); this.arrows.hidden = n < 2; this.draw(); }
  alt(i) { return this.alts[i] || this.alts[0]; }
  text(delta, i = 0) { this.alt(i).text += delta; this.later(); }
  reasoning(delta, i = 0) { this.alt(i).reasoning += delta; this.later(); }
  call(name, i = 0) { this.alt(i).calls.push({ name, args: "" }); this.later(); }
  callArgs(delta, i = 0) { const c = this.alt(i).calls; if (c.length) c[c.length - 1].args += delta; this.later(); }
  end(reason, i = 0) { this.alt(i).end = reason; this.later(); }
  streaming(on) { this.node.classList.toggle("streaming", on); this.node.setAttribute("aria-busy", on ? "true" : "false"); }

  /** Re-render at most once a frame (a long answer is parsed again each time). */
  later() { if (this._frame === null) this._frame = requestAnimationFrame(() => { this._frame = null; this.draw(); }); }

  draw() {
    const log = this.node.parentElement;  // (kept at the bottom while it grows, if it was there)
    const bottom = log && log.scrollHeight - log.scrollTop - log.clientHeight < 60;
    this.paint();
    if (bottom) log.scrollTop = log.scrollHeight;
  }

  paint() {
    const a = this.alt(this.shown);
    this.reasoningBox.hidden = !a.reasoning;
    this.reasoningBox.lastChild.textContent = a.reasoning;
    this.callsBox.replaceChildren(...a.calls.map((c) => el("div", { class: "call" },
      el("b", { text: "tool call " + c.name }), el("pre", { text: c.args }))));
    this.body.replaceChildren(render(a.text));
    if (a.end === "stopped" || a.end === "incomplete" || a.end === "error")
      this.body.append(el("p", { class: a.end === "error" ? "error" : "stopped", text: a.endText || "(" + a.end + ")" }));
    if (this.alts.length > 1) {
      this.arrows.replaceChildren(
        el("button", { type: "button", "aria-label": "Previous answer", text: "‹", onclick: () => this.pick(this.shown - 1) }),
        el("span", { class: "which", text: `${this.shown + 1} / ${this.alts.length}` }),
        el("button", { type: "button", "aria-label": "Next answer", text: "›", onclick: () => this.pick(this.shown + 1) }));
    }
    this.drawStats();  // (an answer with no numbers shows none: not those of the one shown before)
  }

  pick(i) {
    if (i < 0 || i >= this.alts.length || i === this.shown) return;
    this.shown = i;
    this.draw();
    this.onpick?.(i);
  }

  fail(message, i = 0) { const a = this.alt(i); a.end = "error"; a.endText = message; this.draw(); }

  /** The engine's numbers for this request (its record in /v1/stats), and a link to it in Activity. */
  showStats(rec) {
    this.rec = rec;
    this.drawStats();
    this.node.dataset.stop = rec?.stopReason ?? "";
  }

  /** The numbers of the answer shown: those kept with it, else its request's record. */
  drawStats() {
    const t = this.alt(this.shown).timings, rec = t ? fromTimings(t) : this.rec;
    const id = t?.request_id ?? this.requestId, parts = [];
    if (rec && rec.generations > 0) {
      const ttft = (rec.queuedMs ?? 0) + rec.prefillMs;
      parts.push(`${rec.newTokens} tokens`, rec.decodeTokPerSec === null ? "" : `${rec.decodeTokPerSec.toFixed(1)} tok/s`,
        `first token ${ttft.toFixed(0)} ms`);
      if (rec.stopReason === "cancelled") parts.push("stopped: cancelled");
      this.stats.title = "from the engine: tokens generated, decode rate, time to first token (queue + prefill, "
        + "measured by the engine), prompt " + rec.promptTokens + " tokens of which " + rec.reusedTokens + " reused";
    }
    this.stats.replaceChildren(el("span", { text: parts.filter(Boolean).join(" · ") }),
      id ? el("span", { text: parts.length ? " · " : "" }) : "",
      id ? el("a", { href: "#/activity/" + id, text: "request " + id, title: "this request in Activity" }) : "");
  }
}
