// The API key: kept for this tab only (sessionStorage), never in a URL, and
// asked for in a dialog when the server answers 401.
import { $ } from "./dom.js";

const STORE = "turbospark-key";
let asking = null;

export function getKey() { return sessionStorage.getItem(STORE) || ""; }

export function setKey(key) {
  if (key) sessionStorage.setItem(STORE, key); else sessionStorage.removeItem(STORE);
  window.dispatchEvent(new Event("turbospark-key"));
}

export function authHeaders() {
  const key = getKey();
  return key ? { Authorization: "Bearer " + key } : {};
}

/** An older link's "#key=..." (the dashboard's): taken into the tab's storage, and out of the URL. */
export function takeKeyFromFragment() {
  const m = /(?:^#|&)key=([^&]*)/.exec(location.hash);
  if (!m) return;
  setKey(decodeURIComponent(m[1]));
  const rest = location.hash.replace(/(^#|&)key=[^&]*/, "$1").replace(/^#&/, "#");
  history.replaceState(null, "", location.pathname + location.search + (rest === "#" ? "" : rest));
}

/** Ask for a key (one dialog at a time); resolves to it, or null if the person cancelled. */
export function askKey(message) {
  if (asking) return asking;
  const dialog = $("keyDialog"), input = $("keyInput");
  $("keyMessage").textContent = message;
  input.value = "";
  asking = new Promise((resolve) => {
    const done = (value) => {
      dialog.close();
      $("keyOk").onclick = $("keyCancel").onclick = input.onkeydown = null;
      asking = null;
      if (value) setKey(value);
      resolve(value || null);
    };
    $("keyOk").onclick = () => done(input.value.trim());
    $("keyCancel").onclick = () => done(null);
    input.onkeydown = (e) => { if (e.key === "Enter") { e.preventDefault(); done(input.value.trim()); } };
    dialog.onclose = () => { if (asking) done(null); };
    dialog.showModal();
    input.focus();
  });
  return asking;
}
