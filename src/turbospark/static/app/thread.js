// A conversation on the server (the Conversations API) and its items as the
// chat shows them: a user message, then what the assistant said (reasoning,
// text, tool calls and their outputs) up to the next user message.
import { api } from "./api.js";

const base = (cid) => "/v1/conversations/" + encodeURIComponent(cid);

export async function loadItems(cid) {
  const all = [];
  for (let after = null; ;) {
    const page = await api(base(cid) + "/items?order=asc&limit=100" + (after ? "&after=" + encodeURIComponent(after) : ""));
    all.push(...page.data);
    if (!page.has_more) return all;
    after = page.last_id;
  }
}

export const conversation = (cid) => api(base(cid));

/** A new conversation holding ``items`` (more than 20 are added 20 at a time). */
export async function create(metadata, items = []) {
  const made = await api("/v1/conversations", { method: "POST", body: { metadata, items: items.slice(0, 20) } });
  await append(made.id, items.slice(20));
  return made;
}

/** ``items`` added at the end; the items as kept (with their ids). */
export async function append(cid, items) {
  const out = [];
  for (let i = 0; i < items.length; i += 20)
    out.push(...(await api(base(cid) + "/items", { method: "POST", body: { items: items.slice(i, i + 20) } })).data);
  return out;
}

export async function removeItems(cid, items) {
  for (const item of items) await api(base(cid) + "/items/" + encodeURIComponent(item.id), { method: "DELETE" });
}

export const rename = (cid, metadata) => api(base(cid), { method: "POST", body: { metadata } });
export const remove = (cid) => api(base(cid), { method: "DELETE" });

/** An item to copy into another conversation (it gets a new id there). */
export function copyable(item) {
  const { id: _id, status: _status, ...rest } = item;
  return rest;
}

export function entriesOf(items) {
  const out = [];
  for (const item of items) {
    if (item.type === "message" && (item.role === "system" || item.role === "developer")) continue;
    const user = item.type === "message" && item.role === "user";
    if (user || !out.length || out[out.length - 1].role === "user") out.push({ role: user ? "user" : "assistant", items: [] });
    out[out.length - 1].items.push(item);
  }
  return out;
}

// (an item is whatever was posted to the conversation: any part may be missing or of another type)
const parts = (item) => (typeof item?.content === "string" ? [{ type: "text", text: item.content }]
  : Array.isArray(item?.content) ? item.content.filter((p) => p && typeof p === "object") : []);
export const textOf = (item) => parts(item).filter((p) => typeof p.text === "string").map((p) => p.text).join("");
export const imagesOf = (item) =>
  parts(item).filter((p) => p.type === "input_image").map((p) => (typeof p.image_url === "string" ? p.image_url : p.image_url?.url));

/** The entries as Chat Completions messages (for several answers at once). */
export function toMessages(entries) {
  return entries.map((e) => {
    if (e.role === "user") {
      const item = e.items[0], images = imagesOf(item);
      if (!images.length) return { role: "user", content: textOf(item) };
      return { role: "user", content: [{ type: "text", text: textOf(item) },
        ...images.map((url) => ({ type: "image_url", image_url: { url } }))] };
    }
    return { role: "assistant", content: e.items.filter((i) => i.type === "message").map(textOf).join("\n") };
  });
}
