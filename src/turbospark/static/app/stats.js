// A request's record in the server's fold (/v1/stats): its engine numbers,
// once its events say it is over.
import { api } from "./api.js";
import { sleep } from "./dom.js";

export async function record(id, tries = 40) {
  for (let i = 0; i < tries; i++) {
    try {
      const s = await api("/v1/stats?requests=100");
      const rec = s.records.find((r) => r.id === id);
      if (rec && rec.state === "done") return rec;
    } catch { /* shown by the banner */ }
    await sleep(150);
  }
  return null;
}
