// The Chat view: a conversation kept on the server, its messages, the
// composer (Enter sends, Shift+Enter new line, Esc stops).
import { $, el } from "./dom.js";
import { banner } from "./api.js";
import * as list from "./convlist.js";
import { Answer, userMessage } from "./answer.js";
import { clearImage, loadModels, pendingImage, setupImages } from "./picker.js";
import { conversation, entriesOf, loadItems } from "./thread.js";
import * as ops from "./chatops.js";

export const state = { cid: null, title: "", entries: [], busy: null };
let mounted = false;

function settings() {
  const num = (id, dflt) => { const v = Number($(id).value); return Number.isFinite(v) && $(id).value !== "" ? v : dflt; };
  return { cid: state.cid, model: $("c-model").value, system: $("c-system").value.trim(),
           temperature: num("c-temp", 0.7), maxTokens: Math.max(1, Math.round(num("c-max", 512))),
           n: Math.min(8, Math.max(1, Math.round(num("c-n", 1)))) };
}

/** A message's node for the log (user: Edit; the last answer: Regenerate). */
export function entryNode(entry, i) {
  if (entry.role === "user") {
    entry.node = userMessage(entry.items[0], [el("button", { type: "button", text: "Edit",
      "aria-label": "Edit this message and continue from it (a new branch)", onclick: () => editing(i) })]);
  } else {
    entry.answer = entry.answer || Answer.fromItems(entry.items);
    if (entry.answer.alts.length > 1 && !entry.answer.onpick) entry.answer.onpick = (k) => ops.choose(state.cid, entry, k);
    entry.node = entry.answer.node;
  }
  return entry.node;
}

export function drawActions() {
  state.entries.forEach((e, i) => {
    if (e.role !== "assistant") return;
    const last = i === state.entries.length - 1 && !state.busy;
    e.answer.actions.replaceChildren(...(last ? [el("button", { type: "button", text: "Regenerate",
      "aria-label": "Regenerate the last answer", onclick: () => ops.regenerate(settings()) })] : []));
  });
}

export function showAll() {
  const fragment = document.createDocumentFragment();
  state.entries.forEach((e, i) => fragment.append(entryNode(e, i)));
  $("c-log").replaceChildren(fragment);
  drawActions();
  toBottom();
}

/** The log at its end (for a few frames more while the messages scrolled past, laid out
 *  at an estimated height until shown, take their real one). */
export function toBottom(frames = 30, height = -1, still = 0) {
  const log = $("c-log");
  log.scrollTop = log.scrollHeight;
  still = log.scrollHeight === height ? still + 1 : 0;
  if (frames > 0 && still < 3) requestAnimationFrame(() => toBottom(frames - 1, log.scrollHeight, still));
}

export function setTitle(title) { state.title = title; $("c-title").textContent = title; }

export async function openConversation(cid) {
  if (state.busy) ops.stop();
  const [conv, items] = await Promise.all([conversation(cid), loadItems(cid)]);
  state.cid = cid;
  setTitle(list.titleOf(conv));
  state.entries = entriesOf(items);
  showAll();
  list.setCurrent(cid);
  if (location.hash !== "#/chat/" + cid) history.replaceState(null, "", "#/chat/" + encodeURIComponent(cid));
  $("c-side").classList.remove("open");
}

function newChat() {
  if (state.busy) ops.stop();
  Object.assign(state, { cid: null, entries: [] });
  setTitle("");
  $("c-log").replaceChildren();
  list.setCurrent(null);
  history.replaceState(null, "", "#/chat");
  $("c-input").focus();
}

function editing(i) {
  const entry = state.entries[i];
  if (state.busy || !entry) return;
  const box = el("textarea", { class: "edit", rows: 3, "aria-label": "Edited message" });
  box.value = entry.node.querySelector(".body").textContent;
  const cancel = () => showAll();
  const go = () => ops.branch(settings(), i, box.value);
  box.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); go(); }
    if (e.key === "Escape") { e.preventDefault(); e.stopPropagation(); cancel(); }
  });
  entry.node.replaceChildren(box, el("div", { class: "meta" },
    el("button", { type: "button", text: "Send as a new branch", onclick: go }),
    el("button", { type: "button", text: "Cancel", onclick: cancel })));
  box.focus();
}

function composer() {
  const input = $("c-input");
  const send = () => {
    if (state.busy || (!input.value.trim() && !pendingImage())) return;
    const text = input.value, image = pendingImage();
    input.value = ""; clearImage();
    ops.send(settings(), text, image ? [image] : []);
  };
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
  });
  $("c-send").addEventListener("click", send);
  $("c-stop").addEventListener("click", () => ops.stop());
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && state.busy && !$("view-chat").hidden) { e.preventDefault(); ops.stop(); }
  });
  $("c-toggle").addEventListener("click", () => {
    const open = $("c-side").classList.toggle("open");
    $("c-toggle").setAttribute("aria-expanded", String(open));
  });
}

async function reload() {
  try { await Promise.all([loadModels(), list.load()]); } catch (e) { banner(e.message); }
}

export async function mount() {
  if (mounted) return;
  mounted = true;
  ops.bind({ state, showAll, drawActions, entryNode, setTitle, openConversation, toBottom });
  list.setup((cid) => openConversation(cid).catch((e) => banner(e.message)), newChat);
  $("c-new").addEventListener("click", newChat);
  setupImages();
  composer();
  window.addEventListener("turbospark-key", reload);
  await reload();
}

export async function open(cid) {
  if (cid && cid !== state.cid) await openConversation(cid).catch((e) => banner(e.message));
  $("c-input").focus();
}

window.turbospark = { ...(window.turbospark || {}), chat: { state } };
