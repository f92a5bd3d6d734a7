"""Rerank, side by side with llama-server ``--reranking`` (issue 45, item 7):

  1. pairs per second for 1 query x 64 documents (one ``/v1/rerank``
     request, timed at the client): turbospark / llama-server, target >= 1.0;
  2. the largest difference between the two servers' scores for the same
     pairs (the same engine, the same flash-attention setting: only its own
     batching noise), target <= 5e-3.

Both servers get the same GGUF, threads and flash-attention setting and run
alternately within each round; the rate is the median over rounds of each
round's median request. llama-server gets ``--parallel`` slots (each slot
one pair at a time; ``-c`` is the reranker's context per slot) and its
default micro-batch (512).

No reranker can be downloaded here, so one is generated (``tests/reranker.py``)
with random weights at a real cross-encoder's size: ``base`` (MiniLM-L12's
shape: 12 layers of 384, a 512-token context, f16, as ms-marco-MiniLM-L-12-v2)
by default, or ``tiny`` (the tests' one). Random weights change no timing:
the same matrices are multiplied. Documents are drawn from its vocabulary's
words with a fixed seed, 20 to 120 words each.

    python bench/rerank.py [--rounds 3] [--reranker base|tiny] [--docs 64] [--parallel 8]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, ROOT)

from runtime import Servers  # noqa: E402

from tests.reranker import BASE, TINY, WORDS, write_reranker  # noqa: E402


def documents(n: int, seed: int = 0) -> tuple[str, list[str]]:
    rng = random.Random(seed)
    query = " ".join(rng.choice(WORDS) for _ in range(8))
    return query, [" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 120))) for _ in range(n)]


def rerank(url: str, query: str, docs: list[str]) -> tuple[float, list[float]]:
    """Seconds for one request, and each document's score in order."""
    t0 = time.perf_counter()
    r = httpx.post(url + "/v1/rerank", json={"query": query, "documents": docs, "top_n": len(docs)}, timeout=600)
    took = time.perf_counter() - t0
    r.raise_for_status()
    scores = [0.0] * len(docs)
    for item in r.json()["results"]:
        scores[item["index"]] = float(item["relevance_score"])
    return took, scores


def measure(url: str, query: str, docs: list[str], repeats: int) -> tuple[float, list[float]]:
    """The median request's seconds (after one warm-up) and the scores."""
    rerank(url, query, docs)
    runs = [rerank(url, query, docs) for _ in range(repeats)]
    return statistics.median(t for t, _ in runs), runs[-1][1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reranker", choices=("base", "tiny"), default="base")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3, help="timed requests per server and round")
    ap.add_argument("--docs", type=int, default=64)
    ap.add_argument("--parallel", type=int, default=8, help="llama-server's slots")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto")
    args = ap.parse_args()
    shape = BASE if args.reranker == "base" else TINY
    query, docs = documents(args.docs)
    with tempfile.TemporaryDirectory() as tmp:
        gguf = str(write_reranker(Path(tmp) / "reranker.gguf", shape=shape))
        sv = Servers(gguf, args.threads, shape.context, args.parallel)
        seconds: dict[str, list[float]] = {"turbospark": [], "llama-server": []}
        scores: dict[str, list[float]] = {}
        for r in range(args.rounds):
            for who in ("turbospark", "llama-server")[:: 1 if r % 2 == 0 else -1]:
                if who == "turbospark":
                    proc, url = sv.turbospark("--flash-attn", args.flash_attn)
                else:
                    proc, url = sv.peer("--reranking", "-fa", args.flash_attn, "-ub", "512", "-b", "512")
                try:
                    took, scores[who] = measure(url, query, docs, args.repeats)
                    seconds[who].append(took)
                finally:
                    proc.terminate()
                    proc.wait()
    rate = {who: len(docs) / statistics.median(ts) for who, ts in seconds.items()}
    diff = max(abs(a - b) for a, b in zip(scores["turbospark"], scores["llama-server"]))
    print(
        f"{args.reranker} reranker ({shape.layers} layers x {shape.hidden}, {shape.dtype}, context {shape.context}), "
        f"1 query x {len(docs)} documents, {args.threads} threads, flash attention {args.flash_attn}, "
        f"{args.rounds} rounds, medians"
    )
    print(f"  pairs/s   turbospark {rate['turbospark']:8.1f}   llama-server {rate['llama-server']:8.1f}")
    print(f"  turbospark / llama-server = {rate['turbospark'] / rate['llama-server']:.2f}   (target >= 1.0)")
    print(f"  largest score difference = {diff:.2e}   (target <= 5e-3)")


if __name__ == "__main__":
    main()
