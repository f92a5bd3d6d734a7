// The chat's model picker: the models this server serves (GET /v1/models),
// loaded ones first and said to be loaded; images only where a model sees them.
import { api } from "./api.js";
import { $, el } from "./dom.js";

let models = new Map();
const SAVED = "turbospark-model";

export async function loadModels() {
  const list = (await api("/v1/models")).data.filter((m) => m.capabilities?.chat !== false);
  list.sort((a, b) => (b.state === "loaded") - (a.state === "loaded") || a.id.localeCompare(b.id));
  models = new Map(list.map((m) => [m.id, m]));
  const sel = $("c-model"), want = sel.value || sessionStorage.getItem(SAVED);
  sel.replaceChildren(...list.map((m) => el("option", { value: m.id,
    text: m.id + (m.state === "loaded" ? " (loaded)" : m.state ? " (" + m.state + ")" : "") })));
  if (want && models.has(want)) sel.value = want;
  capabilities();
}

export function capabilities() {
  const m = models.get($("c-model").value);
  sessionStorage.setItem(SAVED, $("c-model").value);
  $("c-attach").hidden = !(m && m.capabilities?.vision);
  if ($("c-attach").hidden) clearImage();
}

let image = null;  // the pending image (a data: URL)
let last = { url: null, name: "" };  // the last one attached: a refused message gives it back
export const pendingImage = () => image;
export function clearImage() { image = null; $("c-attached").textContent = ""; $("c-file").value = ""; }

function attach(url, name) {
  image = url;
  last = { url, name };
  $("c-attached").replaceChildren(el("span", { text: name + " " }),
    el("button", { type: "button", text: "✕", "aria-label": "Remove the image", onclick: clearImage }));
}

/** A message the server refused: its image pending again, as it was. */
export function restoreImage(url) { attach(url, url === last.url ? last.name : "image"); }

export function setupImages() {
  $("c-model").addEventListener("change", capabilities);
  $("c-attach").addEventListener("click", () => $("c-file").click());
  $("c-file").addEventListener("change", () => {
    const file = $("c-file").files[0];
    if (!file) return;
    const reader = new FileReader();
    reader.onload = () => attach(reader.result, file.name);
    reader.readAsDataURL(file);
  });
}
