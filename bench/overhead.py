"""Server overhead: the same greedy 256-token generation run

  (a) straight through llama-cpp-python's high-level ``Llama.generate``, and
  (b) through a ``turbospark serve`` subprocess over HTTP streaming,

alternated over several rounds on the same GGUF, threads and context. Prints
decode tok/s of each and the ratio server / direct (target >= 1.0).

Decode rate is measured from the first generated token to the last on both
sides (prefill excluded), at the client for (b): it includes the HTTP, SSE and
JSON work a real client pays for. The engine's own figure from the
``generated`` event is printed beside it.

    python bench/overhead.py [--rounds 5] [--tokens 256] [--model smollm2-135m]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

PROMPT = "Write a long story about a lighthouse keeper and a storm."


def direct_run(llm, prompt_tokens: list[int], n: int) -> float:
    llm.reset()
    t_first = None
    count = 0
    for _tok in llm.generate(prompt_tokens, temp=0.0, top_k=1, reset=True):
        count += 1
        if count == 1:
            t_first = time.perf_counter()
        if count >= n:
            break
    return (count - 1) / (time.perf_counter() - t_first)


def server_run(url: str, n: int) -> tuple[float, int]:
    body = {
        "model": "m", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": n,
        "temperature": 0, "stream": True, "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    t_first = t_last = None
    usage = None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as r:
        rid = int(r.headers["x-request-id"])
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                now = time.perf_counter()
                t_first = t_first or now
                t_last = now
    assert usage and usage["completion_tokens"] == n, usage
    # content chunks: first token's text .. last token's text = n - 1 decode steps
    return (n - 1) / (t_last - t_first), rid


def start_server(model: str, threads: int, ctx: int, event_log: str | None, extra: list[str]) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "turbospark.cli", "serve", "--model", model, "--port", "0",
           "--threads", str(threads), "--ctx", str(ctx), *extra]
    if event_log:
        cmd += ["--event-log", event_log]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            return proc, m.group(1)
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise SystemExit("the server did not start")


def engine_rates(event_log: str) -> dict[int, float]:
    out = {}
    with open(event_log) as f:
        for line in f:
            e = json.loads(line)
            if e["kind"] == "generated" and e["decodeSeconds"] > 0:
                out[e["id"]] = e["newTokens"] / e["decodeSeconds"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--server-args", default="", help="extra `turbospark serve` flags")
    args = ap.parse_args()

    from llama_cpp import Llama

    from turbospark.catalog import resolve_model

    path, _ = resolve_model(args.model)
    llm = Llama(path, n_ctx=args.ctx, n_threads=args.threads, n_threads_batch=args.threads, verbose=False)
    # the same prompt tokens the server will build from its chat template
    from turbospark.engine.template import ChatTemplate

    md = llm.metadata
    tmpl = ChatTemplate(md.get("tokenizer.chat_template"))
    text = tmpl.render([{"role": "user", "content": PROMPT}])
    prompt_tokens = llm.tokenize(text.encode(), add_bos=False, special=True)

    log = tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False).name
    proc, url = start_server(path, args.threads, args.ctx, log, args.server_args.split())
    try:
        direct_run(llm, prompt_tokens, 16)  # warm both
        server_run(url, 16)
        d_rates, s_rates, ids = [], [], []
        for i in range(args.rounds):
            d = direct_run(llm, prompt_tokens, args.tokens)
            s, rid = server_run(url, args.tokens)
            d_rates.append(d)
            s_rates.append(s)
            ids.append(rid)
            print(f"round {i + 1}: direct {d:7.1f} tok/s   server {s:7.1f} tok/s   ratio {s / d:5.2f}")
    finally:
        proc.terminate()
        proc.wait(30)
    time.sleep(0.2)
    eng = engine_rates(log)
    os.unlink(log)
    d_med, s_med = statistics.median(d_rates), statistics.median(s_rates)
    e_med = statistics.median(eng[i] for i in ids if i in eng) if eng else float("nan")
    print()
    print(f"{'path':<34}{'decode tok/s (median)':>24}")
    print(f"{'llama-cpp-python Llama.generate':<34}{d_med:>24.1f}")
    print(f"{'turbospark over HTTP (client)':<34}{s_med:>24.1f}")
    print(f"{'turbospark engine (generated ev.)':<34}{e_med:>24.1f}")
    print(f"\nratio server / direct = {s_med / d_med:.2f}   (target >= 1.00)")


if __name__ == "__main__":
    main()
