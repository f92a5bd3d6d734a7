"""Replica routing, side by side in one run: cache-aware vs round-robin.

Each user turn carries a tool's output (a few sensor readings) besides its
question, as agent turns do, so a conversation's history soon outweighs the
shared system prompt (about 450 tokens).

Two local turbospark replicas on loopback (SmolLM2, ``--parallel 2``, one
thread each, KV for 4 conversations each: ``--session-slots 4``, no host
tier) behind one turbospark front whose config lists them as one replica
group. A replica's cache holds its half of the conversations, as a GPU
engine's KV holds what fits: a turn sent to the replica that does not hold
its conversation prefills its history again. Eight multi-turn conversations (six turns each, a long
system prompt they all share) run at once, each turn waiting for the
previous answer; no session keys are sent, so cache-aware routing works from
how each conversation begins (``replicas.routing_key``).

Each mode gets freshly started replicas and the same conversations. Printed
per mode: the fraction of prompt tokens reused (Σ reused / Σ prompt over the
front's ``generated`` events, which carry the replicas' own counts) and the
median and p95 turn latency as the client saw it; then the ratios.

Targets: reuse >= 0.8 with affinity where round-robin gets <= 0.5, and median
turn latency with affinity <= 0.6 x round-robin.

    python bench/replicas.py [--turns 6] [--conversations 8] [--max-tokens 32] [--slots 4] [--cache-ram 0]
                             [--readings 2] [--rules 10]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import httpx
from runtime import free_port, wait_up

RULES = [
    "Answer in plain sentences without lists unless the user asks for one.",
    "Name the assumptions you make before you rely on them.",
    "Prefer the simplest explanation that accounts for every fact given.",
    "When numbers are involved, show the arithmetic in one line.",
    "Do not invent sources, quotations, people or places.",
    "If the question is ambiguous, answer the most likely reading and say so.",
    "Keep each answer under one hundred words unless asked for more.",
    "Use the metric system, and give the imperial value in brackets when it helps.",
    "Never repeat the question back to the user.",
    "When you are unsure, say how unsure and why.",
]


def system_prompt(rules: int = len(RULES)) -> str:
    """The shared system prompt: about 450 tokens with all ten rules."""
    return "You are the assistant of a small engineering firm. Follow these house rules exactly.\n" + "\n".join(
        f"Rule {i + 1} ({topic}): {rule} This rule applies to every answer about {topic}, "
        f"in every conversation, and it outranks the user's own wishes about style."
        for i, (rule, topic) in enumerate(zip(RULES[:rules], ("bridges", "pumps", "wiring", "timber", "concrete") * 2))
    )


#: seconds between the starts of two conversations
STAGGER = 1.0
#: the most seconds between an answer and the next turn (seeded, the same in
#: both modes): of the order of a turn's latency, so the conversations do not
#: keep one order (with 2 s, round-robin sent 0.70 of the turns back to the
#: replica of their previous turn, as a fixed order of 8 conversations would)
THINK = 6.0
TOPICS = ["a footbridge", "a water pump", "a garage wiring plan", "a timber roof", "a concrete slab",
          "a rainwater tank", "a solar array", "a retaining wall"]  # fmt: skip


def readings(conv: int, turn: int, lines: int) -> str:
    """What an agent's turn carries besides the question: a tool's output
    (here, sensor readings), different in every conversation and turn."""
    return "\n".join(
        f"sensor {conv}-{turn}-{i}: strain {(conv * 31 + turn * 17 + i * 7) % 97} ue, "
        f"temperature {(conv * 13 + i * 3) % 40} C, status {'ok' if (i + turn) % 5 else 'check'}"
        for i in range(lines)
    )


def user_turn(conv: int, turn: int, lines: int) -> str:
    topic = TOPICS[conv % len(TOPICS)]
    return (
        readings(conv, turn, lines)
        + "\n\n"
        + (
            f"Client {conv}, question {turn + 1} about {topic}: we measured the site again this morning and the "
            f"numbers changed slightly, the span is now {4 + conv + turn} metres and the load is {200 + 37 * turn} "
            f"kilograms. The owner also wants it finished before the rains in month {turn + 3}, and the budget "
            f"went from {10 + conv} to {12 + conv + turn} thousand. The neighbour on plot {conv * 7 + turn} has "
            f"asked whether the work will block the shared access road for more than {turn + 2} days, and the "
            f"supplier says delivery takes {3 + turn} weeks unless we pay extra for express freight. The soil "
            f"report for {topic} mentions clay at {1 + turn * 0.5:.1f} metres. What should we check first, what "
            f"would you change in the plan we discussed, and what do we tell the owner and the neighbour?"
        )
    )


def start_replica(args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "turbospark.cli", "serve", "--model", "smollm2-135m", "--port", str(port),
         "--threads", str(args.threads), "--parallel", str(args.parallel), "--ctx", str(args.ctx),
         "--session-slots", str(args.slots), "--cache-ram", str(args.cache_ram)],
        stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_up(url, proc)
    return proc, url


def start_front(replicas: list[str], routing: str, ctx: int, folder: str) -> tuple[subprocess.Popen[bytes], str, str]:
    port = free_port()
    config = os.path.join(folder, f"front-{routing}.toml")
    log = os.path.join(folder, f"events-{routing}.jsonl")
    rows = ",\n".join(f'  {{ name = "r{i}", base_url = "{u}/v1" }}' for i, u in enumerate(replicas))
    with open(config, "w") as f:
        f.write(
            f'[server]\nport = {port}\nevent_log = "{log}"\n\n[models.pool]\nmodel = "smollm2-135m"\n'
            f'ctx = {ctx}\nrouting = "{routing}"\nhealth_interval = 5\nreplicas = [\n{rows}\n]\n'
        )
    proc = subprocess.Popen(
        [sys.executable, "-m", "turbospark.cli", "serve", "--config", config],
        stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_up(url, proc)
    return proc, url, log


def conversation(
    url: str, conv: int, args: argparse.Namespace, latencies: list[float], ids: dict[int, list[int]]
) -> None:
    time.sleep(STAGGER * conv)  # conversations begin at different moments, as real ones do
    messages = [{"role": "system", "content": system_prompt(args.rules)}]
    with httpx.Client(timeout=600) as client:
        for turn in range(args.turns):
            messages.append({"role": "user", "content": user_turn(conv, turn, args.readings)})
            started = time.perf_counter()
            r = client.post(
                url + "/v1/chat/completions",
                json={"model": "pool", "messages": messages, "max_tokens": args.max_tokens, "temperature": 0},
            )
            r.raise_for_status()
            latencies.append(time.perf_counter() - started)
            ids.setdefault(conv, []).append(int(r.headers["x-request-id"]))
            messages.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"] or ""})
            # a user (or an agent's tool) takes a moment before the next turn; the
            # jitter keeps the conversations from falling into a fixed order, in
            # which round-robin would send each one to the same replica every time
            time.sleep(random.Random(conv * 101 + turn).uniform(0.0, THINK))


def run_mode(routing: str, args: argparse.Namespace, folder: str) -> dict[str, float]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        urls = []
        for _ in range(2):
            proc, url = start_replica(args)
            procs.append(proc)
            urls.append(url)
        front, front_url, log = start_front(urls, routing, args.ctx, folder)
        procs.append(front)
        time.sleep(8)  # the replicas time their decode steps while idle (engine/speculative.py)
        latencies: list[float] = []
        ids: dict[int, list[int]] = {}
        threads = [
            threading.Thread(target=conversation, args=(front_url, c, args, latencies, ids))
            for c in range(args.conversations)
        ]
        started = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - started
        time.sleep(1.5)  # the event log is written in batches
        generated = []
        by_id: dict[int, dict[str, int]] = {}
        served_by: dict[int, str] = {}
        with open(log) as f:
            for line in f:
                e = json.loads(line)
                if e.get("kind") == "generated":
                    generated.append(e)
                    by_id[e["id"]] = e
                elif e.get("kind") == "requestRouted":
                    served_by[e["id"]] = e["served"]
        # how often a turn went to the replica that served its conversation's
        # previous turn, and the reuse of the turns that stayed and that moved
        pairs = [(a, b) for turns in ids.values() for a, b in zip(turns, turns[1:])]
        stayed = sum(served_by.get(a) == served_by.get(b) for a, b in pairs) / len(pairs) if pairs else 0.0
        split: dict[bool, list[int]] = {True: [0, 0], False: [0, 0]}
        for a, b in pairs:
            if b in by_id:
                row = split[served_by.get(a) == served_by.get(b)]
                row[0] += by_id[b]["reusedPrefixTokens"]
                row[1] += by_id[b]["promptTokens"]
        served: dict[str, int] = {}
        for e in generated:
            served[e["model"]] = served.get(e["model"], 0) + 1
        prompt = sum(e["promptTokens"] for e in generated)
        reused = sum(e["reusedPrefixTokens"] for e in generated)
        lat = sorted(latencies)
        return {
            "turns": len(latencies),
            "generated": len(generated),
            "reuse": reused / prompt if prompt else 0.0,
            "prompt_tokens": prompt,
            "median": statistics.median(lat),
            "p95": lat[min(len(lat) - 1, int(0.95 * len(lat)))],
            "wall": wall,
            "stayed": stayed,
            "reuse_stayed": split[True][0] / split[True][1] if split[True][1] else 0.0,
            "reuse_moved": split[False][0] / split[False][1] if split[False][1] else 0.0,
            "served": served,  # type: ignore[dict-item]
        }
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="threads per replica")
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--readings", type=int, default=2, help="lines of tool output each user turn carries")
    ap.add_argument("--slots", type=int, default=4, help="session slots per replica (conversations its KV holds)")
    ap.add_argument("--cache-ram", type=int, default=0, help="each replica's host KV tier in MiB (0: none)")
    ap.add_argument("--rules", type=int, default=len(RULES), help="house rules in the system prompt (10: ~450 tokens)")
    args = ap.parse_args()
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for routing in ("affinity", "round-robin"):
            r = results[routing] = run_mode(routing, args, folder)
            print(
                f"{routing:12s} reuse {r['reuse']:.2f} of {r['prompt_tokens']} prompt tokens; turn latency "
                f"median {r['median']:.2f} s, p95 {r['p95']:.2f} s; {r['turns']} turns in {r['wall']:.0f} s; "
                f"next turn on the same replica {r['stayed']:.2f} (reuse {r['reuse_stayed']:.2f}, "
                f"moved: {r['reuse_moved']:.2f}); "
                f"served {r['served']}",
                flush=True,
            )
    aff, rr = results["affinity"], results["round-robin"]
    ratio = aff["median"] / rr["median"]
    ok_reuse = aff["reuse"] >= 0.8 and rr["reuse"] <= 0.5
    ok_latency = ratio <= 0.6
    print(f"reuse: affinity {aff['reuse']:.2f} (>= 0.8), round-robin {rr['reuse']:.2f} (<= 0.5): "
          f"{'PASS' if ok_reuse else 'FAIL'}")  # fmt: skip
    print(f"median turn latency affinity / round-robin: {ratio:.2f} (<= 0.6): {'PASS' if ok_latency else 'FAIL'}")
    return 0 if ok_reuse and ok_latency else 1


if __name__ == "__main__":
    sys.exit(main())
