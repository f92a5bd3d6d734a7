// The Models view: the store and the loaded set (GET /api/tags, /v1/models,
// /api/ps), load and unload (Ollama's empty generate), and for an admin
// (an admin key, or no keys on loopback): pull, cancel, delete, the config
// file's presets and its reload.
import { api, banner } from "./api.js";
import { $, el, size } from "./dom.js";
import { authHeaders } from "./key.js";
import { fromEvent, inFlight, pull } from "./mpulls.js";
import { frames } from "./sse.js";

let mounted = false, admin = false;

function source(name, m) {
  if (m?.upstream) return "remote";  // (another server runs it: /v1/models names its upstream)
  if (/^https?:/.test(name)) return "URL";
  if (name.includes("/")) return "Hugging Face";
  return name.includes(":") ? "Ollama" : "local";
}

async function isAdmin() {  // (asked quietly: no key prompt for a refusal here)
  try { return (await fetch("/v1/admin/pulls", { headers: authHeaders(), cache: "no-store" })).ok; } catch { return false; }
}

function actions(name, m, loaded) {
  const act = (text, label, fn) => el("button", { type: "button", text, "aria-label": label + " " + name, onclick: () => run(fn) });
  const out = [];
  if (m?.upstream) return out;  // (a remote model: nothing here to load, unload or delete)
  if (m && !loaded) out.push(act("Load", "Load", () => api("/api/generate", { method: "POST", body: { model: name, stream: false } })));
  if (loaded) out.push(act("Unload", "Unload", () => api("/api/generate", { method: "POST", body: { model: name, keep_alive: 0, stream: false } })));
  if (admin && source(name) !== "local") out.push(act("Delete", "Delete", () => api("/api/delete", { method: "DELETE", body: { model: name } })));
  return out;
}

async function run(fn) {
  try { await fn(); } catch (e) { $("m-note").textContent = e.message; }
  await refresh();
}

export async function refresh() {
  const [tags, v1, ps] = await Promise.all([api("/api/tags"), api("/v1/models"), api("/api/ps")]);
  const served = new Map(v1.data.map((m) => [m.id, m])), resident = new Map(ps.models.map((m) => [m.name, m]));
  const names = [...new Set([...v1.data.map((m) => m.id), ...tags.models.map((t) => t.name)])];
  const tag = new Map(tags.models.map((t) => [t.name, t]));
  $("m-rows").replaceChildren(...names.map((name) => {
    const m = served.get(name), remote = Boolean(m?.upstream);
    const t = remote ? null : tag.get(name), r = remote ? null : resident.get(name);  // (no file, nothing resident)
    const loaded = m?.state === "loaded" || r?.state === "loaded";
    const caps = m ? Object.entries(m.capabilities || {}).filter(([, on]) => on).map(([k]) => k).join(", ") : "";
    const td = (text, cls) => el("td", { class: cls, text: text ?? "–" });
    return el("tr", { "data-model": name }, td(name, "l"), td(source(name, m), "l"), td(t?.details?.quantization_level, "l"),
      td(t ? size(t.size) : null), td(m?.context_length ?? r?.context_length), td(r ? size(r.size) : null),
      el("td", { class: "l" }, el("span", { class: "caps", text: caps })), td(loaded ? "loaded" : m?.state ?? "in store", "l"),
      el("td", { class: "l" }, ...actions(name, m || t, loaded)));
  }));
}

/** What the last reload did, in a line: ``added``, ``removed`` and ``reloaded`` are lists of
 *  ids, ``failed`` maps an id to why it could not be loaded. */
export function lastReload(last) {
  if (!last) return "not reloaded since the start";
  const parts = [`last reload (${last.trigger}, ${new Date(last.at * 1000).toLocaleString()}): ` +
    (last.ok ? "ok" : "failed: " + last.error)];
  for (const k of ["added", "removed", "reloaded"]) if (last[k]?.length) parts.push(`${k}: ${last[k].join(", ")}`);
  for (const [id, why] of Object.entries(last.failed || {})) parts.push(`${id} failed to load: ${why}`);
  if (last.restart_needed?.length) parts.push(`[server] ${last.restart_needed.join(", ")} changed: applies at a restart`);
  return parts.join("; ");
}

async function config() {
  let c;
  try { c = await api("/v1/admin/config"); } catch (e) { $("m-config-text").textContent = e.message; return; }
  const lines = [`loaded at ${new Date(c.loaded_at * 1000).toLocaleString()}` + (c.watch ? " (watched)" : ""),
    lastReload(c.last_reload), "", "presets:", ...c.models.map((m) => `  ${m.id} (${m.state}): ${JSON.stringify(m.preset)}`)];
  $("m-config-text").textContent = lines.join("\n");
}

/** The server's model events (attached, detached, pulls) keep the view current, and the config
 *  file's (a reload made elsewhere, by SIGHUP, a watch or another client, attaches and detaches). */
async function follow() {
  let timer = null;
  const later = () => {
    clearTimeout(timer);
    timer = setTimeout(() => { refresh().catch(() => {}); if (admin) config(); }, 200);
  };
  for (;;) {
    try {
      const r = await fetch("/v1/events", { headers: authHeaders(), cache: "no-store" });
      if (!r.ok) throw new Error("HTTP " + r.status);
      for await (const f of frames(r)) {
        if (f.event === "modelPull") { const e = JSON.parse(f.data); fromEvent(e); if (e.phase === "finished") later(); }
        else if (f.event === "modelAttached" || f.event === "modelDetached") later();
      }
    } catch { /* the banner says when the server is gone */ }
    await new Promise((r) => setTimeout(r, 2000));
  }
}

/** Whether this tab's key administers: the admin parts shown or hidden. */
async function access() {
  admin = await isAdmin();
  for (const n of document.querySelectorAll("#view-models .admin")) n.hidden = !admin;
}

export async function mount() {
  if (mounted) return refresh().catch((e) => banner(e.message));
  mounted = true;
  await access();
  const start = () => {
    const name = $("m-name").value.trim();
    if (name) { $("m-name").value = ""; pull(name, () => refresh().catch(() => {})); }
  };
  $("m-pull").addEventListener("click", start);
  $("m-name").addEventListener("keydown", (e) => { if (e.key === "Enter") start(); });
  $("m-reload").addEventListener("click", async () => {
    $("m-note").textContent = "";  // (an earlier refusal's message is no longer true)
    try { await api("/v1/admin/config/reload", { method: "POST" }); } catch (e) { $("m-note").textContent = e.message; }
    await config(); await refresh();
  });
  window.addEventListener("turbospark-key", async () => {  // (another key: admin or not, again)
    await access();
    await refresh().catch(() => {});
    if (admin) { config(); inFlight().catch(() => {}); }
  });
  await refresh().catch((e) => banner(e.message));
  if (admin) { config(); inFlight().catch(() => {}); }
  follow();
}
