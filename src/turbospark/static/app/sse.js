// Server-sent events and NDJSON lines read from a fetch() body.
async function* chunks(response) {
  const reader = response.body.getReader(), dec = new TextDecoder();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    yield dec.decode(value, { stream: true });
  }
}

/** One SSE frame's fields: { id, event, data } (data as text). */
export function parseFrame(frame) {
  let id = null, event = "message", data = "", seen = false;
  for (const line of frame.split("\n")) {
    if (!line || line.startsWith(":")) continue;
    const c = line.indexOf(":");
    const f = c < 0 ? line : line.slice(0, c);
    let v = c < 0 ? "" : line.slice(c + 1);
    if (v.startsWith(" ")) v = v.slice(1);
    if (f === "id") id = v;
    else if (f === "event") event = v;
    else if (f === "data") { data += (seen ? "\n" : "") + v; seen = true; }
  }
  return { id, event, data };
}

export async function* frames(response) {
  let buf = "";
  for await (const text of chunks(response)) {
    buf += text.replace(/\r\n?/g, "\n");
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const frame = parseFrame(buf.slice(0, i));
      buf = buf.slice(i + 2);
      if (frame.data) yield frame;
    }
  }
}

export async function* lines(response) {
  let buf = "";
  for await (const text of chunks(response)) {
    buf += text;
    let i;
    while ((i = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, i).trim();
      buf = buf.slice(i + 1);
      if (line) yield JSON.parse(line);
    }
  }
  if (buf.trim()) yield JSON.parse(buf);
}
