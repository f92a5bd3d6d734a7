"""Prefill tuning by measurement (issue 13 point 5): prefill tok/s of one
long prompt through the real scheduler for each combination of batch size
(n_batch = n_ubatch), prefill chunk (tokens of one prompt per step) and flash
attention, on this machine. Configurations run alternately within a round, and
each figure is the median over rounds. The defaults in ``ModelOptions`` come
from this table (README, "Prefill tuning").

    python bench/prefill.py [--model smollm2-135m] [--tokens 4096] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))

from turbospark.engine.model import LlamaChatModel, ModelOptions  # noqa: E402
from turbospark.engine.types import CancelFlag, GenerationConfig  # noqa: E402
from turbospark.models.catalog import resolve_model  # noqa: E402

TEXT = (
    "The harbour master kept a ledger of every ship that entered the bay, its cargo, its crew, "
    "the weather on the day it arrived and the day it left, and any trouble it brought. "
)


def prompt(model: LlamaChatModel, n: int, salt: int) -> list[int]:
    """``n`` tokens that no earlier run has cached (the salt differs)."""
    ids = model.tokenize(f"[{salt}] " + TEXT * (n // 20 + 2))
    return ids[:n]


def prefill_rate(model: LlamaChatModel, ids: list[int]) -> float:
    cfg = GenerationConfig(max_new_tokens=1, temperature=0, speculative=False)
    t0 = time.perf_counter()
    res = asyncio.run(model.run_completion(ids, cfg, None, CancelFlag(), lambda p: None))
    wall = time.perf_counter() - t0
    return len(ids) / (res.prefill_seconds or wall)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--batches", default="256,512,1024,2048")
    ap.add_argument("--chunks", default="256,512,1024,2048")
    ap.add_argument("--flash", default="auto,off")
    args = ap.parse_args()
    gguf, _ = resolve_model(args.model)
    configs = [
        (b, c, fa)
        for b in map(int, args.batches.split(","))
        for c in map(int, args.chunks.split(","))
        for fa in args.flash.split(",")
        if c <= b
    ]
    rates: dict[tuple[int, int, str], list[float]] = {c: [] for c in configs}
    salt = 0
    for r in range(args.rounds):
        for cfg in configs if r % 2 == 0 else configs[::-1]:
            b, c, fa = cfg
            model = LlamaChatModel(
                ModelOptions(
                    path=gguf,
                    ctx=args.tokens + 64,
                    parallel=1,
                    threads=args.threads,
                    batch=b,
                    prefill_chunk=c,
                    flash_attn=fa,
                    speculative=False,
                    cache_ram=0,
                )
            )
            try:
                salt += 1
                prefill_rate(model, prompt(model, 64, salt))  # warm
                salt += 1
                rate = prefill_rate(model, prompt(model, args.tokens, salt))
            finally:
                model.close()
            rates[cfg].append(rate)
            print(f"batch {b:>5} chunk {c:>5} flash {fa:<4} {rate:8.1f} tok/s", flush=True)
    print(f"\n{args.model}, {args.tokens}-token prompt, {args.threads} threads, median of {args.rounds}")
    print(f"{'batch':>6}{'chunk':>7}  {'flash':<6}{'tok/s':>9}")
    best = max(statistics.median(v) for v in rates.values())
    for (b, c, fa), v in sorted(rates.items(), key=lambda kv: -statistics.median(kv[1])):
        m = statistics.median(v)
        print(f"{b:>6}{c:>7}  {fa:<6}{m:>9.1f}  {m / best:5.2f}")


if __name__ == "__main__":
    main()
