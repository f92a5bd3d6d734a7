"""Agent-load benchmarks (issue 13 point 6), side by side with llama.cpp's
``llama-server`` in one run: same GGUF, threads, per-request context and
parallel slots, neither given session keys (both match prompts by tokens).
Every time is client-side: request sent -> first streamed content chunk (TTFT).

  a. agent sessions: a shared ~3k-token system prompt (instructions and a tool
     list), 4 conversations x 6 turns interleaved, 2 new conversations opened
     after the third round; median and p95 TTFT, turbospark / llama-server
                                                   (<= 0.5 median, <= 0.7 p95)
  b. a new conversation sharing that system prompt: its TTFT / the cold first
     conversation's TTFT, and the first conversation's next turn / cold
                                                   (<= 0.03 every round; warm)
  c. 16 conversations (a distinct ~1k-token document each) over 4 slots: the
     returning turn's median TTFT / the cold first turn's    (<= 0.2)
  d. a neighbour's decode tok/s beside a long drafting stream, speculation
     on / off (turbospark only)                    (>= 0.9)
  e. prefill tok/s of one 512 / 4k / 16k-token prompt (the longest capped
     at the model's training context, which llama-server enforces: 7680 for
     SmolLM2), turbospark / llama-server          (>= 0.95 at every length)

Who goes first alternates by round; figures are medians over rounds, and the
spread (min..max of the per-round ratios) is printed beside them.

    python bench/agents.py [--model smollm2-135m] [--rounds 2] [--only a,b,c,d,e]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import httpx
from runtime import EDIT_TEXT, STORY, Servers
from streams import stream_chat

SLOTS = 4
T = TypeVar("T")
TURN_TOKENS = 24

WORDS = (
    "harbour ledger cargo anchor tide compass lantern rope keel mast sail storm gull pier crane "
    "barrel manifest customs pilot beacon reef current dock hull rudder chart signal bell tanker "
    "ferry dredge buoy quay berth tug bollard winch hatch deck bridge galley bilge stern bow"
).split()


def system_prompt(tools: int = 24) -> str:
    """An agent CLI's system prompt: rules, then a tool list (about 3k tokens
    for SmolLM2 / Qwen tokenizers at 24 tools)."""
    rng = random.Random(7)
    rules = "\n".join(
        f"- Rule {i}: when the user asks about {' '.join(rng.choices(WORDS, k=3))}, "
        f"check the {rng.choice(WORDS)} first and answer briefly."
        for i in range(40)
    )
    tools_text = "\n".join(
        f'{{"name": "tool_{i}_{rng.choice(WORDS)}", "description": "Inspect the {" ".join(rng.choices(WORDS, k=6))} '
        f'and report what changed.", "parameters": {{"type": "object", "properties": {{"path": {{"type": '
        f'"string", "description": "the {rng.choice(WORDS)} to read"}}, "limit": {{"type": "integer"}}}}, '
        f'"required": ["path"]}}}}'
        for i in range(tools)
    )
    head = "You are a coding agent working in a harbour-management repository."
    return f"{head}\n# Rules\n{rules}\n# Tools\n{tools_text}"


def document(i: int, words: int = 700) -> str:
    rng = random.Random(1000 + i)
    return f"Document {i}: " + " ".join(rng.choices(WORDS, k=words))


@dataclass
class Conversation:
    messages: list[dict[str, str]]
    ttfts: list[float] = field(default_factory=list)

    def turn(self, url: str, question: str, n: int = TURN_TOKENS) -> float:
        self.messages.append({"role": "user", "content": question})
        s = stream_chat(url, {"model": "m", "messages": self.messages, "max_tokens": n, "temperature": 0})
        self.messages.append({"role": "assistant", "content": s.text})
        self.ttfts.append(s.ttft)
        return s.ttft


def p95(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]


# ---------------------------------------------------------------- scenarios
def agent_sessions(url: str) -> list[float]:
    """(a): every TTFT of 4 conversations x 6 turns, interleaved, plus 2 new
    conversations from round 3 on (so 6 conversations share 4 slots)."""
    system = system_prompt()
    convs = [Conversation([{"role": "system", "content": system}]) for _ in range(4)]
    for r in range(6):
        if r == 3:
            convs += [Conversation([{"role": "system", "content": system}]) for _ in range(2)]
        for c, conv in enumerate(convs):
            conv.turn(url, f"Conversation {c}, step {r}: which tool reads the {WORDS[(c * 7 + r) % len(WORDS)]} log?")
    return [t for conv in convs for t in conv.ttfts]


def shared_system(url: str) -> tuple[float, float, float]:
    """(b): cold TTFT of a first conversation, a second conversation's first
    TTFT, then the first conversation's next turn."""
    system = system_prompt()
    first = Conversation([{"role": "system", "content": system}])
    cold = first.turn(url, "List the tools that touch the harbour ledger.")
    second = Conversation([{"role": "system", "content": system}])
    new = second.turn(url, "Which rule mentions the compass?")
    again = first.turn(url, "And which of them can write?")
    return cold, new, again


def many_conversations(url: str, n: int = 16) -> tuple[float, float]:
    """(c): median TTFT of 16 first turns (cold, each its own document) and of
    their second turns (after 12 other conversations went through 4 slots)."""
    convs = [Conversation([{"role": "user", "content": document(i) + "\nSummarise it."}]) for i in range(n)]
    cold = []
    for conv in convs:
        s = stream_chat(url, {"model": "m", "messages": conv.messages, "max_tokens": TURN_TOKENS, "temperature": 0})
        conv.messages.append({"role": "assistant", "content": s.text})
        cold.append(s.ttft)
    back = [conv.turn(url, "Which word appears most?") for conv in convs]
    return statistics.median(cold), statistics.median(back)


def neighbour_rate(url: str) -> float:
    """(d): decode tok/s of an ordinary stream started while a long,
    repetitive stream (prompt lookup drafts well on it) is decoding."""
    started = threading.Event()
    out: dict[str, float] = {}

    def drafter() -> None:
        body = {
            "model": "m",
            "messages": [
                {"role": "user", "content": "Repeat this code exactly, three times:\n\n" + EDIT_TEXT * 2},
            ],
            "max_tokens": 400,
            "temperature": 0,
            "ignore_eos": True,
        }
        with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}, timeout=600) as r:
            for line in r.iter_lines():
                if '"content"' in line:
                    started.set()

    t = threading.Thread(target=drafter)
    t.start()
    started.wait(300)
    time.sleep(1.0)
    s = stream_chat(
        url,
        {"model": "m", "messages": [{"role": "user", "content": STORY}], "max_tokens": 96, "temperature": 0},
    )
    out["rate"] = s.decode_rate()
    t.join()
    return out["rate"]


def prefill_rate(url: str, tokens: int, salt: int) -> float:
    """(e): prompt tokens / client wall time of a 1-token answer to a prompt
    no cache holds (the salt leads it)."""
    words = max(1, int(tokens * 0.78))
    rng = random.Random(salt)
    text = f"[{salt}] " + " ".join(rng.choices(WORDS, k=words))
    t0 = time.perf_counter()
    r = httpx.post(
        url + "/v1/completions",
        json={"model": "m", "prompt": text, "max_tokens": 1, "temperature": 0},
        timeout=1200,
    )
    wall = time.perf_counter() - t0
    r.raise_for_status()
    return r.json()["usage"]["prompt_tokens"] / wall


# ---------------------------------------------------------------- running
def order(i: int) -> tuple[str, str]:
    """Who goes first alternates by round (the first server of a round meets
    a different machine than the second: caches, clocks)."""
    return ("turbospark", "llama-server") if i % 2 == 0 else ("llama-server", "turbospark")


def per_server(sv: Servers, rounds: int, scenario: Callable[[str], T]) -> dict[str, list[T]]:
    """``scenario(url)`` on a fresh server of each kind per round, who goes
    first alternating; its results by server."""
    out: dict[str, list[T]] = {"turbospark": [], "llama-server": []}
    for i in range(rounds):
        for who in order(i):
            proc, url = serve(sv, who)
            try:
                out[who].append(scenario(url))
            finally:
                stop(proc)
    return out


def alternate(rounds: int, run: Callable[[str, int], float]) -> tuple[list[float], list[float]]:
    ours: list[float] = []
    theirs: list[float] = []
    for i in range(rounds):
        for who in order(i):
            (ours if who == "turbospark" else theirs).append(run(who, i))
    return ours, theirs


def serve(sv: Servers, who: str, *extra: str) -> tuple[subprocess.Popen, str]:
    if who == "turbospark":
        return sv.turbospark(*extra)
    return sv.peer()


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(60)


Row = tuple[str, float, str, str, str]


def ratio_row(label: str, a: list[float], b: list[float], target: str, what: str) -> Row:
    per_round = [x / y for x, y in zip(a, b, strict=True)]
    spread = f"{min(per_round):.2f}..{max(per_round):.2f}"
    return (label, statistics.median(a) / statistics.median(b), spread, target, what)


def bench(
    name: str, rounds: int, threads: int, only: set[str], lengths: tuple[int, ...] = (512, 4096, 16384)
) -> list[Row]:
    from turbospark.models.catalog import resolve_model

    gguf, _ = resolve_model(name)
    sv = Servers(gguf, threads, 8192, SLOTS)
    rows: list[Row] = []

    if "a" in only:
        runs = per_server(sv, rounds, agent_sessions)
        med = {who: [statistics.median(t) for t in runs[who]] for who in runs}
        tail = {who: [p95(t) for t in runs[who]] for who in runs}
        print(f"{name} a: median {med} p95 {tail}", flush=True)
        ts, ll = "turbospark", "llama-server"
        rows.append(ratio_row(f"{name}: (a) agent sessions TTFT median", med[ts], med[ll], "<= 0.5", "ts/ll"))
        rows.append(ratio_row(f"{name}: (a) agent sessions TTFT p95", tail[ts], tail[ll], "<= 0.7", "ts/ll"))

    if "b" in only:
        shared = per_server(sv, rounds, shared_system)
        print(f"{name} b (cold, new, first's next): {shared}", flush=True)
        for who in order(0):
            news = [new / cold for cold, new, _ in shared[who]]
            agains = [again / cold for cold, _, again in shared[who]]
            label = f"{name}: (b) new conversation / cold [{who}]"
            rows.append((label, statistics.median(news), _spread(news), "<= 0.03", ""))
            label = f"{name}: (b) first's next turn / cold [{who}]"
            rows.append((label, statistics.median(agains), _spread(agains), "warm", ""))

    if "c" in only:
        many = per_server(sv, rounds, many_conversations)
        print(f"{name} c (cold, returning): {many}", flush=True)
        for who in order(0):
            ratios = [back / cold for cold, back in many[who]]
            label = f"{name}: (c) 16 convs / 4 slots returning / cold [{who}]"
            rows.append((label, statistics.median(ratios), _spread(ratios), "<= 0.2", ""))

    if "d" in only:
        on, off = [], []
        for i in range(rounds):
            for spec in ("ngram", "off")[:: 1 if i % 2 == 0 else -1]:
                proc, url = sv.turbospark("--speculative", spec)
                try:
                    rate = neighbour_rate(url)
                finally:
                    stop(proc)
                (on if spec == "ngram" else off).append(rate)
                print(f"{name} d speculation {spec}: neighbour {rate:.1f} tok/s", flush=True)
        rows.append(ratio_row(f"{name}: (d) neighbour decode tok/s", on, off, ">= 0.9", "spec on/off"))

    if "e" in only:
        # llama-server refuses prompts past the model's training context
        # (SmolLM2: 8192), so the longest length is capped there
        from turbospark.engine.llama import LlamaModelFile

        train = LlamaModelFile(gguf).n_ctx_train
        sizes = sorted({min(n, train - 512) for n in lengths})
        long = Servers(gguf, threads, max(sizes) + 256, 1)
        for n in sizes:

            def run(who: str, i: int, n: int = n) -> float:
                proc, url = serve(long, who)
                try:
                    prefill_rate(url, 64, salt=10_000 + i)  # warm
                    return prefill_rate(url, n, salt=n + i)
                finally:
                    stop(proc)

            ours, theirs = alternate(rounds, run)
            print(f"{name} e {n}: turbospark {ours} llama-server {theirs} tok/s", flush=True)
            rows.append(ratio_row(f"{name}: (e) prefill tok/s at {n}", ours, theirs, ">= 0.95", "ts/ll"))
    return rows


def _spread(xs: list[float]) -> str:
    return f"{min(xs):.3f}..{max(xs):.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--only", default="a,b,c,d,e")
    ap.add_argument("--lengths", default="512,4096,16384", help="prompt lengths of (e)")
    args = ap.parse_args()
    only = set(args.only.split(","))
    rows: list[Row] = []
    for name in args.model or ["smollm2-135m"]:
        rows += bench(name, args.rounds, args.threads, only, tuple(int(n) for n in args.lengths.split(",")))
    print(f"\n{'measure':<58}{'value':>8}  {'spread':<13}{'target':<9}")
    for label, value, spread, target, what in rows:
        print(f"{label:<58}{value:>8.3f}  {spread:<13}{target:<9}{what}")


if __name__ == "__main__":
    main()
