"""The front's cost over a remote engine, side by side in one run.

One turbospark upstream on loopback (SmolLM2, ``--parallel 4``) and a
turbospark front whose only model is a ``remote`` entry pointing at it. In
alternating rounds the same requests go straight to the upstream and through
the front:

- **short**: sequential streamed requests of 4 tokens; the median latency
  (request sent to its last byte) and time to the first token;
- **burst**: 8 streamed requests of 16 tokens at once; the burst's wall time;
- **long**: one 256-token stream; the client-side decode rate.

Printed: each figure both ways, and front / direct. Targets: the short
requests' median latency and the burst's wall time <= 1.15 x direct (the
front adds a hop, its routing and its events, on the same two cores), and the
decode rate >= 0.95 x direct. Both ends are measured on the same machine,
whose cores the front shares with the upstream: a front on its own machine
costs the upstream nothing.

    python bench/remote.py [--rounds 3] [--short 20] [--burst 8] [--tokens 256]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from runtime import free_port, wait_up
from streams import Streamed, stream_chat

QUESTIONS = ["Name a colour.", "Say hello.", "Count to three.", "Name a fruit.", "Name a planet."]
STORY = "Write a long story about a lighthouse keeper and a storm."


def start(args: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "turbospark.cli", "serve", "--port", str(port), *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_up(url, proc)
    return proc, url


def ask(url: str, question: str, tokens: int, ignore_eos: bool = True) -> Streamed:
    body = {"model": "m", "messages": [{"role": "user", "content": question}], "max_tokens": tokens,
            "temperature": 0, "ignore_eos": ignore_eos}  # fmt: skip
    return stream_chat(url, body)


def short(url: str, n: int) -> tuple[float, float]:
    """Median latency (sent .. last byte) and median time to first token, ms."""
    lat, ttft = [], []
    for i in range(n):
        sent = time.perf_counter()
        s = ask(url, QUESTIONS[i % len(QUESTIONS)], 4)
        lat.append(time.perf_counter() - sent)
        ttft.append(s.ttft)
    return statistics.median(lat) * 1e3, statistics.median(ttft) * 1e3


def burst(url: str, k: int) -> float:
    """Wall time (s) of ``k`` streamed requests of 16 tokens sent at once."""
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            ask(url, QUESTIONS[i % len(QUESTIONS)], 16)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(k)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"burst failed: {errors[0]!r}")
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--short", type=int, default=20, help="sequential short requests per round")
    ap.add_argument("--burst", type=int, default=8, help="requests sent at once per round")
    ap.add_argument("--tokens", type=int, default=256, help="the long stream's tokens")
    args = ap.parse_args()
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as folder:
        try:
            up, up_url = start(["--model", "smollm2-135m", "--parallel", "4", "--ctx", "2048"])
            procs.append(up)
            config = os.path.join(folder, "front.toml")
            with open(config, "w") as f:
                f.write(f'[models.m]\nkind = "remote"\nbase_url = "{up_url}/v1"\nmodel = "smollm2-135m"\nctx = 2048\n')
            front, front_url = start(["--config", config])
            procs.append(front)
            for url in (up_url, front_url):  # warm both paths (templates, pools, the engine's timing)
                ask(url, STORY, 32)
            rows: dict[str, dict[str, list[float]]] = {"direct": {}, "front": {}}
            for r in range(args.rounds):
                order = [("direct", up_url), ("front", front_url)]
                for name, url in order if r % 2 == 0 else order[::-1]:
                    lat, ttft = short(url, args.short)
                    row = rows[name]
                    row.setdefault("short", []).append(lat)
                    row.setdefault("ttft", []).append(ttft)
                    row.setdefault("burst", []).append(burst(url, args.burst))
                    row.setdefault("decode", []).append(ask(url, STORY, args.tokens).decode_rate())
        finally:
            for p in procs:
                p.terminate()
                p.wait(timeout=30)
    med = {name: {k: statistics.median(v) for k, v in row.items()} for name, row in rows.items()}
    d, f = med["direct"], med["front"]
    print(f"{'':8}{'short median ms':>17}{'short ttft ms':>15}{'burst s':>9}{'decode tok/s':>14}")
    for name, m in med.items():
        print(f"{name:8}{m['short']:>17.1f}{m['ttft']:>15.1f}{m['burst']:>9.2f}{m['decode']:>14.1f}")
    ratios = {
        "short median latency": (f["short"] / d["short"], 1.15, False),
        "burst wall time": (f["burst"] / d["burst"], 1.15, False),
        "decode rate": (f["decode"] / d["decode"], 0.95, True),
    }
    ok = True
    for what, (ratio, target, at_least) in ratios.items():
        passed = ratio >= target if at_least else ratio <= target
        ok = ok and passed
        sign = ">=" if at_least else "<="
        print(f"front / direct, {what}: {ratio:.2f} ({sign} {target}): {'PASS' if passed else 'FAIL'}")
    print(f"(medians of {args.rounds} rounds; short adds {f['short'] - d['short']:.1f} ms a request)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
