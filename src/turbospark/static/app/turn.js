// One answer, streamed through the server's own API. One answer: the
// Responses API in the conversation (the server reads its items, appends the
// turn's, and keeps its KV warm in the conversation's session). Several
// (n > 1): Chat Completions with n, the same session (prompt_cache_key), each
// choice's engine numbers from its last chunk (llama.cpp's ``timings``).
import { api, ApiError } from "./api.js";
import { frames } from "./sse.js";

const ENDS = new Set(["response.completed", "response.incomplete", "response.failed", "response.cancelled"]);

function streamError(e) {
  const err = e.error || e;
  return new ApiError(500, (err && err.message) || "the stream failed");
}

/** A Responses turn; the response object it ended with (null: the stream stopped first). */
export async function respond(s, userItem, answer, signal) {
  const body = { model: s.model, input: [userItem], conversation: s.cid, stream: true,
                 temperature: s.temperature, max_output_tokens: s.maxTokens };
  if (s.system) body.instructions = s.system;
  const r = await api("/v1/responses", { method: "POST", body, signal, raw: true });
  answer.requestId = Number(r.headers.get("x-request-id")) || null;
  let final = null;
  for await (const f of frames(r)) {
    const e = JSON.parse(f.data);
    if (e.type === "response.output_text.delta") answer.text(e.delta);
    else if (e.type === "response.reasoning_text.delta") answer.reasoning(e.delta);
    else if (e.type === "response.output_item.added" && e.item?.type === "function_call") answer.call(e.item.name);
    else if (e.type === "response.function_call_arguments.delta") answer.callArgs(e.delta);
    else if (ENDS.has(e.type)) final = e.response;
    else if (e.type === "error" || f.event === "error") throw streamError(e);
  }
  if (final?.status === "failed") throw streamError(final);
  if (final?.status === "incomplete") answer.end("incomplete");
  return final;
}

/** Several answers at once; usage from the stream's last chunk. */
export async function choices(s, messages, answer, signal) {
  const body = { model: s.model, n: s.n, stream: true, stream_options: { include_usage: true }, timings: true,
                 temperature: s.temperature, max_tokens: s.maxTokens, prompt_cache_key: "conversation:" + s.cid,
                 messages: [...(s.system ? [{ role: "system", content: s.system }] : []), ...messages] };
  const r = await api("/v1/chat/completions", { method: "POST", body, signal, raw: true });
  answer.requestId = Number(r.headers.get("x-request-id")) || null;
  answer.choices(s.n);
  for await (const f of frames(r)) {
    if (f.data === "[DONE]") break;
    const c = JSON.parse(f.data);
    if (c.error) throw streamError(c);
    for (const ch of c.choices || []) {
      const d = ch.delta || {};
      if (d.reasoning_content) answer.reasoning(d.reasoning_content, ch.index);
      if (d.content) answer.text(d.content, ch.index);
      for (const tc of d.tool_calls || []) {
        if (tc.function?.name) answer.call(tc.function.name, ch.index);
        if (tc.function?.arguments) answer.callArgs(tc.function.arguments, ch.index);
      }
      if (ch.finish_reason === "length") answer.end("incomplete", ch.index);
      if (ch.finish_reason && c.timings) answer.alt(ch.index).timings = { ...c.timings };
    }
  }
}
