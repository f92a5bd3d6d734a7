// Small DOM helpers shared by the views. Text is always set as text, never as HTML.
export const $ = (id) => document.getElementById(id);

/** An element: attrs ("class", "text", "on<event>", others as attributes), then children. */
export function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  e.append(...children.filter((c) => c !== null && c !== undefined && c !== false));
  return e;
}

export function size(n) {
  if (n === null || n === undefined) return "–";
  for (const [unit, scale] of [["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]])
    if (Math.abs(n) >= scale) return (n / scale).toFixed(1) + " " + unit;
  return Math.round(n) + " B";
}

export function fmt(v, digits = 1) { return v === null || v === undefined ? "–" : Number(v).toFixed(digits); }

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** A short random id (for items the page names itself). */
export function randomId(prefix) {
  const bytes = crypto.getRandomValues(new Uint8Array(12));
  return prefix + [...bytes].map((b) => b.toString(16).padStart(2, "0")).join("");
}
