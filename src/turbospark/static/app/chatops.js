// What the chat does with a conversation on the server: send (and stream)
// a message, stop it, regenerate the last answer, pick one of several, and
// edit an earlier message into a new branch.
import { $, randomId } from "./dom.js";
import { api, ApiError, banner } from "./api.js";
import * as list from "./convlist.js";
import { Answer, toTimings } from "./answer.js";
import { restoreImage } from "./picker.js";
import { record } from "./stats.js";
import { append, copyable, create, imagesOf, remove, removeItems, textOf, toMessages } from "./thread.js";
import { choices, respond } from "./turn.js";

let ui = null;  // chat.js: its state and drawing
export function bind(parts) { ui = parts; }

function busy(run) {
  ui.state.busy = run;
  $("c-send").hidden = Boolean(run);
  $("c-stop").hidden = !run;
  ui.drawActions();
}

export function stop() {
  const run = ui.state.busy;
  if (!run) return;
  run.stopped = true;
  run.controller.abort();
}

/** The conversation to write to (made on the first message, titled by it: ``run.made``). */
async function target(text, run) {
  if (ui.state.cid) return ui.state.cid;
  const title = (text.trim() || "Image").replace(/\s+/g, " ").slice(0, 60);
  const made = await create({ title });
  run.made = made.id;
  ui.state.cid = made.id;
  ui.setTitle(title);
  list.prepend(made);
  history.replaceState(null, "", "#/chat/" + made.id);
  return made.id;
}

export async function send(s, text, images) {
  const prev = ui.state.entries[ui.state.entries.length - 1];
  if (prev?.saving) await prev.saving;  // (a pick of the last answer still being kept: this turn follows it)
  const run = { controller: new AbortController(), stopped: false };
  busy(run);
  try {
    s = { ...s, cid: await target(text, run) };
    const userItem = { type: "message", role: "user", id: randomId("msg_"),
      content: [{ type: "input_text", text }, ...images.map((url) => ({ type: "input_image", image_url: url }))] };
    const before = ui.state.entries.slice();
    const user = { role: "user", items: [userItem] }, said = { role: "assistant", items: [], answer: new Answer() };
    ui.state.entries.push(user, said);
    const n = ui.state.entries.length;
    $("c-log").append(ui.entryNode(user, n - 2), ui.entryNode(said, n - 1));
    ui.toBottom();
    await turn(s, run, userItem, before, said);
  } catch (e) {
    banner(e.message);
  } finally {
    busy(null);
  }
}

async function turn(s, run, userItem, before, said) {
  const answer = said.answer;
  let final = null;
  answer.streaming(true);
  try {
    if (s.n > 1) await choices(s, toMessages([...before, { role: "user", items: [userItem] }]), answer, run.controller.signal);
    else final = await respond(s, userItem, answer, run.controller.signal);
  } catch (e) {
    answer.streaming(false);
    if (e instanceof ApiError && e.status >= 400 && e.status < 500) return await unsent(userItem, e, run.made);
    if (e.name !== "AbortError") answer.fail(e.message);
  }
  answer.streaming(false);
  if (run.stopped)  // (every answer the stop cut, not only the one shown)
    answer.alts.forEach((a, i) => { if (!a.end && (i === answer.shown || !a.timings)) answer.end("stopped", i); });
  const rec = answer.requestId ? await record(answer.requestId) : null;
  for (const a of answer.alts.length > 1 ? answer.alts : [])  // (each choice's own; the queue is the request's)
    if (a.timings) Object.assign(a.timings, { queue_ms: rec?.queuedMs ?? 0, request_id: answer.requestId });
  // the server keeps a turn that ended; a stopped one, or several answers, are kept here
  said.items = final && !run.stopped ? final.output : await keep(s.cid, userItem, answer, rec);
  if (s.n > 1) answer.onpick = (i) => choose(s.cid, said, i);
  list.used(s.cid);
  if (answer.requestId) answer.showStats(rec);
}

/** A message the server refused (a 4xx): out of the log, back in the composer (its image too);
 *  the conversation made for it (``made``), which holds nothing, is gone again. */
async function unsent(userItem, e, made) {
  ui.state.entries.splice(-2);
  ui.showAll();
  $("c-input").value = textOf(userItem);
  for (const url of imagesOf(userItem)) restoreImage(url);
  if (made) {
    try {
      await remove(made);
      list.drop(made);
      if (ui.state.cid === made) {  // (not one the person opened meanwhile)
        ui.state.cid = null;
        ui.setTitle("");
        history.replaceState(null, "", "#/chat");
      }
    } catch { /* (kept, then: it is in the list) */ }
  }
  banner("Not sent: " + e.message);  // (after the calls above: a call that works clears the banner)
}

async function keep(cid, userItem, answer, rec) {
  // (the server may have kept the turn just before the stop reached it)
  const tail = await api("/v1/conversations/" + encodeURIComponent(cid) + "/items?order=desc&limit=20");
  const at = tail.data.findIndex((i) => i.id === userItem.id);
  if (at >= 0) return tail.data.slice(0, at).reverse();
  if (answer.alts.length > 1) {  // (stopped before any text: the question alone, as for one answer)
    const said = answer.alts.some((a) => a.text) ? [chosen(answer.alts.map(kept), answer.shown)] : [];
    return (await append(cid, [userItem, ...said])).slice(1);
  }
  const a = kept(answer.alt(answer.shown));
  const timings = toTimings(rec, answer.requestId);
  const reply = textOf(a) ? [{ type: "message", role: "assistant", ...a, ...(timings ? { timings } : {}) }] : [];
  return (await append(cid, [userItem, ...reply])).slice(1);
}

/** One answer as a conversation keeps it (its text, whether it ended, the engine's numbers). */
function kept(a) {
  return { status: a.end ? "incomplete" : "completed", content: [{ type: "output_text", text: a.text }],
           ...(a.timings ? { timings: a.timings } : {}) };
}

/** Several answers as one item: the picked one's, with all of them (``alternatives``) and which (``chosen``). */
function chosen(alternatives, i) {
  return { type: "message", role: "assistant", ...alternatives[i], alternatives, chosen: i };
}

/** Another of several answers picked (the last answer only): kept as the conversation's, now or after a reload. */
export function choose(cid, said, i) {
  said.saving = pick(cid, said, i).catch((e) => banner(e.message));
}

async function pick(cid, said, i) {
  const last = () => !ui.state.busy && ui.state.entries[ui.state.entries.length - 1] === said;
  if (!last()) return;
  await said.saving;
  if (!last()) return;  // (a new turn began while the pick before this one was saved)
  const all = said.items.find((x) => Array.isArray(x.alternatives))?.alternatives || said.answer.alts.map(kept);
  await removeItems(cid, said.items);
  said.items = await append(cid, [chosen(all, i)]);
  list.used(cid);
}

export async function regenerate(s) {
  const entries = ui.state.entries;
  if (ui.state.busy || entries.length < 2) return;
  const [user, said] = entries.slice(-2);
  if (user.role !== "user" || said.role !== "assistant") return;
  await said.saving;  // (another of several answers being kept)
  try {
    await removeItems(s.cid, [...user.items, ...said.items]);
  } catch (e) { banner(e.message); return; }
  entries.splice(-2);
  ui.showAll();
  await send(s, textOf(user.items[0]), imagesOf(user.items[0]));
}

/** Edit message ``i``: a new conversation with what came before it, continued from the edit. */
export async function branch(s, i, text) {
  const entries = ui.state.entries;
  const items = entries.slice(0, i).flatMap((e) => e.items).map(copyable);
  try {
    const made = await create({ title: (ui.state.title || "Chat").slice(0, 500) + " (edit)", branch_of: s.cid }, items);
    list.prepend(made);
    await ui.openConversation(made.id);
    await send({ ...s, cid: made.id }, text, imagesOf(entries[i].items[0]));
  } catch (e) { banner(e.message); }
}
