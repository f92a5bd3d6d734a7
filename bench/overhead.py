"""Server overhead: the same greedy 256-token generation run

  (a) straight through llama-cpp-python's high-level ``Llama.generate``, and
  (b) through a ``turbospark serve`` subprocess over HTTP streaming,

alternated over several rounds on the same GGUF, threads and context. Prints
decode tok/s of each and the ratio server / direct (target >= 1.0).

Decode rate is measured from the first generated token to the last on both
sides (prefill excluded), at the client for (b): it includes the HTTP, SSE and
JSON work a real client pays for. The engine's own figure from the
``generated`` event is printed beside it.

    python bench/overhead.py [--rounds 5] [--tokens 256] [--model smollm2-135m] [--all-sinks]

The server always runs its Prometheus sink and its /v1/events ring, and the
bench always passes ``--event-log``. ``--all-sinks`` adds the rest a busy
deployment pays for: OpenTelemetry spans exported over OTLP/HTTP (to a
throwaway collector on loopback; needs the ``otel`` extra), a client
following ``/v1/events`` live, and a Prometheus scrape of ``/metrics`` every
second. The target is then ratio >= 0.95.
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
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
from streams import stream_chat

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
    s = stream_chat(
        url,
        {
            "model": "m",
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": n,
            "temperature": 0,
            "ignore_eos": True,
        },
        timeout=300,
    )
    assert s.usage and s.usage["completion_tokens"] == n, s.usage
    assert s.request_id is not None
    return s.decode_rate(), s.request_id


def start_server(
    model: str, threads: int, ctx: int, event_log: str | None, extra: list[str]
) -> tuple[subprocess.Popen, str]:
    cmd = [
        sys.executable,
        "-m",
        "turbospark.cli",
        "serve",
        "--model",
        model,
        "--port",
        "0",
        "--threads",
        str(threads),
        "--ctx",
        str(ctx),
        *extra,
    ]
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


class Collector(BaseHTTPRequestHandler):
    """A do-nothing OTLP/HTTP collector: reads the export, answers 200."""

    exports = 0
    spans_bytes = 0

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        Collector.exports += 1
        Collector.spans_bytes += len(body)
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *a: object) -> None:
        pass


class Watchers:
    """The extra load of ``--all-sinks``: a /v1/events follower and a
    /metrics scraper, on threads, until stopped."""

    def __init__(self, url: str, scrape_every: float = 1.0) -> None:
        self.url = url
        self.scrape_every = scrape_every
        self.events = 0
        self.scrapes = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._follow, daemon=True),
            threading.Thread(target=self._scrape, daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _follow(self) -> None:
        try:
            with httpx.stream("GET", self.url + "/v1/events", timeout=None) as r:
                if r.status_code != 200:
                    self.errors.append(f"/v1/events answered {r.status_code}")
                    return
                for line in r.iter_lines():
                    if line.startswith("event: "):
                        self.events += 1
                    if self._stop.is_set():
                        return
        except httpx.HTTPError as exc:
            if not self._stop.is_set():
                self.errors.append(f"/v1/events: {exc!r}")

    def _scrape(self) -> None:
        while not self._stop.wait(self.scrape_every):
            try:
                r = httpx.get(self.url + "/metrics", timeout=10)
                r.raise_for_status()
                self.scrapes += 1
            except httpx.HTTPError as exc:
                self.errors.append(f"/metrics: {exc!r}")

    def stop(self) -> None:
        self._stop.set()
        self._threads[1].join(5)


def generation_tokens_counter(url: str) -> float:
    total = 0.0
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("turbospark_generation_tokens_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


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
    ap.add_argument(
        "--all-sinks",
        action="store_true",
        help="also export OTel spans, follow /v1/events and scrape /metrics during the run",
    )
    args = ap.parse_args()
    extra = args.server_args.split()
    collector = None
    if args.all_sinks:
        from importlib.util import find_spec

        if find_spec("opentelemetry.exporter.otlp.proto.http") is not None:
            collector = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
            threading.Thread(target=collector.serve_forever, daemon=True).start()
            extra += ["--otlp-endpoint", f"http://127.0.0.1:{collector.server_port}"]
        else:
            print("note: the otel extra is not installed; running without OpenTelemetry")

    from llama_cpp import Llama

    from turbospark.models.catalog import resolve_model

    path, _ = resolve_model(args.model)
    llm = Llama(path, n_ctx=args.ctx, n_threads=args.threads, n_threads_batch=args.threads, verbose=False)
    # the same prompt tokens the server will build from its chat template
    from turbospark.engine.template import ChatTemplate

    md = llm.metadata
    tmpl = ChatTemplate(md.get("tokenizer.chat_template"))
    text = tmpl.render([{"role": "user", "content": PROMPT}])
    prompt_tokens = llm.tokenize(text.encode(), add_bos=False, special=True)

    log = tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False).name
    proc, url = start_server(path, args.threads, args.ctx, log, extra)
    watchers = None
    try:
        direct_run(llm, prompt_tokens, 16)  # warm both
        server_run(url, 16)
        if args.all_sinks:
            watchers = Watchers(url)
        d_rates, s_rates, ids = [], [], []
        for i in range(args.rounds):
            d = direct_run(llm, prompt_tokens, args.tokens)
            s, rid = server_run(url, args.tokens)
            d_rates.append(d)
            s_rates.append(s)
            ids.append(rid)
            print(f"round {i + 1}: direct {d:7.1f} tok/s   server {s:7.1f} tok/s   ratio {s / d:5.2f}")
        if watchers is not None:
            watchers.stop()
            counted = generation_tokens_counter(url)
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
    target = 0.95 if args.all_sinks else 1.00
    print(f"\nratio server / direct = {s_med / d_med:.2f}   (target >= {target:.2f})")
    # each round's two runs are back to back, so their ratio shares the
    # machine's state; its median resists a burst of load on a shared box
    paired = statistics.median(s / d for s, d in zip(s_rates, d_rates))
    print(f"median of per-round ratios = {paired:.2f}")
    if watchers is not None:
        sinks = "JSONL event log, Prometheus, /v1/events ring" + (", OpenTelemetry" if collector else "")
        print(f"sinks: {sinks}")
        print(
            f"  /v1/events follower got {watchers.events} events; {watchers.scrapes} /metrics scrapes; "
            f"generation tokens counter {counted:.0f} (= {args.rounds} x {args.tokens} + 16 warm-up)"
        )
        if collector is not None:
            collector.shutdown()
            print(f"  OTLP collector got {Collector.exports} exports ({Collector.spans_bytes} bytes)")
        for err in watchers.errors:
            print(f"  error: {err}")


if __name__ == "__main__":
    main()
