// The conversations list (GET /v1/conversations, this server's extension):
// the last used first (a turn, or an answer picked, moves one to the top),
// searched by title, paged; rename and delete in place.
import { api, banner } from "./api.js";
import { $, el } from "./dom.js";
import { remove, rename } from "./thread.js";

const PAGE = 30;
let last = null, current = null, onOpen = () => {}, onGone = () => {};

export function setup(open, gone) {
  onOpen = open; onGone = gone;
  let timer = null;
  $("c-search").addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(() => load().catch((e) => banner(e.message)), 250); });
  $("c-more").addEventListener("click", () => load(true).catch((e) => banner(e.message)));
}

export function setCurrent(cid) {
  current = cid;
  for (const li of $("c-list").children) li.classList.toggle("current", li.dataset.id === cid);
}

export async function load(more = false) {
  const search = $("c-search").value.trim();
  const q = "?limit=" + PAGE + (search ? "&search=" + encodeURIComponent(search) : "") +
            (more && last ? "&after=" + encodeURIComponent(last) : "");
  const page = await api("/v1/conversations" + q);
  const rows = page.data.filter((c) => !more || !$("c-list").querySelector(`li[data-id="${CSS.escape(c.id)}"]`)).map(row);
  if (more) $("c-list").append(...rows); else $("c-list").replaceChildren(...rows);
  last = page.last_id ?? last;
  $("c-more").hidden = !page.has_more;
  $("c-list").dataset.loaded = "1";
}

export const titleOf = (c) => c.metadata?.title || "Untitled " + new Date(c.created_at * 1000).toLocaleString();

export function prepend(c) { $("c-list").prepend(row(c)); setCurrent(c.id); }

/** Conversation ``cid`` was just used (an item added): to the top, as the server now lists it. */
export function used(cid) {
  const li = $("c-list").querySelector(`li[data-id="${CSS.escape(cid)}"]`);
  if (li && li !== $("c-list").firstElementChild) $("c-list").prepend(li);
}

/** A conversation gone (deleted by the chat): out of the list, and no longer the current one. */
export function drop(cid) {
  for (const li of [...$("c-list").children]) if (li.dataset.id === cid) li.remove();
  if (current === cid) setCurrent(null);
}

function row(c) {
  const title = titleOf(c);
  const open = el("button", { type: "button", class: "open", text: title, title, onclick: () => onOpen(c.id) });
  const li = el("li", { "data-id": c.id, class: c.id === current ? "current" : null }, open);
  const edit = el("button", { type: "button", class: "small", text: "✎", "aria-label": "Rename " + title,
    onclick: () => renaming(li, c, open) });
  const del = el("button", { type: "button", class: "small", text: "✕", "aria-label": "Delete " + title,
    onclick: () => deleting(li, c, del) });
  li.append(edit, del);
  return li;
}

function renaming(li, c, open) {
  const input = el("input", { value: titleOf(c), "aria-label": "New title", maxlength: 512 });
  const done = async (save) => {
    if (save && input.value.trim()) {
      try {
        c = await rename(c.id, { ...c.metadata, title: input.value.trim().slice(0, 512) });
        open.textContent = open.title = titleOf(c);
      } catch (e) { banner(e.message); }
    }
    input.replaceWith(open);
    open.focus();
  };
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter") { e.preventDefault(); done(true); }
    if (e.key === "Escape") { e.preventDefault(); e.stopPropagation(); done(false); }
  });
  open.replaceWith(input);
  input.focus(); input.select();
}

function deleting(li, c, button) {
  if (button.dataset.sure !== "1") {  // a second press within 4 s deletes (no dialog)
    button.dataset.sure = "1"; button.textContent = "Delete?";
    setTimeout(() => { button.dataset.sure = ""; button.textContent = "✕"; }, 4000);
    return;
  }
  remove(c.id).then(() => { li.remove(); if (c.id === current) onGone(); }, (e) => banner(e.message));
}
