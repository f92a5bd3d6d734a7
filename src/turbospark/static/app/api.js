// Every call to the server: the key sent as a header, a 401 asks for a key
// (and tries again), failures become messages a person can read.
import { askKey, authHeaders, getKey } from "./key.js";
import { $ } from "./dom.js";

export class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

/** The line at the top that says what is wrong with the connection (empty: nothing). */
export function banner(text, kind = "error") {
  const b = $("banner");
  b.textContent = text || "";
  b.className = text ? kind : "";
}

async function message(r) {
  try {
    const body = await r.json();
    const e = body.error;
    return (e && (e.message || (typeof e === "string" ? e : null))) || JSON.stringify(body);
  } catch { return "HTTP " + r.status; }
}

/** fetch() with the key; ``raw``: the Response (for streams), else the JSON body. */
export async function api(path, { method = "GET", body, signal, raw = false } = {}) {
  for (let tries = 0; ; tries++) {
    const headers = authHeaders();
    if (body !== undefined) headers["Content-Type"] = "application/json";
    let r;
    try {
      r = await fetch(path, { method, headers, signal, cache: "no-store",
                              body: body === undefined ? undefined : JSON.stringify(body) });
    } catch (e) {
      if (e.name === "AbortError") throw e;
      banner("The server cannot be reached (" + location.host + "): is it running?");
      throw new ApiError(0, "the server cannot be reached");
    }
    if ($("banner").className === "error" && r.status !== 401) banner("");
    if (r.status === 401 && tries < 3) {
      const why = getKey() ? "The server refused this key. Enter a valid API key:" : "This server needs an API key:";
      banner(getKey() ? "Wrong API key." : "An API key is needed.");
      if ((await askKey(why)) === null) throw new ApiError(401, "no valid API key");
      banner("");
      continue;
    }
    if (!r.ok) throw new ApiError(r.status, await message(r));
    if (raw) return r;
    const text = await r.text();
    return text ? JSON.parse(text) : null;
  }
}
