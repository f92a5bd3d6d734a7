"""Load and fault bench: many mixed-dialect clients at once against one
``turbospark serve`` on loopback (issue 16 point 8).

N concurrent clients (default 64) each loop until the time or request budget
is spent: a random dialect (OpenAI chat, Completions, Responses, Anthropic,
Ollama), streamed or not, a random session key (``x-session-id``), and about
10 % given up mid-way (a stream closed after its first bytes, a non-stream
abandoned after a moment). Every response is checked in its dialect's terms
(status, JSON, every stream frame parses, a stream ends with its dialect's
end). Afterwards the server is stopped with SIGTERM and its event log is
checked:

- every ``requestStarted`` has exactly one ``requestFinished``, last;
- each answered request's usage equals its ``generated`` ``newTokens``;
- no ``generated`` for a request that failed (a status >= 400).

Prints sent / ok / failed by status / cancelled, malformed responses, p50 and
p95 latency, the server's RSS every 10 s, and the targets: 0 lost, 0
malformed, RSS growth after warm-up < 5 %.

    python bench/load.py [--clients 64] [--seconds 60] [--max-requests 5000] [--model smollm2-135m]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import signal
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from runtime import Servers

SYSTEM = "You are a terse assistant. Answer in one short sentence."
QUESTIONS = [
    "What is the capital of France?",
    "Name a prime number.",
    "What colour is the sky?",
    "Say hello.",
    "What is 2 + 2?",
    "Name a fruit.",
]
DIALECTS = ("chat", "completions", "responses", "anthropic", "ollama")


@dataclass
class Outcome:
    dialect: str
    stream: bool
    status: int = 0
    rid: int | None = None
    seconds: float = 0.0
    cancelled: bool = False
    malformed: str = ""
    usage: int | None = None  # completion tokens the response reported


@dataclass
class Tally:
    outcomes: list[Outcome] = field(default_factory=list)

    def add(self, o: Outcome) -> None:
        self.outcomes.append(o)


def request_for(dialect: str, stream: bool, max_tokens: int) -> tuple[str, dict[str, Any]]:
    q = random.choice(QUESTIONS)
    if dialect == "chat":
        body = {
            "model": "m",
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
            "max_tokens": max_tokens,
            "stream": stream,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        return "/v1/chat/completions", body
    if dialect == "completions":
        body = {"model": "m", "prompt": f"{SYSTEM}\nQ: {q}\nA:", "max_tokens": max_tokens, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        return "/v1/completions", body
    if dialect == "responses":
        return "/v1/responses", {
            "model": "m",
            "instructions": SYSTEM,
            "input": q,
            "max_output_tokens": max_tokens,
            "stream": stream,
        }
    if dialect == "anthropic":
        return "/v1/messages", {
            "model": "m",
            "system": SYSTEM,
            "messages": [{"role": "user", "content": q}],
            "max_tokens": max_tokens,
            "stream": stream,
        }
    return "/api/chat", {
        "model": "m",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
        "stream": stream,
        "options": {"num_predict": max_tokens},
    }


def usage_of(dialect: str, body: dict[str, Any]) -> int | None:
    if dialect in ("chat", "completions"):
        return (body.get("usage") or {}).get("completion_tokens")
    if dialect == "responses":
        return (body.get("usage") or {}).get("output_tokens")
    if dialect == "anthropic":
        return (body.get("usage") or {}).get("output_tokens")
    return body.get("eval_count")


def check_body(dialect: str, body: Any) -> str:
    if not isinstance(body, dict):
        return "not a JSON object"
    need = {
        "chat": "choices",
        "completions": "choices",
        "responses": "output",
        "anthropic": "content",
        "ollama": "message",
    }[dialect]
    return "" if need in body else f"no {need!r} in the body"


def parse_stream(dialect: str, text: str) -> tuple[str, int | None]:
    """(problem or "", usage) of a whole streamed body."""
    usage = None
    if dialect == "ollama":
        lines = [line for line in text.split("\n") if line.strip()]
        try:
            objs = [json.loads(line) for line in lines]
        except ValueError:
            return "a line is not JSON", None
        if not objs or not objs[-1].get("done"):
            return "no final done line", None
        return "", objs[-1].get("eval_count")
    ended = False
    for frame in text.split("\n\n"):
        data = [line[5:].strip() for line in frame.split("\n") if line.startswith("data:")]
        if not data:
            continue
        payload = "\n".join(data)
        if payload == "[DONE]":
            ended = True
            continue
        try:
            obj = json.loads(payload)
        except ValueError:
            return "a frame is not JSON", None
        kind = obj.get("type", "")
        if dialect == "anthropic":
            if kind == "message_delta":
                usage = (obj.get("usage") or {}).get("output_tokens", usage)
            ended = ended or kind == "message_stop"
        elif dialect == "responses":
            if kind in ("response.completed", "response.incomplete"):
                ended = True
                usage = ((obj.get("response") or {}).get("usage") or {}).get("output_tokens")
        elif obj.get("usage"):
            usage = obj["usage"].get("completion_tokens")
    return ("" if ended else "no end of stream"), usage


async def one(client: httpx.AsyncClient, url: str, tally: Tally, max_tokens: int, cancel_share: float) -> None:
    dialect = random.choice(DIALECTS)
    stream = random.random() < 0.5
    cancel = random.random() < cancel_share
    path, body = request_for(dialect, stream, max_tokens)
    headers = {"x-session-id": f"s{random.randrange(16)}"}
    o = Outcome(dialect, stream)
    t0 = time.perf_counter()
    try:
        if stream:
            async with client.stream("POST", url + path, json=body, headers=headers) as r:
                o.status = r.status_code
                o.rid = int(r.headers.get("x-request-id", 0)) or None
                text = ""
                async for chunk in r.aiter_text():
                    text += chunk
                    if cancel:
                        o.cancelled = True
                        break
                if r.status_code == 200 and not o.cancelled:
                    o.malformed, o.usage = parse_stream(dialect, text)
        else:
            call = client.post(url + path, json=body, headers=headers)
            if cancel:
                try:
                    r = await asyncio.wait_for(call, 0.3)
                except TimeoutError:
                    o.cancelled = True
                    tally.add(o)
                    return
            else:
                r = await call
            o.status = r.status_code
            o.rid = int(r.headers.get("x-request-id", 0)) or None
            if r.status_code == 200:
                try:
                    data = r.json()
                except ValueError:
                    o.malformed = "the body is not JSON"
                else:
                    o.malformed = check_body(dialect, data)
                    o.usage = usage_of(dialect, data)
    except httpx.HTTPError as exc:
        o.malformed = f"transport error: {type(exc).__name__}"
    o.seconds = time.perf_counter() - t0
    tally.add(o)


async def drive(url: str, clients: int, seconds: float, max_requests: int, max_tokens: int) -> Tally:
    tally = Tally()
    deadline = time.monotonic() + seconds
    budget = [max_requests]
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def worker() -> None:
            while time.monotonic() < deadline and budget[0] > 0:
                budget[0] -= 1
                await one(client, url, tally, max_tokens, 0.1)

        await asyncio.gather(*(worker() for _ in range(clients)))
    return tally


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def check_log(path: str, tally: Tally) -> dict[str, int]:
    events = [json.loads(line) for line in open(path) if line.strip()]
    by_id: dict[int, list[dict[str, Any]]] = collections.defaultdict(list)
    for e in events:
        if "id" in e:
            by_id[e["id"]].append(e)
    lost = sum(
        1
        for evs in by_id.values()
        if [e["kind"] for e in evs].count("requestFinished") != 1 or evs[-1]["kind"] != "requestFinished"
    )
    usage_mismatch = failed_with_generated = 0
    for o in tally.outcomes:
        if o.rid is None:
            continue
        generated = [e for e in by_id.get(o.rid, []) if e["kind"] == "generated"]
        if o.status >= 400 and generated:
            failed_with_generated += 1
        if o.status == 200 and o.usage is not None and not o.cancelled:
            if sum(e["newTokens"] for e in generated) != o.usage:
                usage_mismatch += 1
    return {
        "requests in the log": len(by_id),
        "lost (started without one finished, last)": lost,
        "usage != newTokens": usage_mismatch,
        "generated for a failed request": failed_with_generated,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--max-requests", type=int, default=5000)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--warm-up", type=float, default=20, help="seconds before the RSS baseline")
    ap.add_argument("--serve-arg", action="append", default=[], help="an extra turbospark serve argument")
    args = ap.parse_args()
    if args.clients < 1 or args.seconds <= 0 or args.max_requests < 1:
        raise SystemExit("clients, seconds and max-requests must be positive")
    from turbospark.models.catalog import resolve_model

    log = os.path.join(tempfile.mkdtemp(prefix="turbospark-load-"), "events.jsonl")
    gguf, _ = resolve_model(args.model)
    # bench/runtime.py's launcher: loopback only, started and waited for
    proc, url = Servers(gguf, os.cpu_count() or 2, 2048, args.parallel).turbospark("--event-log", log, *args.serve_arg)
    samples: list[tuple[float, float]] = []
    try:
        t0 = time.monotonic()

        async def run() -> Tally:
            async def sampler() -> None:
                while True:
                    samples.append((time.monotonic() - t0, rss_mib(proc.pid)))
                    print(f"  t={samples[-1][0]:5.0f}s  RSS {samples[-1][1]:7.1f} MiB", flush=True)
                    await asyncio.sleep(10)

            task = asyncio.ensure_future(sampler())
            try:
                return await drive(url, args.clients, args.seconds, args.max_requests, args.max_tokens)
            finally:
                task.cancel()

        tally = asyncio.run(run())
        samples.append((time.monotonic() - t0, rss_mib(proc.pid)))
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)
    report(tally, samples, args.warm_up, check_log(log, tally), code)


def report(tally: Tally, samples: list[tuple[float, float]], warm_up: float, log: dict[str, int], code: int) -> None:
    outs = tally.outcomes
    answered = [o for o in outs if not o.cancelled]
    statuses = collections.Counter(o.status for o in answered)
    malformed = [o for o in answered if o.malformed]
    latencies = sorted(o.seconds for o in answered if o.status == 200 and not o.malformed)
    print(f"\nsent {len(outs)}  ok {statuses.get(200, 0)}  cancelled {len(outs) - len(answered)}")
    print("by status: " + ", ".join(f"{s}: {n}" for s, n in sorted(statuses.items())))
    by_dialect = collections.Counter((o.dialect, o.stream) for o in outs)
    print("mix: " + ", ".join(f"{d}{' stream' if s else ''} {n}" for (d, s), n in sorted(by_dialect.items())))
    print(
        f"malformed {len(malformed)}"
        + (f" (e.g. {malformed[0].dialect}: {malformed[0].malformed})" if malformed else "")
    )
    if latencies:
        p95 = latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))]
        print(f"latency p50 {statistics.median(latencies):.2f} s  p95 {p95:.2f} s")
    for k, v in log.items():
        print(f"{k}: {v}")
    base = next((rss for t, rss in samples if t >= warm_up), samples[0][1] if samples else 0.0)
    end = samples[-1][1] if samples else 0.0
    growth = (end - base) / base if base else 0.0
    print(f"RSS after warm-up {base:.1f} MiB, at the end {end:.1f} MiB: growth {growth * 100:+.1f} %")
    print(f"server exit status {code}")
    lost = log["lost (started without one finished, last)"] + statuses.get(0, 0)
    print("\ntargets:")
    print(f"  0 lost              {'met' if lost == 0 else 'MISSED'} ({lost})")
    print(f"  0 malformed         {'met' if not malformed else 'MISSED'} ({len(malformed)})")
    print(f"  RSS growth < 5 %    {'met' if growth < 0.05 else 'MISSED'} ({growth * 100:+.1f} %)")
    broken = log["usage != newTokens"] + log["generated for a failed request"]
    print(f"  log invariants      {'met' if not broken else 'MISSED'} ({broken})")
    print(f"  exit status 0       {'met' if code == 0 else 'MISSED'}")


if __name__ == "__main__":
    main()
