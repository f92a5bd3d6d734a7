// The Activity view's two canvas charts: decode rate per request by model,
// and where each request's time went. Only pixel positions are computed here.
import { fmt } from "./dom.js";

const COLORS = ["#58a6ff", "#3fb950", "#d29922", "#bc8cff", "#f85149", "#39c5cf", "#ff7b72"];
const PART = { queued: "#d29922", prefill: "#58a6ff", decode: "#3fb950", overhead: "#bc8cff" };

function setup(canvas) {
  const ratio = window.devicePixelRatio || 1, w = canvas.clientWidth || 600, h = canvas.clientHeight || 220;
  canvas.width = w * ratio; canvas.height = h * ratio;
  const g = canvas.getContext("2d");
  g.setTransform(ratio, 0, 0, ratio, 0, 0);
  g.clearRect(0, 0, w, h);
  g.font = "11px ui-monospace, monospace";
  return { g, w, h, l: 44, r: 8, t: 18, b: 18 };
}

function axes(c, ymax) {
  const { g, w, h, l, r, t, b } = c;
  g.strokeStyle = "#2a323c"; g.fillStyle = "#7b8794";
  g.beginPath(); g.moveTo(l, t); g.lineTo(l, h - b); g.lineTo(w - r, h - b); g.stroke();
  g.fillText(fmt(ymax, 0), 2, t + 4); g.fillText("0", l - 12, h - b);
}

export function drawRates(canvas, recs) {
  const c = setup(canvas), { g, w, h, l, r, t, b } = c;
  const pts = recs.filter((x) => x.decodeTokPerSec !== null);
  const ymax = Math.max(1, ...pts.map((x) => x.decodeTokPerSec)) * 1.1;
  axes(c, ymax);
  const name = (p) => p.model ?? p.served ?? "?";
  const models = [...new Set(pts.map(name))];
  const xs = (i) => l + (pts.length <= 1 ? (w - l - r) / 2 : (i * (w - l - r - 8)) / (pts.length - 1) + 4);
  const ys = (v) => h - b - (v / ymax) * (h - t - b);
  models.forEach((m, k) => {
    const col = COLORS[k % COLORS.length];
    g.strokeStyle = col; g.fillStyle = col; g.beginPath();
    let first = true;
    pts.forEach((p, i) => {
      if (name(p) !== m) return;
      if (first) g.moveTo(xs(i), ys(p.decodeTokPerSec)); else g.lineTo(xs(i), ys(p.decodeTokPerSec));
      first = false;
    });
    g.stroke();
    pts.forEach((p, i) => {
      if (name(p) !== m) return;
      g.beginPath(); g.arc(xs(i), ys(p.decodeTokPerSec), 3, 0, 2 * Math.PI); g.fill();
    });
    g.fillText(m, w - r - 150, t + 12 * k);
  });
  canvas.dataset.points = String(pts.length);
}

export function drawTimes(canvas, recs) {
  const c = setup(canvas), { g, w, h, l, r, t, b } = c;
  const bars = recs.filter((x) => x.kind !== null).slice(-40);
  const total = (x) => (x.queuedMs ?? 0) + x.prefillMs + x.decodeMs + (x.overheadMs ?? 0);
  const ymax = Math.max(1, ...bars.map(total)) * 1.1;
  axes(c, ymax);
  const slot = (w - l - r) / Math.max(bars.length, 1), bw = Math.max(2, slot * 0.7);
  bars.forEach((x, i) => {
    let y = h - b;
    for (const [part, v] of [["queued", x.queuedMs ?? 0], ["prefill", x.prefillMs], ["decode", x.decodeMs],
                             ["overhead", x.overheadMs ?? 0]]) {
      const hh = (v / ymax) * (h - t - b);
      g.fillStyle = PART[part]; g.fillRect(l + i * slot + (slot - bw) / 2, y - hh, bw, hh);
      y -= hh;
    }
  });
  Object.entries(PART).forEach(([n, col], k) => { g.fillStyle = col; g.fillText(n, w - r - 70, t + 12 * k); });
  canvas.dataset.points = String(bars.length);
}
