// The page's three views, one at a time, chosen by the URL: #/chat[/CONVERSATION],
// #/models, #/activity[/REQUEST]; /dashboard opens on Activity. A view's modules
// load the first time it is shown.
import { $ } from "./dom.js";
import { askKey, getKey, setKey, takeKeyFromFragment } from "./key.js";

const VIEWS = {
  chat: () => import("./chat.js"),
  models: () => import("./models.js"),
  activity: () => import("./activity.js"),
};

export function route() {
  const m = /^#\/(chat|models|activity)(?:\/(.*))?$/.exec(location.hash);
  const view = m ? m[1] : location.pathname === "/dashboard" ? "activity" : "chat";
  return { view, arg: m && m[2] ? decodeURIComponent(m[2]) : null };
}

async function show() {
  const { view, arg } = route();
  for (const name of Object.keys(VIEWS)) $("view-" + name).hidden = name !== view;
  for (const a of document.querySelectorAll("nav a[data-view]")) {
    if (a.dataset.view === view) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  const mod = await VIEWS[view]();
  await mod.mount();
  if (mod.open) await mod.open(arg);
}

$("keyButton").addEventListener("click", async () => {
  const had = getKey();
  const key = await askKey(had ? "Replace the API key of this tab:" : "API key for this server:");
  if (key === null && had) return;
  setKey(key || "");
});
takeKeyFromFragment();
window.addEventListener("hashchange", show);
show();
